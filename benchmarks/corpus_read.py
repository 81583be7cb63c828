"""Seconds for the corpus stage to read and sentence-split one large source file: in one Ray task (how every
file was read until session 44) vs in spans of whole lines, one task each (``corpus.sources.READ_BLOCK_BYTES``),
same run, same embedded Ray.

    python benchmarks/corpus_read.py                      # 16 MB of PubMed abstracts, 2 CPUs, 8 MB spans
    python benchmarks/corpus_read.py --mb 64 --cpus 2 --block-mb 4

The file is the shared PubMed sample (one abstract a line) repeated to ``--mb`` megabytes (without
``../shared/data``: seeded synthetic sentences). Both ways write the source's shards with the stage's own
``_write_shards`` (Ray Data, order preserved), after a small warm-up read that starts Ray's workers, and the
two outputs are compared shard by shard: the same documents, ids and sentences, or exit 1. Last line: JSON
with ``speedup`` (one task's seconds / the spans' seconds).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PUBMED = ROOT.parent / "shared" / "data" / "pubmed_sample" / "PubMedAbstract_1MB.txt"


def _text(n_bytes: int) -> bytes:
    if PUBMED.is_file():
        base = PUBMED.read_bytes()
        base = base if base.endswith(b"\n") else base + b"\n"
    else:
        rng = random.Random(0)
        words = ["The", "receptor", "binds", "IL-6", "in", "mice", "(p < 0.05)", "Dr.", "Smith", "et", "al."]
        base = "".join(" ".join(" ".join(rng.choice(words) for _ in range(rng.randint(5, 20))) + "."
                                for _ in range(rng.randint(3, 9))) + "\n" for _ in range(2000)).encode()
    return (base * (n_bytes // len(base) + 1))[:n_bytes].rsplit(b"\n", 1)[0] + b"\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=16, help="size of the source file (MB)")
    parser.add_argument("--cpus", type=int, default=2, help="the embedded Ray's CPUs")
    parser.add_argument("--block-mb", type=float, default=None, help="span size (MB; default READ_BLOCK_BYTES)")
    args = parser.parse_args()
    import pyarrow.parquet as pq

    from orchestrator.core.runtime import ray_session
    from orchestrator.corpus.sources import READ_BLOCK_BYTES, SourceConfig, read_items
    from orchestrator.corpus.stage import _write_shards

    block = int(args.block_mb * (1 << 20)) if args.block_mb else READ_BLOCK_BYTES
    with tempfile.TemporaryDirectory() as tmp, ray_session(num_cpus=args.cpus, log_to_driver=False):
        work = Path(tmp)
        big = work / "big.txt"
        big.write_bytes(_text(int(args.mb * 1e6)))
        small = work / "small.txt"
        small.write_bytes(_text(200_000))
        _write_shards(SourceConfig(name="warm", paths=(str(small),)), work / "warm", 1 << 20, block_bytes=50_000)
        src = SourceConfig(name="pubmed", paths=(str(big),))
        size = big.stat().st_size
        seconds, shards, tasks = {}, {}, 0
        for way, block_bytes in (("one_task", size + 1), ("spans", block)):
            tasks = len(read_items(src, block_bytes))
            started = time.perf_counter()
            shards[way], _ = _write_shards(src, work / way, 1 << 20, block_bytes=block_bytes)
            seconds[way] = time.perf_counter() - started
            print(f"{way}: {tasks} read task(s), {seconds[way]:.1f} s, {size / 1e6 / seconds[way]:.2f} MB/s",
                  flush=True)
        same = len(shards["one_task"]) == len(shards["spans"]) and all(
            pq.read_table(a.path).to_pylist() == pq.read_table(b.path).to_pylist()
            for a, b in zip(shards["one_task"], shards["spans"]))
    print("the same shards" if same else "THE SHARDS DIFFER")
    print(json.dumps({"mb": round(size / 1e6, 1), "cpus": args.cpus, "block_mb": round(block / (1 << 20), 2),
                      "span_tasks": tasks, "one_task_s": round(seconds["one_task"], 1),
                      "spans_s": round(seconds["spans"], 1),
                      "speedup": round(seconds["one_task"] / seconds["spans"], 2), "same_shards": same}))
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
