"""transformers' names are resolved before stages run in threads (orchestrator/core/imports.py): the list
holds every name the package imports, and threads importing them afterwards do not fail."""
from __future__ import annotations

import ast
import json
import subprocess
import sys

from conftest import ROOT
from orchestrator.core.imports import TRANSFORMERS_NAMES


def test_the_list_holds_every_name_orchestrator_imports_from_transformers():
    imported = {alias.name: f"{path.relative_to(ROOT)}:{node.lineno}"
                for path in sorted((ROOT / "orchestrator").rglob("*.py"))
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.ImportFrom) and node.module == "transformers"
                for alias in node.names}
    assert imported, "no `from transformers import` found: the scan is broken"
    missing = {name: where for name, where in imported.items() if name not in TRANSFORMERS_NAMES}
    assert not missing, f"add to orchestrator.core.imports.TRANSFORMERS_NAMES: {missing}"


#: Two threads per name, released together, each importing its name as a stage does. Without the names
#: resolved first this fails in most runs (ImportError: cannot import name ... from 'transformers').
_THREADS = """
import json, sys, threading
from orchestrator.core.imports import TRANSFORMERS_NAMES, resolve_transformers_names
resolve_transformers_names()
names = list(TRANSFORMERS_NAMES) * 2
start, errors = threading.Barrier(len(names)), []
def stage(name):
    start.wait()
    try:
        exec(f"from transformers import {name}")
    except Exception as exc:
        errors.append(f"{name}: {type(exc).__name__}: {exc}")
threads = [threading.Thread(target=stage, args=(n,)) for n in names]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"threads": len(threads), "errors": errors}))
"""


def test_threads_import_every_name_once_they_are_resolved():
    res = subprocess.run([sys.executable, "-c", _THREADS], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out == {"threads": 2 * len(TRANSFORMERS_NAMES), "errors": []}
