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
``ratio`` is its bytes a document over this checkout's. Last line: JSON.
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
with ray_session(num_cpus=2, log_to_driver=False):
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    build_corpus(cfg, tmp / "out")
    print("PEAK_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)
"""


def peak_mb(code: Path, n: int) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, str(code), str(n)], capture_output=True, text=True,
                         timeout=1800)
    line = next((x for x in out.stdout.splitlines() if x.startswith("PEAK_KB")), None)
    if out.returncode or line is None:
        sys.exit(f"the child failed ({code}, {n} documents):\n{out.stderr[-3000:]}")
    return int(line.split()[1]) / 1024


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
    if "against" in result:
        result["ratio"] = round(result["against"]["bytes_per_doc"] / result["this"]["bytes_per_doc"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
