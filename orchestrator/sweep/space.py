"""Search spaces as YAML (search_spaces/*.yaml) and their expansion into trials.

Epoch sharing: the grid's epoch axis is not expanded. One trial per (model, task, learning
rate, seed) trains to the largest epoch count of the task's range and is evaluated at every
epoch value of the range. With ``early_stopping`` on there is no epoch axis: one trial per
(model, task, learning rate, seed) trains up to ``max_epochs`` and picks its own epoch on dev.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from orchestrator.core.config import check_number, check_seeds, field, first_repeat, from_dict, read_yaml, to_dict
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.manifest import file_digests
from orchestrator.core.registry import suggest
from orchestrator.core.reuse import content_key, model_identity
from orchestrator.finetune.metrics import METRICS
from orchestrator.finetune.spec import SAMPLE_DIR, TaskSpec, is_task_path, load_task, shipped_task_names, task_stem
from orchestrator.finetune.trial import TrialSpec
from orchestrator.sweep.config import EarlyStopping, Precision, SweepConfig, Tune, check_reinit_choices, listed
from search_spaces import SPACE_DIR

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    tasks: tuple[str, ...] = field(help="task file stems (orchestrator/finetune/tasks) or task YAML paths")
    learning_rates: tuple[float, ...] = field(help="learning rates (seed 000: 3e-5, 4e-5, 5e-5)")
    seeds: tuple[int, ...] = field(help="random seeds; selection uses the dev mean over them")
    epochs: dict[str, tuple[int, ...]] = field(default_factory=dict,
                                               help="task (stem or display name) -> epoch counts to answer (seed "
                                                    "000 Table 4); not with early_stopping, which replaces "
                                                    "this axis")
    batch_size: int | tuple[int, ...] = field(
        32, help="training batch size; a list is a sweep axis selected on dev like the learning rate (seed 002's "
                 "classification grid: [16, 32] x epochs [2, 4, 6])")
    max_seq_length: int = field(128, help="maximum tokens per input")
    max_train_examples: int = field(0, help="cap training examples per task (0 = all)")
    max_eval_examples: int = field(0, help="cap dev/test examples per task (0 = all)")
    optimizer: Literal["adamw", "adam"] = field(
        "adamw", help="adamw: AdamW with weight_decay off biases and LayerNorm (BERT's and seed 002's recipe); adam: "
                      "Adam without weight decay (seed 000: 'employed Adam for fine-tuning'); weight_decay is "
                      "then ignored")
    weight_decay: float = field(0.01, help="AdamW weight decay (biases and LayerNorm excluded)")
    warmup_proportion: float = field(0.1, help="linear warmup share of the trial's steps")
    tune: Tune = field(
        "full", help="full: every weight trains (a model's pretrained adapters included); adapters: only the "
                     "adapters and the task head, the base frozen (seed 002: lr 1e-4, 30 epochs); a model "
                     "pretrained without adapters gets fresh ones")
    precision: Precision = field(
        "fp32", help="fine-tuning precision: fp32, bf16 autocast, or fp16 autocast with a dynamic loss scaler "
                     "(seed 000 fine-tuned in FP16); weights stay fp32, evaluation runs in fp32")
    adapter_reduction_factor: int = field(16, help="tune=adapters on a model without adapters: bottleneck = "
                                                   "hidden size / this (Pfeiffer et al.'s 16)")
    early_stopping: EarlyStopping = field(default_factory=EarlyStopping,
                                          help="early stopping on dev (patience > 0) instead of the epoch grids")
    reinit_layers: int | tuple[int, ...] = field(
        0, help="re-initialise the encoder's top N layers before fine-tuning, as a fresh BERT's (Zhang et al. 2021: "
                "top layers specialised to pretraining's objectives can slow or hurt fine-tuning on small data); "
                "0 = none; a list is a sweep axis selected on dev like the learning rate (Zhang et al. chose it on "
                "dev); full fine-tuning only")

    def __post_init__(self):
        if not self.tasks or not self.learning_rates or not self.seeds:
            raise ConfigError("search space needs tasks, learning_rates and seeds")
        if not self.batch_sizes or min(self.batch_sizes) < 1 or self.max_seq_length < 8:
            raise ConfigError("search space: batch_size >= 1 (or a list of them) and max_seq_length >= 8")
        if len(set(self.batch_sizes)) != len(self.batch_sizes):
            raise ConfigError(f"search space: batch_size {list(self.batch_sizes)} repeats a value")
        for axis, values in (("tasks", self.tasks), ("learning_rates", self.learning_rates)):
            if (again := first_repeat(values)) is not None:
                raise ConfigError(f"search space: {axis} {list(values)} repeats {again}")
        printed: dict[str, float] = {}
        for lr in self.learning_rates:  # trial ids name a learning rate to 6 significant digits ({lr:g})
            if printed.setdefault(f"{lr:g}", lr) != lr:
                raise ConfigError(f"search space: learning_rates {printed[f'{lr:g}']!r} and {lr!r} both read "
                                  f"{lr:g} in trial ids (6 significant digits), so their trials would share "
                                  "records: give learning rates that differ within 6 digits")
        if self.adapter_reduction_factor < 1:
            raise ConfigError("search space: adapter_reduction_factor must be >= 1")
        check_reinit_choices("search space: reinit_layers", self.reinit_layers)
        if any(self.reinit_choices) and self.tune != "full":
            raise ConfigError(f"search space: reinit_layers {listed(self.reinit_layers)} with tune {self.tune!r}: the "
                              "re-initialised layers would stay frozen at random weights; use tune full")
        if self.max_train_examples < 0 or self.max_eval_examples < 0:
            raise ConfigError("search space: max_train_examples and max_eval_examples must be >= 0 (0 = all)")
        for lr in self.learning_rates:
            check_number("search space: each of learning_rates", lr, low=0, low_open=True)
        check_seeds("search space: seeds", self.seeds)
        for task, grid in self.epochs.items():
            if not grid or any(e < 1 for e in grid):
                raise ConfigError(f"search space: epochs.{task}: need positive epoch counts, got {list(grid)}")
            if first_repeat(grid) is not None:
                raise ConfigError(f"search space: epochs.{task}: {list(grid)} repeats an epoch count")
        check_number("search space: weight_decay", self.weight_decay, low=0)
        check_number("search space: warmup_proportion", self.warmup_proportion, low=0, high=1, high_open=True)
        if self.early_stopping.on and self.epochs:
            raise ConfigError(f"search space: epochs {sorted(self.epochs)} and early_stopping.patience "
                              f"{self.early_stopping.patience}: early stopping replaces the epochs axis, give one")

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The batch-size axis: one value unless the space lists several."""
        return (self.batch_size,) if isinstance(self.batch_size, int) else tuple(self.batch_size)

    @property
    def reinit_choices(self) -> tuple[int, ...]:
        """The axis of layers re-initialised: one value unless the space lists several."""
        return (self.reinit_layers,) if isinstance(self.reinit_layers, int) else tuple(self.reinit_layers)



