"""Proxy throughput: K proxies through the shared path vs K independent pretraining runs of the same size.

Shared path (``orchestrator.workflows.proxy_search.run``): the sources read, split and tokenized
once (one vocabulary), then K trials of one Ray Tune run, each drawing its mixture from the pools,
training and measuring its target loss (plus the regression and the written proposal).

Reference: what the chain does for one mixture, K times (the project's real functions): the corpus
stage with the weighted mixer (Ray Data read, sentence split, shards), a WordPiece vocabulary, the
instances stage (BERT's create_pretraining_data, parquet) and pretraining on Ray Train with the same
model, steps, batch and sequence length (MLM only, 2 workers as the chain's presets run). The
chain has no token budget before pretraining: each reference run builds its whole mixed corpus and
all its instances (~20,000 sequences of 32 here), of which pretraining reads 640. The reference
measures no target loss, which is in its favour. One embedded Ray serves both (its start
is timed by neither); MLflow off in both. Default: the job's tiny preset on the bundled sample
corpus, K = 4. The machine may be shared: timings are noisy. Last line: JSON.

    python benchmarks/proxy_search.py [--proxies 4] [--steps 40]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import tempfile
import time
from pathlib import Path

from orchestrator.core.cli import load_preset
from orchestrator.core.config import load_config
from orchestrator.core.runtime import ray_session
from orchestrator.corpus.mixing import MixerConfig
from orchestrator.instances.config import InstanceConfig
from orchestrator.pretrain.config import ModelConfig, PhaseConfig, PretrainConfig
from orchestrator.pretrain.trainer import pretrain
from orchestrator.vocab.wordpiece import VocabConfig
from orchestrator.workflows.proxy_search import ProxySearchConfig, mixtures, run
from orchestrator.workflows.runner import corpus_stages


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--proxies", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps of every run (batch 16 x 32 tokens)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    batch, length = 16, 32
    with tempfile.TemporaryDirectory() as tmp, ray_session(address="local", num_cpus=2, log_to_driver=False):
        cfg = load_config(ProxySearchConfig, base=load_preset("proxy_search", "tiny"), overrides=[
            f"out_dir={tmp}/shared/out", f"proxies={args.proxies}", f"proxy.train_tokens={args.steps * batch * length}",
            f"proxy.batch_size={batch}", f"pools.max_seq_length={length}", "tracking.enabled=false"])
        start = time.perf_counter()
        shared = run(cfg)
        shared_s = time.perf_counter() - start
        assert all(p["steps"] == args.steps for p in shared.proxies)

        vocab = VocabConfig(vocab_size=cfg.pools.vocab_size, ampv=False, report=False)
        instances = InstanceConfig(max_seq_lengths=(length,), masking="static")
        pre = PretrainConfig(model=ModelConfig(size=cfg.proxy.size, objective="mlm"),
                             phase1=PhaseConfig(max_seq_length=length, steps=args.steps, global_batch_size=batch,
                                                device_batch_size=batch // 2, learning_rate=cfg.proxy.learning_rate),
                             phase2=PhaseConfig(max_seq_length=128, steps=0), num_workers=2, cpus_per_worker=0.5)
        start = time.perf_counter()
        for i, weights in enumerate(mixtures(cfg)):
            corpus = dataclasses.replace(cfg.corpus, mixer=MixerConfig(name="weighted", weights=weights,
                                                                       shard_bytes=cfg.corpus.mixer.shard_bytes))
            run_dir = Path(tmp) / f"independent{i}"
            built = corpus_stages(corpus, vocab, instances, run_dir)
            pretrain(pre, built.instances, built.vocab_dir, run_dir / "pretrain", None, run_dir)
        independent_s = time.perf_counter() - start
    ratio = shared_s / independent_s
    print(f"{args.proxies} proxies of {args.steps} steps x {batch} x {length} tokens: shared path {shared_s:.1f} s, "
          f"independent runs {independent_s:.1f} s, ratio {ratio:.2f} (goal <= 0.6)")
    print(json.dumps({"proxies": args.proxies, "steps": args.steps, "batch": batch, "seq_len": length,
                      "shared_s": round(shared_s, 1), "independent_s": round(independent_s, 1),
                      "ratio": round(ratio, 3), "goal": 0.6, "meets_goal": ratio <= 0.6}))


if __name__ == "__main__":
    main()
