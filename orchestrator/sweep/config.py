"""Sweep configuration: which search space, where the task data is, how trials are placed."""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import ClassVar, Literal, get_args

from orchestrator.core.config import check_number, check_seeds, field, first_repeat, to_dict
from orchestrator.core.errors import ConfigError
from orchestrator.core.registry import suggest

#: A search space's fine-tuning precisions and ways to tune (``SearchSpace``'s fields; the overrides check
#: theirs against the same choices).
Precision = Literal["fp32", "bf16", "fp16"]
Tune = Literal["full", "adapters"]


@dataclasses.dataclass(frozen=True)
class EarlyStopping:
    """Early stopping on the dev metric (seed 002: up to 100 epochs, patience 25). When on it replaces
    the epochs axis: each (learning rate, seed) trial picks its own epoch on dev."""

    patience: int = field(0, help="0 = off (the epoch grid is used). N > 0: every trial evaluates dev after each "
                                   "epoch, keeps the weights of its best dev epoch, stops after N epochs without a "
                                   "better dev score (or at max_epochs) and reports test at those best weights; "
                                   "replaces the epochs axis (learning rates x seeds remain)")
    max_epochs: int = field(100, help="with patience > 0: the most epochs a trial trains, for every task (the "
                                      "linear LR schedule spans this many epochs)")

    def __post_init__(self):
        if self.patience < 0:
            raise ConfigError(f"early_stopping.patience must be >= 0 (0 = off), got {self.patience}")
        if self.max_epochs < 1:
            raise ConfigError(f"early_stopping.max_epochs must be >= 1, got {self.max_epochs}")

    @property
    def on(self) -> bool:
        return self.patience > 0


def listed(value: int | tuple[int, ...]) -> int | list[int]:
    """A setting of one value or several as a user writes it (a list, not a tuple), for messages."""
    return value if isinstance(value, int) else list(value)


def check_reinit_choices(key: str, value: int | tuple[int, ...]) -> None:
    """``reinit_layers`` as ``key`` gives it: each value >= 0, none twice, a list not empty."""
    values = (value,) if isinstance(value, int) else tuple(value)
    if not values or min(values) < 0:
        raise ConfigError(f"{key} {listed(value)} must be >= 0 (0 = none), or a list of such counts")
    if (again := first_repeat(values)) is not None:
        raise ConfigError(f"{key} {list(values)} repeats {again}")