def space_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(f"search space file not found: {path}")
        return path
    path = SPACE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in SPACE_DIR.glob("*.yaml"))
        raise ConfigError(f"unknown search space {name_or_path!r}{suggest(name_or_path, names)}")
    return path


def resolve_space(cfg: SweepConfig) -> SearchSpace:
    """The space's YAML with the sweep config's overrides applied (``SpaceOverrides.apply``). A job
    reads it once, as ``cfg.space``; call this for a fresh read."""
    path = space_path(cfg.search_space)
    data = read_yaml(path)
    # a task YAML named in a space file is found relative to that file (overrides: to the cwd)
    tasks = data.get("tasks") or []
    if isinstance(tasks, str):  # `tasks: biosses` (or `a, b`): a list of one, as the config's lists take it
        tasks = [t.strip() for t in tasks.split(",")]
    data["tasks"] = [str((path.parent / t).resolve()) if str(t).endswith((".yaml", ".yml"))
                     and not Path(t).is_absolute() else t for t in tasks]
    if cfg.epochs and isinstance(data.get("epochs"), dict):
        data["epochs"] = _not_overridden(data["epochs"], cfg.epochs, cfg.apply(data)["tasks"])
    space = from_dict(SearchSpace, cfg.apply(data), where=str(path))
    _check_task_keys(cfg, space, path)
    return space


