"""Instance creation: the Ray Data pipeline vs the single-process reference port of BERT's script.

Both run on the same sentence-split documents (the PubMed sample, HoC's 1,580 abstracts and
WikiText-2 valid+test: ~5.8 MB of distinct real text; ``--copies`` repeats it) with the same
WordPiece vocabulary, max_seq_length, dupe factor and masking settings:

- reference: ``benchmarks/reference_create_pretraining_data.py`` exactly as the original runs --
  pure-Python FullTokenizer, one process, one RNG, then ids written to parquet;
- ours: ``orchestrator.instances.build.run_units`` over conventional shards (Rust tokenizer, Ray
  Data tasks, parquet shards written as units finish).

Measured: instance tokens written per second of wall time.

- ``speedup``: ours on 2 workers over the reference, on the distinct text (repeated text would
  flatter our word cache).
- ``scaling_1_to_2``: ours on 2 workers over ours on 1, on the input repeated
  ``--scaling-copies`` times (~17 MB, ~3 s a run on one worker), so Ray's fixed ~0.1 s to start
  and stop a dataset does not stand in for the pipeline's throughput.
- ``machine_scaling_1_to_2``: the same ratio for pure-Python CPU work in plain processes, taken
  in the same run: what this machine's 2 vCPUs give at all at that moment (a shared VM's vCPUs
  can give 1.2-2.0).

Each figure is the median over ``--repeats`` runs. Ray start-up is excluded: each timed run
follows an untimed run with the same worker count, so worker processes are started and have
imported our modules. Each run reads its own copy of the shards and vocabulary, so nothing
tokenized by an earlier run is reused (worker processes cache tokenized shards and words by
path: a real build's second length reuses them). The tokenizer is loaded inside the timed
region. Last line: JSON.

    python benchmarks/instances_vs_reference.py [--copies 1 --scaling-copies 3 --repeats 5]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
DEFAULT_INPUTS = (f"text:{DATA / 'pubmed_sample' / 'PubMedAbstract_1MB.txt'}",
                  *(f"hoc:{DATA / 'hoc' / name}" for name in ("train.tsv", "dev.tsv", "test.tsv")),
                  f"wikitext:{DATA / 'general_en' / 'wikitext2_tokenized' / 'valid.txt'}",
                  f"wikitext:{DATA / 'general_en' / 'wikitext2_tokenized' / 'test.txt'}")


def _reference_module():
    spec = importlib.util.spec_from_file_location("reference_create_pretraining_data",
                                                  ROOT / "benchmarks" / "reference_create_pretraining_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hoc_documents(path: str) -> list[list[str]]:
    """HoC in BLUE's format (``labels\tsentence\tindex``, one row per sentence, index
    ``<PMID>_s<n>``) as abstracts: the sentences of each PMID in order."""
    import csv

    docs: dict[str, list[str]] = {}
    with open(path, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            docs.setdefault(row["index"].rsplit("_s", 1)[0], []).append(row["sentence"].strip())
    return [[s for s in doc if s] for doc in docs.values()]


def read_documents(inputs: list[str]) -> list[list[str]]:
    """Sentence-split documents from ``FORMAT:PATH`` inputs: a source format of
    ``orchestrator.corpus.sources``, or ``hoc`` (BLUE's HoC files, already split into sentences)."""
    from orchestrator.corpus.sentences import split_sentences
    from orchestrator.corpus.sources import SourceConfig, iter_source

    docs = []
    for spec in inputs:
        fmt, path = spec.split(":", 1)
        if fmt == "hoc":
            docs += hoc_documents(path)
            continue
        src = SourceConfig(name="corpus", paths=(path,), format=fmt, role="small")
        docs += [split_sentences(d.text) for d in iter_source(src)]
    return docs


def write_shards(docs: list[list[str]], shard_bytes: int, dst: Path) -> list:
    """Documents cut into project shards (``ShardInfo``) of about ``shard_bytes`` under ``dst``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.core.artifacts import ShardInfo

    dst.mkdir(parents=True, exist_ok=True)
    shards, buf = [], []

    def flush():
        if not buf:
            return
        path = dst / f"shard-{len(shards):04d}.parquet"
        sizes = [len(" ".join(d).encode()) for d in buf]
        pq.write_table(pa.table({"source": ["corpus"] * len(buf), "sentences": buf}), path)
        shards.append(ShardInfo(str(path), "corpus", "small", "en", sum(sizes), tuple(map(str, range(len(buf)))),
                                tuple(len(d) for d in buf), tuple(sizes)))
        buf.clear()

    size = 0
    for doc in docs:
        buf.append(doc)
        size += len(" ".join(doc).encode())
        if size >= shard_bytes:
            flush()
            size = 0
    flush()
    return shards


def prepare(inputs: list[str], copies: int, shard_bytes: int, vocab_size: int, work: Path):
    """Documents -> BERT-format text file (the reference's input), project shards, vocabulary."""
    from orchestrator.vocab.wordpiece import VocabConfig, save_tokenizer, train_wordpiece

    docs = read_documents(inputs) * copies
    with open(work / "bert_input.txt", "w", encoding="utf-8") as f:
        for doc in docs:
            f.write("\n".join(doc) + "\n\n")
    shards = write_shards(docs, shard_bytes, work)
    tok = train_wordpiece((s for d in docs for s in d), VocabConfig(vocab_size=vocab_size))
    vocab_dir = work / "vocab"
    vocab_dir.mkdir()
    save_tokenizer(tok, vocab_dir)
    return shards, vocab_dir, docs


def run_reference(work: Path, vocab_dir: Path, args) -> dict:
    ref = _reference_module()
    start = time.perf_counter()
    tokenizer = ref.FullTokenizer(str(vocab_dir / "vocab.txt"))
    instances = ref.create_training_instances([str(work / "bert_input.txt")], tokenizer, args.max_seq_length,
                                              args.dupe_factor, 0.1, 0.15, args.max_predictions,
                                              random.Random(12345))
    ref.write_instances(instances, tokenizer, str(work / "reference.parquet"))
    wall = time.perf_counter() - start
    tokens = sum(len(x.tokens) for x in instances)
    return {"wall_s": round(wall, 2), "instances": len(instances), "tokens": tokens,
            "tokens_per_s": round(tokens / wall)}


def fresh_copy(shards, vocab_dir: Path, dst: Path):
    """The shards and vocabulary under new paths: worker processes cache tokenized shards and words
    by path (a real build's second length reuses them), and a second measured run must not."""
    import dataclasses
    import shutil

    dst.mkdir()
    shutil.copytree(vocab_dir, dst / "vocab")
    copies = []
    for shard in shards:
        path = dst / Path(shard.path).name
        shutil.copyfile(shard.path, path)
        copies.append(dataclasses.replace(shard, path=str(path)))
    return copies, dst / "vocab"


def run_ours(shards, vocab_dir: Path, work: Path, workers: int, args, name: str) -> dict:
    from orchestrator.corpus.mixing import MIXERS, MixerConfig
    from orchestrator.instances.config import InstanceConfig
    from orchestrator.instances.workers import run_units

    shards, vocab_dir = fresh_copy(shards, vocab_dir, work / f"input-{name}")
    plan = MIXERS.get("conventional")(shards, MixerConfig(name="conventional", dupe_factor=args.dupe_factor),
                                      random.Random(0))
    cfg = InstanceConfig(max_seq_lengths=(args.max_seq_length,), max_predictions_per_seq=args.max_predictions)
    out = work / f"ours-{name}"
    out.mkdir()
    start = time.perf_counter()
    total = run_units(plan.units, vocab_dir, out, cfg, args.max_seq_length, 12345, workers, args.cpus_per_worker)
    wall = time.perf_counter() - start
    return {"workers": workers, "units": len(plan.units), "wall_s": round(wall, 2), "instances": total["instances"],
            "tokens": total["tokens"], "tokens_per_s": round(total["tokens"] / wall)}


def _spin(n: int, start: Any, done: Any) -> None:
    """Pure-Python CPU work (no I/O, no shared state) once ``start`` is set; reports on ``done``."""
    start.wait()
    done.put(_spin_loop(n))


def _spin_wall(n: int, processes: int) -> float:
    """Wall time of ``n`` loop steps split over ``processes`` processes, process start-up excluded."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    start, done = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_spin, args=(n // processes, start, done)) for _ in range(processes)]
    for proc in procs:
        proc.start()
    time.sleep(0.5)  # every process is importing nothing more and waits on the event
    begin = time.perf_counter()
    start.set()
    for _ in procs:
        done.get()
    wall = time.perf_counter() - begin
    for proc in procs:
        proc.join()
    return wall


def machine_scaling(seconds: float, repeats: int) -> list[float]:
    """What this machine gives from 1 to 2 processes on pure-Python CPU work of about ``seconds``
    (the bound for any pipeline here: 2 vCPUs of a VM may share cores or be throttled)."""
    probe = 2_000_000
    begin = time.perf_counter()
    _spin_loop(probe)
    n = max(probe, int(probe * seconds / (time.perf_counter() - begin)))
    return [round(_spin_wall(n, 1) / _spin_wall(n, 2), 2) for _ in range(repeats)]


def _spin_loop(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def median(values: list, key: Any = None) -> Any:
    """The median element (the lower middle one for an even count)."""
    return sorted(values, key=key)[(len(values) - 1) // 2]


def median_run(runs: list[dict]) -> dict:
    """The run with the median throughput."""
    return median(runs, key=lambda r: r["tokens_per_s"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", default=list(DEFAULT_INPUTS),
                   help="FORMAT:PATH documents (text = one per line, wikitext, jsonl, parquet, hoc = BLUE's HoC "
                        "sentences grouped by abstract); default: the PubMed sample, HoC's abstracts and "
                        "WikiText-2 valid+test, ~5.8 MB of distinct real text")
    p.add_argument("--copies", type=int, default=1, help="repeat the input this many times (repeated text makes "
                                                          "tokenization caches look better than on a real corpus)")
    p.add_argument("--dupe-factor", type=int, default=5)
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--max-predictions", type=int, default=20)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--shard-bytes", type=int, default=250_000)
    p.add_argument("--cpus-per-worker", type=float, default=0.9)
    p.add_argument("--scaling-copies", type=int, default=3,
                   help="the 1 -> 2 worker comparison runs on the input repeated this many times (~17 MB by "
                        "default): long enough that Ray's fixed ~0.1 s per run start and stop is a small share")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per worker count (alternating); the "
                                                          "median is reported")
    args = p.parse_args(argv)
    if min(args.repeats, args.copies, args.scaling_copies) < 1:
        p.error("--repeats, --copies and --scaling-copies must be >= 1")
    missing = [spec for spec in args.input if ":" not in spec or not Path(spec.split(":", 1)[1]).is_file()]
    if missing:
        print(f"input not found (expected FORMAT:PATH to a file): {missing}", file=sys.stderr)
        return 2
    import ray

    from orchestrator.core.runtime import init_ray

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shards, vocab_dir, docs = prepare(args.input, args.copies, args.shard_bytes, args.vocab_size, work)
        scaling_shards = write_shards(docs * args.scaling_copies, args.shard_bytes, work / "scaling")
        print(f"input: {[Path(x).name for x in args.input]} x{args.copies}: {sum(map(len, docs))} sentences, "
              f"{len(shards)} shards; scaling input x{args.scaling_copies}: {len(scaling_shards)} shards")
        reference = run_reference(work, vocab_dir, args)
        print(f"reference (1 process): {reference}")
        machine = machine_scaling(min(3.0, max(0.5, reference["wall_s"] / 10 * args.scaling_copies)), args.repeats)
        print(f"machine, pure-Python work 1 -> 2 processes: {machine}")
        init_ray(num_cpus=2, log_to_driver=False)
        try:
            # Each timed run follows an untimed one with the same worker count (on its own copy
            # of the input): Ray start-up is not timed. A task's CPU request depends on the worker
            # count, and Ray does not reuse a worker process leased for another request shape,
            # so the first run after a switch starts processes (~1.5 s each on 2 cores); a build
            # keeps one worker count for all its lengths and pays that once. 1 and 2 workers
            # alternate, so drift on a shared machine hits both alike.
            fast, runs = [], {1: [], 2: []}
            for rep in range(args.repeats):
                run_ours(shards, vocab_dir, work, 2, args, f"warm-{rep}")
                fast.append(run_ours(shards, vocab_dir, work, 2, args, f"speed-{rep}"))
                print(f"ours, 2 workers, run {rep + 1}: {fast[-1]}")
                for workers in (1, 2):
                    run_ours(scaling_shards, vocab_dir, work, workers, args, f"warm-{workers}-{rep}")
                    runs[workers].append(run_ours(scaling_shards, vocab_dir, work, workers, args,
                                                  f"{workers}-{rep}"))
                    print(f"ours, scaling input, {workers} worker(s), run {rep + 1}: {runs[workers][-1]}")
        finally:
            ray.shutdown()
    two = median_run(fast)
    one_s, two_s = (median_run(runs[w]) for w in (1, 2))  # the ratio of the median throughputs
    result = {"speedup": round(two["tokens_per_s"] / reference["tokens_per_s"], 2),
              "scaling_1_to_2": round(two_s["tokens_per_s"] / one_s["tokens_per_s"], 2),
              "scaling_median_of_pairs": round(median([b["tokens_per_s"] / a["tokens_per_s"]
                                                       for a, b in zip(runs[1], runs[2])]), 2),
              "scaling_per_repeat": [round(b["tokens_per_s"] / a["tokens_per_s"], 2)
                                     for a, b in zip(runs[1], runs[2])],
              "machine_scaling_1_to_2": median(machine), "machine_scaling_per_repeat": machine,
              "scaling_input_mb": round(sum(s.n_bytes for s in scaling_shards) / 1e6, 1),
              "repeats": args.repeats,
              "reference_tokens_per_s": reference["tokens_per_s"], "ours_tokens_per_s": two["tokens_per_s"],
              "reference_instances": reference["instances"], "ours_instances": two["instances"]}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