@dataclasses.dataclass(frozen=True)
class SpaceOverrides:
    """What a sweep config changes in its search space (``sweep.tasks``, ``sweep.learning_rates``, ...: the
    keys users write under ``sweep:``). Unset (empty / None) leaves the space's own value; ``apply`` is
    the one place that says what each override does, ``SweepConfig.space`` the space they resolve to."""

    tasks: tuple[str, ...] = field((), help="override the space's tasks (task file stems, display names "
                                            "or task YAML paths)")
    learning_rates: tuple[float, ...] = field((), help="override the space's learning rates")
    seeds: tuple[int, ...] = field((), help="override the space's seeds")
    epochs: dict[str, tuple[int, ...]] = field(default_factory=dict,
                                               help="override epoch grids per task (stem or display name -> list; "
                                                    "it replaces the space's grid for that task); turns off a "
                                                    "space's early stopping")
    early_stopping: EarlyStopping = field(default_factory=EarlyStopping,
                                          help="override the space's early stopping when patience > 0 (it then "
                                               "replaces the space's epoch grids; not together with sweep.epochs)")
    max_train_examples: int | None = field(None, help="override: cap training examples per task (0 = all)")
    max_eval_examples: int | None = field(None, help="override: cap dev/test examples per task (0 = all; a task "
                                                     "scored per document, as HoC, by whole documents, at least "
                                                     "that many examples)")
    precision: str = field("", help="override the space's fine-tuning precision: fp32, bf16 or fp16 (with a loss "
                                    "scaler)")
    tune: str = field("", help="override the space's tune: full (every weight) or adapters (adapters and head "
                               "only, seed 002)")
    reinit_layers: int | tuple[int, ...] | None = field(
        None, help="override the space's reinit_layers: the encoder's top N layers re-initialised before "
                   "fine-tuning (0 = none; a list, e.g. [0,1,2], is an axis selected on dev)")

    #: The config section users write these keys under, as errors name them (``sweep.epochs``); a job
    #: that holds a sweep under another name says so with a subclass (the entity cycle's ``extractor``).
    KEY: ClassVar[str] = "sweep"

    def __post_init__(self):
        for lr in self.learning_rates:
            check_number(f"{self.KEY}.learning_rates: each", lr, low=0, low_open=True)
        check_seeds(f"{self.KEY}.seeds", self.seeds)
        for axis in ("tasks", "learning_rates"):
            values = list(getattr(self, axis))
            if (again := first_repeat(values)) is not None:
                raise ConfigError(f"{self.KEY}.{axis}: {values} repeats {again}")
        for name, valid in (("precision", get_args(Precision)), ("tune", get_args(Tune))):
            value = getattr(self, name)
            if value and value not in valid:  # checked here, the error names the key the user wrote
                raise ConfigError(f"{self.KEY}.{name}: {value!r} is not one of {list(valid)}"
                                  f"{suggest(value, valid)}")
        for name in ("max_train_examples", "max_eval_examples"):
            if (getattr(self, name) or 0) < 0:
                raise ConfigError(f"{self.KEY}.{name} must be >= 0 (0 = all)")
        if self.reinit_layers is not None:
            check_reinit_choices(f"{self.KEY}.reinit_layers", self.reinit_layers)
        for task, grid in self.epochs.items():
            if not grid or any(e < 1 for e in grid):
                raise ConfigError(f"{self.KEY}.epochs.{task}: need positive epoch counts, got {list(grid)}")
            if first_repeat(grid) is not None:
                raise ConfigError(f"{self.KEY}.epochs.{task}: {list(grid)} repeats an epoch count")
        if self.early_stopping.on and self.epochs:
            raise ConfigError(f"{self.KEY}.epochs {sorted(self.epochs)} and {self.KEY}.early_stopping.patience "
                              f"{self.early_stopping.patience}: early stopping replaces the epochs axis, set one "
                              f"of them ({self.KEY}.epochs={{}} or {self.KEY}.early_stopping.patience=0)")

    def apply(self, data: dict) -> dict:
        """The search space's YAML ``data`` with these overrides applied (a new dict)."""
        data = dict(data)
        for key in ("tasks", "learning_rates", "seeds"):
            if getattr(self, key):
                data[key] = list(getattr(self, key))
        if self.epochs:  # an epoch grid given for this sweep turns the space's early stopping off
            data["epochs"] = {**data.get("epochs", {}), **{k: list(v) for k, v in self.epochs.items()}}
            data.pop("early_stopping", None)
        if self.early_stopping.on:  # and early stopping given for it drops the space's epoch grids
            data["early_stopping"] = to_dict(self.early_stopping)
            data.pop("epochs", None)
        for key in ("tune", "precision"):
            if getattr(self, key):
                data[key] = getattr(self, key)
        for key in ("max_train_examples", "max_eval_examples", "reinit_layers"):
            if getattr(self, key) is not None:
                value = getattr(self, key)
                data[key] = list(value) if isinstance(value, tuple) else value
        return data