def _not_overridden(grids: dict, given: dict, tasks: list) -> dict:
    """A space file's epoch grids less those of the tasks ``sweep.epochs`` gives one for under any of their names
    (the file's ``biosses: [10, 20]``, the override's ``BIOSSES: [1]``): the override's grid replaces the file's."""
    same = {alias: task for task in tasks if isinstance(task, str) for alias in task_aliases(task, load_task(task))}
    replaced = {same.get(key, key) for key in given}
    return {key: grid for key, grid in grids.items() if same.get(key, key) not in replaced}


def _check_task_keys(cfg: SweepConfig, space: SearchSpace, path: Path) -> None:
    """Every key of ``sweep.task_dirs``, ``sweep.epochs`` and the space's ``epochs`` names a task: one of
    the space's (by stem or display name) or a shipped one (a config may hold every task's directory
    and run a few). A misspelt key would otherwise be ignored: the task read from the default data, or
    trained to the space's epochs."""
    names = set(shipped_task_names())
    aliases = {task: task_aliases(task, load_task(task)) for task in space.tasks}
    used = set().union(*aliases.values())
    names |= used
    for where, keys in ((f"{cfg.KEY}.task_dirs", cfg.task_dirs), (f"{cfg.KEY}.epochs", cfg.epochs),
                        (f"{path}: epochs", space.epochs)):
        for key in keys:
            if key not in names:
                raise ConfigError(f"{where}: {key!r} names no task of the search space or shipped with the "
                                  f"project{suggest(key, names)}")
        if keys is cfg.task_dirs and (unused := [k for k in keys if k not in used]):  # a shared config: allowed
            _warn_once(f"{where}: {', '.join(map(repr, unused))} name(s) no task of this search space (its tasks: "
                       f"{', '.join(task_key(t) for t in space.tasks)}): not read")
        for task in space.tasks:  # one task under its stem and its display name: which one wins is not a choice
            given = {key: value for key, value in keys.items() if key in aliases[task]}
            if len(set(given.values())) > 1:
                raise ConfigError(f"{where}: {' and '.join(map(repr, given))} name the same task with different "
                                  f"values ({', '.join(map(repr, given.values()))}): keep one")


@functools.cache
def _warn_once(message: str) -> None:
    """A config's warning said once a process, however often its space is resolved."""
    log.warning("%s", message)


def task_key(name: str) -> str:
    """The name a task goes by in trial ids: a YAML path's file stem, else the task as named."""
    return Path(name).stem if name.endswith((".yaml", ".yml")) else name


def task_aliases(task: str, spec: TaskSpec) -> tuple[str, ...]:
    """Every key a per-task setting (epochs, task_dirs, export_best) may name ``task`` by, however the task list
    names it: as named there, its file stem and its display name."""
    return tuple(dict.fromkeys((task, task_key(task), task_stem(task), spec.name)))


def epoch_grid(space: SearchSpace, task: str, spec: TaskSpec) -> tuple[int, ...]:
    """The epoch counts a task's trials answer; with early stopping, only the most they may train."""
    if space.early_stopping.on:
        return (space.early_stopping.max_epochs,)
    for key in task_aliases(task, spec):
        if key in space.epochs:
            return tuple(sorted(set(space.epochs[key])))
    raise ConfigError(f"search space has no epoch grid for task {task!r}{suggest(task_key(task), space.epochs)}")


