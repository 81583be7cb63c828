"""The order a sweep's Ray trials start in (``sweep.order``): estimated work, the longest first."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.core.errors import ConfigError, InputError
from orchestrator.finetune.readers import Example
from orchestrator.finetune.trial import group_trials
from orchestrator.sweep.config import EarlyStopping, SweepConfig
from orchestrator.sweep.order import (
    estimated_ends,
    estimated_work,
    example_words,
    list_schedule_end,
    longest_first,
    split_reader,
    trial_work,
)
from orchestrator.sweep.space import build_trials


def _trials(tmp_path: Path, **overrides) -> list:
    model = tmp_path / "m"
    model.mkdir(exist_ok=True)
    cfg = SweepConfig(search_space="tiny", learning_rates=(1e-3,), seeds=(1,), **overrides)
    return build_trials(cfg, cfg.space, {"m": model})


def test_work_counts_words_up_to_the_length_limit_epochs_and_evaluations(tmp_path):
    assert example_words(Example("1", ["a", "b", "c"], ["O", "O", "O"]), 64) == 3  # NER: its tokens
    assert example_words(Example("1", "one two three", 0.5, text_b="four five"), 64) == 5  # a pair: both texts
    assert example_words(Example("1", "w " * 500, "x"), 64) == 64  # truncated to max_seq_length
    trial = _trials(tmp_path, tasks=("biosses",), epochs={"biosses": (2, 5)})[0]
    ten = [Example(str(i), "w " * 10, 0.0) for i in range(4)]  # 4 examples of 10 words
    splits = {"train": ten, "dev": ten[:2], "test": ten[:1]}
    # 3 x 5 epochs x 40 training words, plus 2 evaluations x (20 dev + 10 test) words
    assert trial_work(trial, splits) == 3 * 5 * 40 + 2 * 30
    stopping = _trials(tmp_path, tasks=("biosses",), early_stopping=EarlyStopping(patience=2, max_epochs=7))[0]
    assert trial_work(stopping, splits) == 3 * 7 * 40 + 7 * 20 + 10  # dev every epoch, test once


def test_longest_first_orders_ray_trials_by_their_tasks_splits_and_epochs(tmp_path):
    trials = _trials(tmp_path, tasks=("biosses", "bc5cdr_chemical", "chemprot"),
                     epochs={"biosses": (1,), "bc5cdr_chemical": (30,), "chemprot": (1,)})
    groups = group_trials(trials, bundle=False)
    read = split_reader()
    ordered = longest_first(groups, estimated_work(trials, read))
    assert [g[0].task for g in ordered] == ["bc5cdr_chemical", "biosses", "chemprot"]  # grid: biosses first
    work = {g[0].task: trial_work(g[0], read(g[0])) for g in groups}
    assert work["bc5cdr_chemical"] > work["biosses"] > 0
    # the splits as the worker reads them: the training cap applies
    capped = _trials(tmp_path, tasks=("biosses",), max_train_examples=10)[0]
    assert len(read(capped)["train"]) == 10 and trial_work(capped, read(capped)) < work["biosses"] * 20
    # a bundle's work is its trials' together: two learning rates outweigh one trial of the same task
    cfg = SweepConfig(search_space="tiny", tasks=("biosses",), learning_rates=(1e-3, 3e-3), seeds=(1, 2),
                      epochs={"biosses": (1,)})
    two = build_trials(cfg, cfg.space, {"m": tmp_path / "m"})
    mixed = [[two[0]], [two[1], two[3]]]  # a trial alone, then a bundle of two (the grid's order)
    work = estimated_work(two, read)
    assert longest_first(mixed, work) == [mixed[1], mixed[0]]
    total = sum(work[t.trial_id] for g in mixed for t in g)  # one slot: every order ends when all the work is done
    assert estimated_ends(mixed, work, 1) == {"grid": total, "longest_first": total, "bound": total}
    # equal estimates keep the grid's order (the seeds of one task read the same splits)
    assert longest_first([[two[0]], [two[1]]], work) == [[two[0]], [two[1]]]


def test_the_longest_last_leaves_slots_idle_at_the_end():
    assert list_schedule_end([1, 1, 1, 3], slots=2) == 4  # the grid's order: the long trial starts last
    assert list_schedule_end([3, 1, 1, 1], slots=2) == 3  # longest first: the short ones fill the other slot
    assert list_schedule_end([2, 2], slots=8) == 2 and list_schedule_end([], slots=2) == 0


def test_the_progress_lines_time_left_follows_the_work_done_not_the_trials_counted():
    import time

    from orchestrator.sweep.runner import SweepProgress

    work = {"long": 3.0, "short1": 0.5, "short2": 0.5}
    progress = SweepProgress(3, every_s=0.0, work=work)
    progress.started = time.monotonic() - 30.0  # the long trial took 30 s
    line = progress.add({"trial_id": "long", "task": "T"})
    assert "1/3 trials" in line and "about 10.0s left" in line  # 3/4 of the work in 30 s: 1/4 left in 10 s
    by_count = SweepProgress(3, every_s=0.0, work={**work, "short2": float("inf")})  # unknown work: by counts
    by_count.started = time.monotonic() - 30.0
    assert "about 1m00s left" in by_count.add({"trial_id": "long", "task": "T"})


def test_the_time_left_counts_the_ray_trials_running_at_once():
    """8 slots, 16 Ray trials of equal work (the first two bundles of 3): the first ends after 100 s, the
    7 others running as long are about done, so 8 wait: about 100 s left, where the work done alone says
    15 times the elapsed time."""
    import time

    from orchestrator.sweep.runner import SweepProgress

    ids = {f"r{i}": [f"r{i}.{j}" for j in range(3 if i < 2 else 1)] for i in range(16)}
    work = {trial: 1.0 / len(trials) for trials in ids.values() for trial in trials}
    progress = SweepProgress(len(work), every_s=0.0, work=work)
    t0 = time.monotonic() - 100.0
    progress.started = t0
    for key in list(ids)[:8]:
        progress.start(key, ids[key], now=t0)
    progress.finish("r0", now=t0 + 100.0)
    lines = [progress.add({"trial_id": trial, "task": "T"}) for trial in ids["r0"]]
    assert "3/20 trials" in lines[-1] and "about 1m40s left" in lines[-1], lines[-1]
    # the same without the starts: the work done over the elapsed time, 15 Ray trials' work in 1500 s
    alone = SweepProgress(len(work), every_s=0.0, work=work)
    alone.started = t0
    assert "about 25m00s left" in [alone.add({"trial_id": trial, "task": "T"}) for trial in ids["r0"]][-1]


def test_a_directory_the_driver_does_not_see_starts_first_and_bad_input_fails_before_any_trial(tmp_path):
    import dataclasses
    import shutil

    trials = _trials(tmp_path, tasks=("biosses", "chemprot"))
    away = dataclasses.replace(trials[1], data_dir=str(tmp_path / "on-the-workers-only"))
    work = estimated_work([trials[0], away], split_reader())
    assert work[away.trial_id] == float("inf") and longest_first([[trials[0]], [away]], work) == [[away], [trials[0]]]
    bad = tmp_path / "biosses"
    shutil.copytree(Path(trials[0].data_dir), bad)
    lines = (bad / "train.tsv").read_text().splitlines(keepends=True)
    lines[1] = lines[1].rsplit("\t", 1)[0] + "\tnot-a-number\n"  # the first example's score
    (bad / "train.tsv").write_text("".join(lines))
    with pytest.raises(InputError, match=r"train\.tsv:2"):
        estimated_work([dataclasses.replace(trials[0], data_dir=str(bad))], split_reader())


def test_the_order_is_a_choice_of_two_that_leaves_the_sweeps_identity(tmp_path):
    from orchestrator.core.config import from_dict
    from orchestrator.sweep.runner import plan_sweep
    from orchestrator.sweep.space import tracked_config

    assert SweepConfig().order == "longest_first" and SweepConfig(order="grid").order == "grid"
    with pytest.raises(ConfigError, match="order"):
        from_dict(SweepConfig, {"order": "shortest_first"})
    # the same MLflow sweep (its fingerprint hashes this) whichever order its trials start in
    grid = SweepConfig(order="grid")
    assert tracked_config(grid, grid.space) == tracked_config(SweepConfig(), SweepConfig().space)
    assert "Ray trials start longest first" in plan_sweep(SweepConfig(tasks=("biosses",)), {})
    assert "in the grid's order (sweep.order)" in plan_sweep(SweepConfig(tasks=("biosses",), order="grid"), {})


def test_ray_tune_starts_the_longest_trial_first_and_the_grid_order_on_request(tiny_bert, ray_local, tmp_path):
    from orchestrator.sweep.runner import run_sweep

    def started(order: str) -> tuple[list[str], dict]:
        cfg = SweepConfig(search_space="tiny", tasks=("biosses", "bc5cdr_chemical"), learning_rates=(5e-4,),
                          seeds=(1,), epochs={"biosses": (1,), "bc5cdr_chemical": (20,)}, max_concurrent_trials=1,
                          order=order)
        out = tmp_path / order
        result = run_sweep(cfg, {"tiny": tiny_bert}, out, None, tmp_path)
        rows = [row for path in out.glob("tune/*/*/result.json")
                for row in map(json.loads, path.read_text().splitlines()) if "trial_started" in row]
        kept = {rec["trial_id"]: rec for rec in (json.loads(p.read_text()) for p in (out / "trials").glob("*.json"))}
        return [kept[trial_id]["task"] for row in sorted(rows, key=lambda r: r["trial_started"])
                for trial_id in row["trial_ids"]], result.results

    first, results = started("longest_first")
    grid, grid_results = started("grid")
    assert first == ["BC5CDR-chemical", "BIOSSES"] and grid == ["BIOSSES", "BC5CDR-chemical"]
    assert results["cells"] == grid_results["cells"]  # the order changes when trials start, not what they compute


def test_the_overhead_benchmark_sweeps_an_experiments_space_and_task_directories(tmp_path):
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("sweep_overhead", root / "benchmarks" / "sweep_overhead.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    sweep = bench.experiment_sweep(root / "experiments" / "oubiobert_ablation_gpu.yaml")
    assert sweep["search_space"] == "gpu_ablation" and set(sweep["task_dirs"]) == {
        "biosses", "bc5cdr_chem_iob", "bc5cdr_disease_iob", "hoc_prior", "chemprot_resplit"}
    assert SweepConfig(**sweep).space.max_train_examples == 2000  # a config the sweep accepts as it is
    (tmp_path / "no_sweep.yaml").write_text("run_name: x\n")
    with pytest.raises(SystemExit, match="no_sweep.yaml: expected a 'sweep:' mapping"):
        bench.experiment_sweep(tmp_path / "no_sweep.yaml")
    with pytest.raises(SystemExit, match="missing.yaml"):
        bench.experiment_sweep(tmp_path / "missing.yaml")


def test_the_gpu_ablations_order_estimate_runs_on_its_real_tasks(shared_data):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "benchmarks/sweep_order_estimate.py"], cwd=root, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # 135 trials: SimPT + AmpV's 15 bundles of 3 learning rates, conventional's and the floor's 15 of 6
    assert (out["trials"], out["ray_trials"], out["slots"]) == (135, 30, 8)
    assert out["lower_bound"] <= out["longest_first_end"] < out["grid_end"]
