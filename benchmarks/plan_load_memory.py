"""The memory a document costs the instance stage's driver when it reads the corpus stage's plan
(``shards.json`` lists every document: about 30M for seed 000's whole PubMed).

    python benchmarks/plan_load_memory.py                                  # this checkout's code
    python benchmarks/plan_load_memory.py --against-code <a worktree of an older commit>

For each size and code, one child process writes a corpus stage's ``shards.json`` and ``plan.json`` of N
documents (shards of 50,000; one unit of every whole shard and one of every shard's odd rows, as MDAPT
selects rows) with that code's own ``write_plan``; a fresh one then reads them as ``orchestrator.instances.stage``
does before its workers start (``load_plan``, with ``documents=False`` where the code has it, and the
manifest's per-source provenance, ``_provenance``) and prints its peak resident memory (``ru_maxrss``)
over what it held before reading. The slope between the two sizes is the bytes a document; with
``--against-code`` the last line's ``ratio`` is that code's bytes a document over this checkout's. The
instance counts of the provenance are checked equal between the two codes. Last line: JSON.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from corpus_driver_memory import bytes_per_document  # the sibling benchmark's two-size slope

ROOT = Path(__file__).resolve().parents[1]

WRITE = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from orchestrator.core.artifacts import MixPlan, Member, ShardInfo, Unit, write_plan
n, out, per_shard = int(sys.argv[2]), Path(sys.argv[3]), 50_000
shards = []
for i, start in enumerate(range(0, n, per_shard)):
    k = min(per_shard, n - start)
    shards.append(ShardInfo(path=f"shards/s/shard-{i:05d}.parquet", source="s" if i % 2 else "t", role="large",
                            language="en", n_bytes=100 * k, pages=tuple(f"pmid:{start + j}" for j in range(k)),
                            doc_sentences=tuple(1 + j % 9 for j in range(k)),
                            doc_bytes=tuple(80 + j % 50 for j in range(k))))
units = [Unit(0, tuple(Member(s.path) for s in shards), 1),
         Unit(1, tuple(Member(s.path, tuple(range(1, s.n_docs, 2))) for s in shards), 1)]
write_plan(out, shards, MixPlan(tuple(units), {}))
"""

READ = """
import inspect, json, resource, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from orchestrator.core.artifacts import load_plan
from orchestrator.instances.stage import _provenance
corpus = Path(sys.argv[3])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
light = "documents" in inspect.signature(load_plan).parameters
shards, plan = load_plan(corpus, documents=False) if light else load_plan(corpus)
total = {"tokens": 1, "by_source": {"s": {"instances": 1, "tokens": 1}}}
provenance = _provenance(plan, {s.path: s for s in shards}, total)
print("PEAK_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base, json.dumps(provenance, sort_keys=True))
"""


def peak_mb(code: Path, n: int) -> tuple[float, str]:
    with tempfile.TemporaryDirectory() as tmp:
        for child in (WRITE, READ):  # written by one process, read by a fresh one
            out = subprocess.run([sys.executable, "-c", child, str(code), str(n), tmp], capture_output=True,
                                 text=True, timeout=1800)
            if out.returncode:
                sys.exit(f"the child failed ({code}, {n} documents):\n{out.stderr[-3000:]}")
    line = next((x for x in out.stdout.splitlines() if x.startswith("PEAK_KB")), None)
    if line is None:
        sys.exit(f"the child printed no peak ({code}, {n} documents):\n{out.stdout[-3000:]}")
    _, kb, provenance = line.split(" ", 2)
    return int(kb) / 1024, provenance


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, nargs=2, default=[200_000, 2_000_000], help="the two corpus sizes")
    parser.add_argument("--against-code", type=Path, help="a checkout of other code to measure the same way")
    args = parser.parse_args()
    small, large = args.docs
    result: dict = {"docs": [small, large]}
    provenances = {}
    for name, code in (("this", ROOT), ("against", args.against_code)):
        if code is None:
            continue
        provenances[name] = []

        def peak(code: Path, n: int, seen: list = provenances[name]) -> float:
            mb, provenance = peak_mb(code, n)
            seen.append(provenance)
            return mb

        result[name] = bytes_per_document(name, code.resolve(), (small, large), peak, over="the start")
    if "against" in result:
        if provenances["this"] != provenances["against"]:
            sys.exit(f"the two codes' provenance differs: {provenances}")
        result["ratio"] = round(result["against"]["bytes_per_doc"] / result["this"]["bytes_per_doc"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