def task_data_dir(cfg: SweepConfig, task: str, spec: TaskSpec) -> str:
    """The directory holding a task's split files: a per-task override, else <data root>/<spec.dir>
    (or, when that is not there, the task's folder in BLUE's bert_data release, ``spec.release_dir``)
    with the shipped synthetic sample as the default root.

    A ``data_dir`` that does not exist is said as such: every task's first file was "not found" in it, the
    first task's named as if that task alone were missing (probe B2). A task folder there only in another case
    (``biosses/`` for ``BIOSSES``, on a case-sensitive file system) is named in the error: the file-not-found
    that followed named the expected path only."""
    for key in task_aliases(task, spec):
        if key in cfg.task_dirs:
            return str(Path(cfg.task_dirs[key]).resolve())
    root = Path(cfg.data_dir).resolve() if cfg.data_dir else SAMPLE_DIR
    if cfg.data_dir and not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        typed = repr(cfg.data_dir) if cfg.data_dir == str(root) else f"{cfg.data_dir!r} ({root})"
        raise ConfigError(f"{cfg.KEY}.data_dir {typed} {what}: give the folder holding one folder per task "
                          "(BLUE's bert_data, or the task YAMLs' dir names)")
    if (root / spec.dir).exists():
        return str(root / spec.dir)
    if spec.release_dir and (root / spec.release_dir).is_dir():
        return str(root / spec.release_dir)
    for name in filter(None, (spec.dir, spec.release_dir)):
        if (other := _case_variant(root, name)) is not None:
            expected = " or ".join(repr(n) for n in filter(None, (spec.dir, spec.release_dir)))
            raise InputError(root / spec.dir, f"no folder for task {spec.name}, but {other} differs from "
                             f"{root / name} only in case", expected=f"its folder named {expected}: rename it, or "
                             f"give it as {cfg.KEY}.task_dirs.{task_key(task)}")
    return str(root / spec.dir)


def _case_variant(root: Path, name: str) -> Path | None:
    """The folder ``root/name`` spelt in another case, where only that one exists (``mednli/`` for ``MedNLI``;
    ``bc5cdr/Chem`` for ``BC5CDR/chem``); None when there is none."""
    here = root
    for part in Path(name).parts:
        if (here / part).is_dir():
            here = here / part
            continue
        found = sorted(p for p in here.iterdir() if p.is_dir() and p.name.lower() == part.lower())
        if not found:
            return None
        here = found[0]
    return None if here == root / name else here


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


def space_tasks(space: SearchSpace) -> dict[str, TaskSpec]:
    """Each of the space's tasks (as named there) -> its loaded TaskSpec. Display names must be
    unique: results, reports and MLflow key a task by its name, and none may be a group's summary column;
    so must file stems: trial ids do."""
    specs = {task: load_task(task) for task in space.tasks}
    named: dict[str, str] = {}
    stems: dict[str, str] = {}
    groups = {spec.group: task for task, spec in specs.items()}
    for task, spec in specs.items():
        if (group := spec.name.strip().lower()) in groups:
            raise ConfigError(f"search space: task {task!r} is named {spec.name!r}, as the report's summary column "
                              f"of group {group!r} (task {groups[group]!r}); give it another `name:` in its YAML")
        if spec.name in named:
            raise ConfigError(f"search space: tasks {named[spec.name]!r} and {task!r} are both named "
                              f"{spec.name!r}; give one of them a distinct `name:` in its YAML")
        named[spec.name] = task
        if (other := stems.setdefault(task_key(task), task)) != task:
            raise ConfigError(f"search space: tasks {other!r} and {task!r} share the file stem {task_key(task)!r}, "
                              "which trial ids (and epochs: keys) name a task by: rename one file so the stems "
                              "differ")
    return specs


@dataclasses.dataclass(frozen=True)
class Variant:
    """A model fine-tuned on other data for some of the space's tasks (e.g. an augmented training
    split): its trials run on those tasks only, read each task's files from the directory given
    here, and take the training split whole (the directory already holds the chosen subset)."""

    name: str
    model_dir: str
    task_dirs: dict[str, str]  # task, as named in the space -> directory holding its split files


