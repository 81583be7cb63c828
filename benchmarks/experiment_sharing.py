"""What an experiment's shared plan saves over running each arm as its own chain.

    python benchmarks/experiment_sharing.py [--config experiments/oubiobert_ablation.yaml]

1. Counted from the plan of ``--config`` (its real sizes, nothing is built): the stage outputs the
   shared plan builds, per stage, against the outputs of every arm run as its own chain.
2. Measured on the bundled sample data: the same arms over the smoke preset's corpus and model
   (``--preset smoke``, tiny sizes), the corpus, vocab, instances and pretrain stages built once as
   one experiment, then once per arm, each arm alone in its own run directory (no output shared).
   The sweep is left out of both: it is the same trials either way (one paired sweep, or one per
   arm). Both runs use the same embedded Ray and start from empty directories.

Last line: JSON with outputs_shared, outputs_separate, counted_ratio, wall_shared_s,
wall_separate_s, wall_ratio (shared / separate; lower is better).
"""
from __future__ import annotations

import argparse
import collections
import json
import logging
import tempfile
import time
from pathlib import Path

from orchestrator.core.cli import load_preset
from orchestrator.core.config import from_dict, merge, read_yaml
from orchestrator.workflows.blue_sweep import run
from orchestrator.workflows.config import ExperimentConfig
from orchestrator.workflows.runner import arm_plans, shared_outputs

ROOT = Path(__file__).resolve().parents[1]
BUILD_STAGES = ("corpus", "vocab", "instances", "pretrain")


def counted(cfg: ExperimentConfig) -> dict:
    plans = arm_plans(cfg)
    shared = collections.Counter(out.stage for out, _ in shared_outputs(plans).values())
    separate = collections.Counter(out.stage for p in plans.values() for out in p.outputs)
    return {"arms": list(plans), "by_stage": {s: [shared[s], separate[s]] for s in separate},
            "outputs_shared": sum(shared.values()), "outputs_separate": sum(separate.values())}


def sample_config(arms: dict, root: Path, name: str) -> ExperimentConfig:
    """The smoke preset on the bundled sample data, building stages only, with these arms."""
    base = merge(load_preset("blue_sweep", "smoke"),
                 {"runs_root": str(root), "run_name": name, "stages": list(BUILD_STAGES),
                  "tracking": {"enabled": False}, "corpus": {"mixer": {"name": "conventional"}}})
    return from_dict(ExperimentConfig, merge(base, {"arms": arms, "baseline": next(iter(arms))}))


def timed(cfg: ExperimentConfig) -> float:
    start = time.perf_counter()
    result = run(cfg)
    if any(a["status"] != "ok" for a in result.arms.values()):
        raise SystemExit(f"an arm failed: {result.arms}")
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "experiments" / "oubiobert_ablation.yaml")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)

    data = read_yaml(args.config)
    count = counted(from_dict(ExperimentConfig, data, where=str(args.config)))
    print(f"{args.config.name}: {count['outputs_shared']} stage outputs shared vs {count['outputs_separate']} "
          f"as separate chains; per stage (shared, separate): {count['by_stage']}")
    arms = data["arms"]
    with tempfile.TemporaryDirectory() as tmp:
        shared_s = timed(sample_config(arms, Path(tmp) / "shared", "exp"))
        print(f"sample data, shared plan: {shared_s:.1f} s")
        separate_s = 0.0
        for name, overrides in arms.items():
            seconds = timed(sample_config({name: overrides}, Path(tmp) / "separate", name))
            print(f"sample data, arm {name} alone: {seconds:.1f} s")
            separate_s += seconds
    print(json.dumps({"config": args.config.name, "arms": count["arms"],
                      "outputs_shared": count["outputs_shared"], "outputs_separate": count["outputs_separate"],
                      "counted_ratio": round(count["outputs_shared"] / count["outputs_separate"], 3),
                      "wall_shared_s": round(shared_s, 1), "wall_separate_s": round(separate_s, 1),
                      "wall_ratio": round(shared_s / separate_s, 3)}))


if __name__ == "__main__":
    main()