@dataclasses.dataclass(frozen=True)
class SweepConfig(SpaceOverrides):
    search_space: str = field("blue", help="search space: a name under search_spaces/ (blue = seed 000's "
                                           "Table 4 grid, tiny = laptop) or a YAML path")
    data_dir: str = field("", help="BLUE data root with one directory per task (each task YAML's 'dir'); "
                                   "empty = the synthetic sample shipped in orchestrator/sample_data/blue")
    task_dirs: dict[str, str] = field(default_factory=dict,
                                      help="task (stem or display name) -> directory holding its split files")
    cpus_per_trial: float = field(1.0, help="CPUs reserved per trial (torch threads = max(1, int(this)))")
    gpus_per_trial: float = field(-1.0, help="GPUs per trial: -1 = 1 when the cluster has GPUs or its autoscaler "
                                             "can start GPU nodes (or ORCH_CLUSTER_GPUS > 0), else 0; "
                                             "fractions (0.5) pack trials onto one GPU")
    max_concurrent_trials: int = field(0, help="0 = as many as resources allow")
    bundle_learning_rates: Literal["auto", "on", "off"] = field(
        "auto", help="train the trials that differ only in their learning rate as one batched computation (one "
                     "Ray trial holding one trial's resources; far fewer GPU kernel launches per trial-step; each "
                     "trial's record as it would be alone, up to float rounding): auto = on for GPU trials (on "
                     "CPUs a step is arithmetic, not launches: the laptop sweep takes 59.0 s unbundled, 65.5-68.7 "
                     "s bundled on 2 CPUs); fp16 trials always train alone")
    bundle_models: bool = field(True, help="where learning rates are bundled, bundle the trials of models with "
                                           "the same architecture and tokenizer too (e.g. an arm and its untrained "
                                           "floor): one Ray trial for their learning rates together, each row "
                                           "starting from its own model's weights (full fine-tuning only)")
    bundle_seeds: bool = field(False, help="where learning rates are bundled, bundle a setting's seeds too (one Ray "
                                           "trial for seeds x learning rates [x models]: a third of the Ray trials "
                                           "for 3 seeds). Each row keeps its seed's data order and head "
                                           "initialisation but draws its dropout masks from the bundle's stream, "
                                           "not its seed's: the same training as alone, not the same numbers")
    order: Literal["longest_first", "grid"] = field(
        "longest_first", help="the order Ray trials start in: longest_first = by their work estimated from "
                              "their tasks' splits and epochs (the longest trials do not run last, on a few "
                              "slots, while the others idle); grid = the grid's order (model, task, learning "
                              "rate, seed). Results do not depend on it")
    max_failures: int = field(2, help="run a trial again this many times when it fails (its worker died, a spot "
                                      "node was reclaimed); a trial restarts from its beginning")
    log_predictions: bool = field(True, help="log each trial's test predictions to MLflow as artifacts")
    export_best: tuple[str, ...] = field((), help="tasks (stems or display names; [all] = every task) whose "
                                                  "selected fine-tuned model is exported, per model, as a Hugging "
                                                  "Face directory under <sweep>/exports/ (the selected run is "
                                                  "trained once more after selection; listed in exports.json)")
    export_seed: Literal["best_dev", "median_dev"] = field(
        "best_dev", help="which run of the selected setting is exported: the seed (and fold) with the best dev "
                         "score, or the median one by dev (the lower median: the better of two middle runs)")

    def __post_init__(self):
        check_number(f"{self.KEY}.cpus_per_trial", self.cpus_per_trial, low=0, low_open=True)
        if self.max_failures < 0 or self.max_concurrent_trials < 0:
            raise ConfigError(f"{self.KEY}.max_failures and {self.KEY}.max_concurrent_trials must be >= 0")
        if self.gpus_per_trial != -1:
            check_number(f"{self.KEY}.gpus_per_trial (-1 = auto)", self.gpus_per_trial, low=0)
        super().__post_init__()

    def as_read(self) -> dict:
        """The config as its manifest records it: ``data_dir`` and ``task_dirs`` as the absolute paths the sweep read
        (``task_data_dir``); one typed relative ("../var/real mix") named other data from any other working
        directory (probe B6)."""
        return {**to_dict(self), "data_dir": str(Path(self.data_dir).resolve()) if self.data_dir else "",
                "task_dirs": {task: str(Path(path).resolve()) for task, path in self.task_dirs.items()}}

    @functools.cached_property
    def space(self):  # -> orchestrator.sweep.space.SearchSpace
        """The search space this sweep runs: its YAML read and these overrides applied, once per config
        (``resolve_space``); every stage of a job reads this one object."""
        from orchestrator.sweep.space import resolve_space  # the space module builds on this one

        return resolve_space(self)