def build_trials(cfg: SweepConfig, space: SearchSpace, models: dict[str, Path],
                 variants: Sequence[Variant] = ()) -> list[TrialSpec]:
    """One TrialSpec per (model, task, learning rate, batch size, seed), and per fold for a
    cross-validated task, in a stable order; then the trials of each variant on its tasks. The
    trial id names the batch size only when the space has a batch-size axis (ids stay as they were)."""
    specs = space_tasks(space)
    entries = [(name, str(path), {task: (task_data_dir(cfg, task, specs[task]), space.max_train_examples)
                                  for task in space.tasks}) for name, path in models.items()]
    for v in variants:
        unknown = sorted(set(v.task_dirs) - set(space.tasks))
        if unknown:
            raise ConfigError(f"variant {v.name!r}: tasks {unknown} are not in the search space {list(space.tasks)}")
        entries.append((v.name, v.model_dir, {task: (str(Path(d).resolve()), 0) for task, d in v.task_dirs.items()}))
    threads = max(1, int(cfg.cpus_per_trial))
    # a task YAML given by path is read by workers in other directories; a task's name stays a name
    located = {task: str(Path(task).resolve()) if is_task_path(task) else task for task in space.tasks}
    trials, ids = [], {}
    for model_name, model_dir, task_inputs in entries:
        for task in space.tasks:
            if task not in task_inputs:
                continue
            data_dir, max_train = task_inputs[task]
            spec = specs[task]
            grid = epoch_grid(space, task, spec)
            folds = range(spec.cv_folds) if spec.cv_folds else (-1,)
            for lr, batch, reinit, seed, fold in itertools.product(space.learning_rates, space.batch_sizes,
                                                                   space.reinit_choices, space.seeds, folds):
                suffix = f"__f{fold}" if fold >= 0 else ""
                axis = (f"__b{batch}" if len(space.batch_sizes) > 1 else "") + (
                    f"__r{reinit}" if reinit and len(space.reinit_choices) > 1 else "")  # 0: a trial as without
                trial_id = _safe(f"{model_name}__{task_key(task)}__lr{lr:g}{axis}__s{seed}{suffix}")
                if trial_id in ids:  # e.g. model names that differ only in characters ids cannot hold
                    raise ConfigError(f"sweep: two trials would share the id {trial_id!r} (model {ids[trial_id]!r} "
                                      f"and {model_name!r}): give the models names that differ in letters, digits, "
                                      "'_', '.' or '-'")
                ids[trial_id] = model_name
                trials.append(TrialSpec(
                    trial_id=trial_id, model_name=model_name, model_dir=str(Path(model_dir).resolve()),
                    task=located[task], data_dir=data_dir,
                    learning_rate=float(lr), seed=int(seed), eval_epochs=grid, batch_size=batch,
                    max_seq_length=space.max_seq_length, max_train_examples=max_train,
                    max_eval_examples=space.max_eval_examples, weight_decay=space.weight_decay,
                    warmup_proportion=space.warmup_proportion, num_threads=threads, fold=fold, tune=space.tune,
                    adapter_reduction_factor=space.adapter_reduction_factor, precision=space.precision,
                    patience=space.early_stopping.patience, optimizer=space.optimizer,
                    reinit_layers=reinit))
    return trials


#: Task keys added after trials were first recorded, with their defaults: a task at the default keeps its key.
LATER_TASK_KEYS = {"chunk_words": 0, "subword_labels": "first"}


#: A trial record's field holding the sha256 of each task file the trial read (``task_data_identity``).
TASK_DATA = "task_data"


