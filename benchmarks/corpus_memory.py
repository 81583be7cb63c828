"""Peak memory of a whole corpus build when the input grows 10x (goal: rss_ratio < 1.5).

Builds the same SimPT + AmpV + instances configuration twice, each in a fresh child process
with its own embedded Ray: on ``--base-kb`` of PubMed abstracts (small) plus three times as
much WikiText (large), then on 10x that. The parent samples, every 0.1 s, the resident memory
of the child's whole process tree (driver, GCS, raylet, Ray workers) and of the driver alone.
Shared pages (Ray's object store) are counted once per process that maps them, so the tree
total over-states the true footprint; the ratio is what matters. The machine may be shared:
timings are noisy, memory much less so. Last line: JSON with ``rss_ratio``.

    python benchmarks/corpus_memory.py [--base-kb 100]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
PUBMED = DATA / "pubmed_sample" / "PubMedAbstract_1MB.txt"
WIKI = [DATA / "general_en" / "wikitext2_tokenized" / f"{s}.txt" for s in ("valid", "test")]

CHILD = """
import sys
from pathlib import Path
from orchestrator.core.config import from_dict
from orchestrator.workflows.build_corpus import CorpusBuildConfig, build_corpus
work = Path(sys.argv[1])
cfg = from_dict(CorpusBuildConfig, {
    "out_dir": str(work / "out"),
    "corpus": {"sources": [{"name": "pubmed", "paths": [str(work / "small.txt")], "role": "small"},
                           {"name": "wiki", "paths": [str(work / "large.txt")], "format": "wikitext",
                            "role": "large"}],
               "mixer": {"name": "simpt", "shard_bytes": 50000, "dupe_factor": 1}},
    "vocab": {"vocab_size": 4000},
    "instances": {"max_seq_lengths": [128], "workers": 2, "cpus_per_worker": 0.5},
    "ray": {"num_cpus": 2}})
result = build_corpus(cfg)
print("INSTANCES", result.counts["instances"][128]["instances"], result.counts["instances"][128]["tokens"])
"""


def _take(paths: list[Path], n_bytes: int) -> str:
    """The first n_bytes of the concatenated files, whole lines, cycling if needed."""
    out, size = [], 0
    while size < n_bytes:
        for path in paths:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    out.append(line)
                    size += len(line.encode())
                    if size >= n_bytes:
                        return "".join(out)
    return "".join(out)


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def measure(base_bytes: int, work: Path) -> dict:
    work.mkdir(parents=True)
    (work / "small.txt").write_text(_take([PUBMED], base_bytes), encoding="utf-8")
    (work / "large.txt").write_text(_take(WIKI, 3 * base_bytes), encoding="utf-8")
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(work)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    ps = psutil.Process(proc.pid)
    peak_tree = peak_driver = 0
    while proc.poll() is None:
        try:
            peak_driver = max(peak_driver, ps.memory_info().rss)
            peak_tree = max(peak_tree, _tree_rss(ps))
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    out = proc.stdout.read()
    if proc.returncode != 0:
        raise SystemExit(f"build failed (exit {proc.returncode}) at {base_bytes} bytes")
    instances, tokens = (int(x) for x in out.split("INSTANCES", 1)[1].split())
    return {"input_bytes": 4 * base_bytes, "wall_s": round(time.perf_counter() - start, 1),
            "peak_tree_mb": round(peak_tree / 2**20), "peak_driver_mb": round(peak_driver / 2**20),
            "instances": instances, "tokens": tokens}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-kb", type=int, default=100, help="small-corpus size of the 1x run, in KB")
    args = p.parse_args(argv)
    if not PUBMED.is_file() or not all(w.is_file() for w in WIKI):
        print(f"data not found under {DATA}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        one = measure(args.base_kb * 1000, Path(tmp) / "x1")
        print(f"1x:  {one}")
        ten = measure(args.base_kb * 10_000, Path(tmp) / "x10")
        print(f"10x: {ten}")
    print(json.dumps({"rss_ratio": round(ten["peak_tree_mb"] / one["peak_tree_mb"], 3),
                      "driver_rss_ratio": round(ten["peak_driver_mb"] / one["peak_driver_mb"], 3),
                      "peak_tree_mb": [one["peak_tree_mb"], ten["peak_tree_mb"]],
                      "input_bytes": [one["input_bytes"], ten["input_bytes"]],
                      "tokens": [one["tokens"], ten["tokens"]]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
