"""Source scoring speed: sequential vs one Ray task per source, on the real shared data.

Scores PubMed, WikiText-2 and Tiny Shakespeare against BC5CDR-chem, HoC and ChemProt dev
text (``--sample-tokens`` per sub-sample, 5 sub-samples each), once in-process one source
after another and once as Ray tasks on an embedded local Ray (Ray start-up included).
Reported: wall seconds, sub-sample tokens measured per second (each sub-sample: n-gram
counting, lmplz + build_binary, target perplexity), and the per-sample seconds, from
which a 10M-token sub-sample (the seed's size) can be extrapolated: lmplz and the counting
are linear in the sample. The machine may be shared: timings are noisy. Last line: JSON.

    python benchmarks/selection_speed.py [--sample-tokens 100000]
    python benchmarks/selection_speed.py --sample-tokens 1000000 --repeats 3   # issue 17: 3 sources x 5 samples

The shared sources are smaller than 1M tokens (this tokenizer: PubMed ~0.17M, WikiText-2 valid+test
~0.52M, Tiny Shakespeare ~0.25M), so at ``--sample-tokens 1000000`` every sub-sample is the whole
source (``short_source=whole``: the five sub-samples of a source are the same text, each still
counted, modelled and measured); ``source_tokens`` and ``whole_source`` in the JSON say so. The
Ray path submits the largest source first (``orchestrator.workflows.score_sources.largest_first``):
with 3 sources on 2 CPUs the largest one submitted last ran alone at the end.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from orchestrator.core.runtime import ray_session
from orchestrator.selection.scoring import SelectionConfig
from orchestrator.workflows import score_sources

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TARGETS = [DATA / "ner" / "BC5CDR-chem-IOB" / "devel.tsv", DATA / "hoc" / "dev.tsv", DATA / "chemprot" / "dev.tsv"]
SOURCES = {"pubmed": DATA / "pubmed_sample" / "PubMedAbstract_1MB.txt",
           "wikitext": DATA / "general_en" / "wikitext2_tokenized",
           "shakespeare": DATA / "general_en" / "tinyshakespeare" / "input.txt"}


def timed(cfg: SelectionConfig) -> tuple[float, dict]:
    start = time.perf_counter()
    result = score_sources.run(cfg)
    seconds = time.perf_counter() - start
    samples = json.loads((result.out_dir / "samples.json").read_text())
    return seconds, samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample-tokens", type=int, default=100_000)
    ap.add_argument("--num-samples", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=1,
                    help="paired repeats, the order alternating (sequential first, then Ray first, ...); medians "
                         "reported. Each repeat also times Ray's start and the Ray path on a Ray already running "
                         "(what a job that started Ray for other stages sees)")
    args = ap.parse_args()
    seqs, rays, prestarted, starts = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        base = dict(targets=[str(t) for t in TARGETS], sources={k: str(v) for k, v in SOURCES.items()},
                    sample_tokens=args.sample_tokens, num_samples=args.num_samples, short_source="whole",
                    lmplz_memory="200M", num_cpus=2)
        for r in range(args.repeats):
            def seq(r=r):
                seconds, found = timed(SelectionConfig(**base, parallel=False, out_dir=f"{tmp}/seq{r}"))
                seqs.append(seconds)
                return found

            def ray(r=r):
                rays.append(timed(SelectionConfig(**base, parallel=True, out_dir=f"{tmp}/ray{r}"))[0])
                if args.repeats > 1:
                    start = time.perf_counter()
                    with ray_session(address="local", num_cpus=2, log_to_driver=False):
                        starts.append(time.perf_counter() - start)
                        prestarted.append(timed(SelectionConfig(**base, parallel=True,
                                                                out_dir=f"{tmp}/pre{r}"))[0])

            if r % 2 == 0:
                samples = seq()
                ray()
            else:
                ray()
                samples = seq()
    seq_s, ray_s = statistics.median(seqs), statistics.median(rays)
    measured = sum(s["sample_tokens"] * len(s["samples"]) for s in samples.values())
    per_sample = [x["seconds"] for s in samples.values() for x in s["samples"]]
    mean_sample_s = sum(per_sample) / len(per_sample)
    tokens = sum(s["sample_tokens"] for s in samples.values()) / len(samples)
    result = {"sample_tokens": args.sample_tokens, "sources": len(SOURCES), "num_samples": args.num_samples,
              "sequential_s": round(seq_s, 2), "ray_s": round(ray_s, 2), "ray_speedup": round(seq_s / ray_s, 2),
              "sample_tokens_per_s_sequential": round(measured / seq_s),
              "mean_seconds_per_sample": round(mean_sample_s, 3),
              "extrapolated_seconds_per_10M_sample": round(mean_sample_s * 10_000_000 / tokens, 1),
              "source_tokens": {n: s["source_tokens"] for n, s in samples.items()},
              "whole_source": sorted(n for n, s in samples.items() if s["whole_source"])}
    if args.repeats > 1:
        pre_s = statistics.median(prestarted)
        result.update({"repeats": args.repeats, "sequential_runs_s": [round(x, 1) for x in seqs],
                       "ray_runs_s": [round(x, 1) for x in rays], "ray_start_s": round(statistics.median(starts), 1),
                       "ray_prestarted_s": round(pre_s, 2), "ray_prestarted_speedup": round(seq_s / pre_s, 2)})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
