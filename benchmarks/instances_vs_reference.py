"""Instance creation: the Ray Data pipeline vs the single-process reference port of BERT's script.

Both run on the same sentence-split documents (the PubMed sample and WikiText-2, ~3.4 MB of
distinct text; ``--copies`` repeats it)
with the same WordPiece vocabulary, max_seq_length, dupe factor and masking settings:

- reference: ``benchmarks/reference_create_pretraining_data.py`` exactly as the original runs —
  pure-Python FullTokenizer, one process, one RNG, then ids written to parquet;
- ours: ``orchestrator.text.instances.run_units`` over conventional shards (Rust tokenizer, one
  actor per worker, parquet shards written as units finish), with 1 and with 2 workers.

Measured: instance tokens written per second of wall time. Ray start-up is excluded: each timed
run follows an untimed run of the same pipeline with the same worker count, so worker processes
are started (Ray starts one on demand, ~1 s) and have imported our modules. Each run reads its
own copy of the shards and vocabulary, so nothing tokenized by an earlier run is reused (worker
processes cache tokenized shards and words by path: a real build's second length reuses them).
The tokenizer is loaded inside the timed region. The machine may be shared: numbers are noisy.
Last line: JSON.

    python benchmarks/instances_vs_reference.py [--copies 1 --dupe-factor 5 --max-seq-length 128]
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

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
DEFAULT_INPUTS = (f"text:{DATA / 'pubmed_sample' / 'PubMedAbstract_1MB.txt'}",
                  f"wikitext:{DATA / 'general_en' / 'wikitext2_tokenized' / 'valid.txt'}",
                  f"wikitext:{DATA / 'general_en' / 'wikitext2_tokenized' / 'test.txt'}")


def _reference_module():
    spec = importlib.util.spec_from_file_location("reference_create_pretraining_data",
                                                  ROOT / "benchmarks" / "reference_create_pretraining_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prepare(inputs: list[str], copies: int, shard_bytes: int, vocab_size: int, work: Path):
    """Sentence-split documents -> BERT-format text file, project shards, vocabulary.

    ``inputs`` are ``FORMAT:PATH`` (a source format of ``orchestrator.data.sources``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.data.mixing import ShardInfo
    from orchestrator.data.sources import SourceConfig, iter_source
    from orchestrator.text.sentences import split_sentences
    from orchestrator.text.vocabulary import VocabConfig, save_tokenizer, train_wordpiece

    docs = []
    for spec in inputs:
        fmt, path = spec.split(":", 1)
        src = SourceConfig(name="corpus", paths=(path,), format=fmt, role="small")
        docs += [split_sentences(d.text) for d in iter_source(src)]
    docs = docs * copies
    with open(work / "bert_input.txt", "w", encoding="utf-8") as f:
        for doc in docs:
            f.write("\n".join(doc) + "\n\n")
    shards, buf = [], []

    def flush():
        if not buf:
            return
        path = work / f"shard-{len(shards):04d}.parquet"
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
    tok = train_wordpiece((s for d in docs for s in d), VocabConfig(vocab_size=vocab_size))
    vocab_dir = work / "vocab"
    vocab_dir.mkdir()
    save_tokenizer(tok, vocab_dir)
    return shards, vocab_dir, sum(len(d) for d in docs)


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
    from orchestrator.data.mixing import MIXERS, MixerConfig
    from orchestrator.text.instances import InstanceConfig, run_units

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", default=list(DEFAULT_INPUTS),
                   help="FORMAT:PATH documents (text = one per line, wikitext, jsonl, parquet); default: the "
                        "PubMed sample and WikiText-2 valid+test, ~3.4 MB of distinct real text")
    p.add_argument("--copies", type=int, default=1, help="repeat the input this many times (repeated text makes "
                                                          "tokenization caches look better than on a real corpus)")
    p.add_argument("--dupe-factor", type=int, default=5)
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--max-predictions", type=int, default=20)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--shard-bytes", type=int, default=250_000)
    p.add_argument("--cpus-per-worker", type=float, default=0.9)
    args = p.parse_args(argv)
    missing = [spec for spec in args.input if ":" not in spec or not Path(spec.split(":", 1)[1]).is_file()]
    if missing:
        print(f"input not found (expected FORMAT:PATH to a file): {missing}", file=sys.stderr)
        return 2
    import ray
    import ray.data

    from orchestrator.core.runtime import init_ray

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shards, vocab_dir, n_sentences = prepare(args.input, args.copies, args.shard_bytes, args.vocab_size, work)
        print(f"input: {[Path(x).name for x in args.input]} x{args.copies}: {n_sentences} sentences, "
              f"{len(shards)} shards")
        reference = run_reference(work, vocab_dir, args)
        print(f"reference (1 process): {reference}")
        init_ray(num_cpus=2, log_to_driver=False)
        try:
            # each timed run follows an untimed one with the same worker count (on its own copy
            # of the input): Ray start-up -- worker processes started and leased -- is not timed
            run_ours(shards, vocab_dir, work, 1, args, "warm-1")
            one = run_ours(shards, vocab_dir, work, 1, args, "1")
            print(f"ours, 1 worker:        {one}")
            run_ours(shards, vocab_dir, work, 2, args, "warm-2")
            two = run_ours(shards, vocab_dir, work, 2, args, "2")
            print(f"ours, 2 workers:       {two}")
        finally:
            ray.shutdown()
    result = {"speedup": round(two["tokens_per_s"] / reference["tokens_per_s"], 2),
              "speedup_1_worker": round(one["tokens_per_s"] / reference["tokens_per_s"], 2),
              "scaling_1_to_2": round(two["tokens_per_s"] / one["tokens_per_s"], 2),
              "reference_tokens_per_s": reference["tokens_per_s"], "ours_tokens_per_s": two["tokens_per_s"],
              "reference_instances": reference["instances"], "ours_instances": two["instances"]}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
