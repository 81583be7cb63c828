"""A non-editable install runs the main job's dry run from another directory: search spaces,
presets, task YAMLs and the bundled sample data ship inside the wheel (issue 11, bug 5)."""
from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT, copy_checkout


def test_wheel_install_runs_the_default_dry_run_elsewhere(tmp_path):
    wheels, site, elsewhere = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip_env = {**os.environ, "PIP_NO_CACHE_DIR": "1"}  # no wheel a cache kept from an earlier build (issue 29)
    source = tmp_path / "source"  # built from a copy: a build leaves build/ and *.egg-info behind
    copy_checkout(source)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(source)], env=pip_env, capture_output=True, text=True,
                           timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("bioptorch_orchestrator-*.whl")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                              str(wheel)], env=pip_env, capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(site)  # ahead of the development checkout's editable install
    where = subprocess.run([sys.executable, "-c", "import orchestrator, search_spaces; "
                            "print(orchestrator.__file__); print(search_spaces.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60)
    assert all(line.startswith(str(site)) for line in where.stdout.split()), where.stdout + where.stderr
    res = subprocess.run([sys.executable, str(ROOT / "jobs" / "blue_sweep.py"), "--dry-run",
                          f"runs_root={tmp_path / 'runs'}"], cwd=elsewhere, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "search space tiny" in res.stdout and "nothing was trained" in res.stdout
    assert str(site) in res.stdout  # the sample corpus and tasks were read from the installed package


def test_setup_refuses_a_python_the_locks_do_not_fit_before_installing_anything(tmp_path):
    """cluster.yaml's image has Python 3.10, whose pip cannot install the locks (numpy, scipy and pandas need
    3.11): setup.sh failed half-way through the hash-checked install (a probe, session 43). It now stops first,
    naming the Python and what to install."""
    old = tmp_path / "python3.10"
    old.write_text("#!/bin/sh\necho 3.10\n")
    old.chmod(0o755)
    res = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], env={**os.environ, "PYTHON": str(old)},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and f"{old} is Python 3.10; this project needs Python 3.11" in res.stderr
    assert "PYTHON=python3.11 scripts/setup.sh" in res.stderr and "[setup] installing" not in res.stdout
