"""The corpus stage's driver memory a document: what a corpus of tens of millions of documents (seed 000's
whole PubMed, 20 GB, about 30M abstracts) asks of the machine that runs the job.

    python benchmarks/corpus_driver_memory.py                                  # this checkout's code
    python benchmarks/corpus_driver_memory.py --against-code <a worktree of an older commit>

Each measurement is a fresh child process with its own embedded 2-CPU Ray: it writes a source of N one-line
documents (12 words each; ``sentence_split`` off, so the read is quick), builds the corpus stage (conventional
mix, 1 MB shards) with ``orchestrator.corpus.stage.build_corpus`` and prints its own peak resident memory
(``ru_maxrss``) over what it held once Ray had started. That peak has a fixed part (the imports the build
does); the slope between ``--docs`` small and large is the memory a document costs the driver. With
``--against-code`` the same children run that directory's code too, one after the other, and the last line's
``ratio`` is its bytes a document over this checkout's. On Linux each child also reads its private (``RssAnon``)
and shared (``RssShmem``) resident memory when the plan is written, every document's record then held: the
peak's slope is both, the driver's own objects and the pages of Ray's object store it read the source's blocks
from (bounded by the store's size, not by the corpus); ``private_ratio`` compares the first. Last line: JSON.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import random, resource, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from orchestrator.core.config import from_dict
from orchestrator.core.runtime import ray_session
from orchestrator.corpus.stage import CorpusConfig, build_corpus
n, tmp = int(sys.argv[2]), Path(tempfile.mkdtemp())
rng = random.Random(0)
words = ["alpha", "beta", "gamma", "delta", "receptor", "binds", "cells", "mice"]
with open(tmp / "docs.txt", "w") as f:
    for _ in range(n):
        f.write(" ".join(rng.choice(words) for _ in range(12)) + ".\\n")
cfg = from_dict(CorpusConfig, {"sources": [{"name": "s", "paths": [str(tmp / "docs.txt")], "role": "large",
                                            "sentence_split": False}],
                               "mixer": {"name": "conventional", "shard_bytes": 1 << 20, "dupe_factor": 1}})
def status():  # Linux: the driver's private (anonymous) and shared (Ray's object store) resident memory
    try:
        return {l.split(":")[0]: int(l.split()[1]) for l in open("/proc/self/status")
                if l.startswith(("RssAnon", "RssShmem"))}
    except OSError:
        return {}
from orchestrator.corpus import stage
write_plan = stage.write_plan
def at_plan(*args, **kwargs):  # every document's record is held when the plan is written
    print("AT_PLAN_KB", " ".join(f"{k}={v - start.get(k, 0)}" for k, v in status().items()))
    return write_plan(*args, **kwargs)
stage.write_plan = at_plan
with ray_session(num_cpus=2, log_to_driver=False):
    base, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, status()
    build_corpus(cfg, tmp / "out")
    print("PEAK_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)
"""

#: (code, documents) -> the driver's private and shared resident memory (KB over Ray's start) at write_plan
AT_PLAN: dict[tuple[Path, int], dict[str, int]] = {}


def peak_mb(code: Path, n: int) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, str(code), str(n)], capture_output=True, text=True,
                         timeout=1800)
    line = next((x for x in out.stdout.splitlines() if x.startswith("PEAK_KB")), None)
    if out.returncode or line is None:
        sys.exit(f"the child failed ({code}, {n} documents):\n{out.stderr[-3000:]}")
    at_plan = next((x for x in out.stdout.splitlines() if x.startswith("AT_PLAN_KB")), "")
    AT_PLAN[(code, n)] = {k: int(v) for k, v in (kv.split("=") for kv in at_plan.split()[1:])}
    return int(line.split()[1]) / 1024


def split_slopes(code: Path, sizes: tuple[int, int]) -> dict[str, int]:
    """Where the slope goes, on Linux: the driver's private memory a document (its own objects: the plan's record
    of each document) and its shared memory a document (pages of Ray's object store it read blocks from,
    bounded by the store's size), both when the plan is written."""
    small, large = (AT_PLAN.get((code, n), {}) for n in sizes)
    slopes = {f"{k}_bytes_per_doc": round((large[k] - small[k]) * 1024 / (sizes[1] - sizes[0]))
              for k in ("RssAnon", "RssShmem") if k in small and k in large}
    if slopes:
        print(f"  at write_plan: private (RssAnon) {slopes.get('RssAnon_bytes_per_doc')} B a document, shared "
              f"(RssShmem, Ray's object store) {slopes.get('RssShmem_bytes_per_doc')} B", flush=True)
    return slopes


def bytes_per_document(name: str, code: Path, sizes: tuple[int, int], peak, over: str = "Ray's start") -> dict:
    """``peak(code, n)`` (MB) at the two corpus sizes, and its slope a document, printed; the JSON's entry.
    ``benchmarks/plan_load_memory.py`` measures the next stages' reading the same way."""
    small, large = sizes
    peaks = [peak(code, n) for n in sizes]
    per_doc = (peaks[1] - peaks[0]) * 2**20 / (large - small)
    print(f"{name} ({code}): peak over {over} {peaks[0]:.0f} MB at {small:,} documents, {peaks[1]:.0f} MB "
          f"at {large:,}: {per_doc:.0f} B a document", flush=True)
    return {"peak_mb": [round(p) for p in peaks], "bytes_per_doc": round(per_doc)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, nargs=2, default=[100_000, 900_000], help="the two corpus sizes")
    parser.add_argument("--against-code", type=Path, help="a checkout of other code to measure the same way")
    args = parser.parse_args()
    small, large = args.docs
    result: dict = {"docs": [small, large]}
    for name, code in (("this", ROOT), ("against", args.against_code)):
        if code is None:
            continue
        result[name] = bytes_per_document(name, code.resolve(), (small, large), peak_mb)
        result[name].update(split_slopes(code.resolve(), (small, large)))
    if "against" in result:
        result["ratio"] = round(result["against"]["bytes_per_doc"] / result["this"]["bytes_per_doc"], 2)
    if "RssAnon_bytes_per_doc" in result.get("against", {}) and "RssAnon_bytes_per_doc" in result["this"]:
        result["private_ratio"] = round(result["against"]["RssAnon_bytes_per_doc"]
                                        / result["this"]["RssAnon_bytes_per_doc"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