def task_files(trial: TrialSpec) -> list[Path]:
    """The split files a trial reads: train, dev and test, or a cross-validated or re-split task's one
    file (those that exist: a missing one is the trial's error to report)."""
    spec = dataclasses.replace(load_task(trial.task), dir="")
    return [p for p in (spec.split_path(Path(trial.data_dir), split) for split in spec.file_splits) if p.is_file()]


def task_data_identity(trial: TrialSpec) -> dict[str, str]:
    """{split file name: sha256} of the files ``trial`` reads, kept in its record: a record whose files
    were edited since (a task file rewritten in place) does not answer the trial."""
    return file_digests(task_files(trial))


#: The TrialSpec fields that say where a trial's inputs are, not what they hold (their contents are in the
#: fingerprint and the record's ``task_data``): a record made at other paths answers a trial all else equal.
LOCATION_FIELDS = ("model_dir", "data_dir", "task")


def trial_fingerprint(trial: TrialSpec, located_at: dict | None = None) -> str:
    """What makes a finished trial reusable: every setting except where it runs, plus what the
    task name and model path stand for -- the resolved task definition (an edited task YAML) and
    the model's identity (a model re-trained into the same directory) -- so neither is reused stale.
    The task's files are checked beside it (``task_data_identity``, kept in the record): a record
    made before it was kept keeps its fingerprint, so finished sweeps are not trained again.

    The paths are hashed too, as they always were (dropping them would retrain every finished sweep).
    ``located_at``: the ``LOCATION_FIELDS`` a record was fingerprinted at, taken in place of the trial's
    own, the contents still read from the trial's: a run directory copied or moved elsewhere, its model
    and task files unchanged, gives its records' fingerprints (``runner._finished``)."""
    data = {k: v for k, v in dataclasses.asdict(trial).items()
            if k not in ("num_threads", "device", "cache_dir") and not (k == "fold" and v == -1)
            and not (k in ("tune", "adapter_reduction_factor") and trial.tune == "full")
            and not (k == "precision" and v == "fp32")
            and not (k == "patience" and v == 0)
            and not (k == "reinit_layers" and v == 0)
            and not (k == "optimizer" and v == "adamw")}  # trials of the defaults keep the keys they had
    data["task_spec"] = {k: v for k, v in to_dict(load_task(trial.task)).items()  # where it is read from: data_dir
                         if k not in ("dir", "release_dir") and not (k in LATER_TASK_KEYS and v == LATER_TASK_KEYS[k])}
    data["model_identity"] = model_identity(trial.model_dir)
    if trial.max_eval_examples and METRICS.get(load_task(trial.task).metric).per_document:
        data["eval_sample"] = "documents"  # its capped dev and test were samples of sentences before (probe B1)
    if located_at:
        data.update({name: located_at[name] for name in LOCATION_FIELDS})
    return content_key(data)


def tracked_config(cfg: SweepConfig, space: SearchSpace) -> dict:
    """The resolved sweep as MLflow records it and as its ``sweep_fingerprint`` hashes it. Early
    stopping appears only where it is on, so a sweep without it keeps the fingerprint (and reopens
    the MLflow parent run) it had before the option existed; the export options never appear."""
    data = {"sweep": to_dict(cfg), "space": to_dict(space)}
    # what is exported, whether learning rates and models train bundled (up to float rounding) and the order trials
    # start in change no result: the same MLflow sweep. Seeds bundled draw other dropout masks, as another device
    # does (the same training, other numbers), and the device is no part of it either
    for key in ("export_best", "export_seed", "bundle_learning_rates", "bundle_models", "bundle_seeds", "order"):
        del data["sweep"][key]
    for part in data.values():
        if not part["early_stopping"]["patience"]:
            del part["early_stopping"]
    if data["space"]["optimizer"] == "adamw":  # the default keeps the fingerprint it had before the option
        del data["space"]["optimizer"]
    if not any(space.reinit_choices):  # as the optimizer's: options added later leave their default out
        del data["space"]["reinit_layers"]
    if data["sweep"]["reinit_layers"] is None:
        del data["sweep"]["reinit_layers"]
    return data
