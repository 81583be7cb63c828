"""Sweep configuration: which search space, where the task data is, how trials are placed."""
from __future__ import annotations

import dataclasses

from orchestrator.core.config import field
from orchestrator.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    search_space: str = field("blue", help="search space: a name under search_spaces/ (blue = seed 000's "
                                           "Table 4 grid, tiny = laptop) or a YAML path")
    tasks: tuple[str, ...] = field((), help="override the space's tasks (task file stems, display names "
                                            "or task YAML paths)")
    learning_rates: tuple[float, ...] = field((), help="override the space's learning rates")
    seeds: tuple[int, ...] = field((), help="override the space's seeds")
    epochs: dict[str, tuple[int, ...]] = field(default_factory=dict,
                                               help="override epoch grids per task (stem -> list)")
    max_train_examples: int | None = field(None, help="override: cap training examples per task (0 = all)")
    max_eval_examples: int | None = field(None, help="override: cap dev/test examples per task (0 = all)")
    precision: str = field("", help="override the space's fine-tuning precision: fp32, bf16 or fp16 (with a loss "
                                    "scaler)")
    tune: str = field("", help="override the space's tune: full (every weight) or adapters (adapters and head "
                               "only, seed 002)")
    data_dir: str = field("", help="BLUE data root with one directory per task (each task YAML's 'dir'); "
                                   "empty = the synthetic sample shipped in orchestrator/sample_data/blue")
    task_dirs: dict[str, str] = field(default_factory=dict,
                                      help="task (stem or display name) -> directory holding its split files")
    cpus_per_trial: float = field(1.0, help="CPUs reserved per trial (torch threads = max(1, int(this)))")
    gpus_per_trial: float = field(-1.0, help="GPUs per trial: -1 = 1 when the cluster has GPUs else 0; "
                                             "fractions (0.5) pack trials onto one GPU")
    max_concurrent_trials: int = field(0, help="0 = as many as resources allow")
    max_failures: int = field(2, help="run a trial again this many times when it fails (its worker died, a spot "
                                      "node was reclaimed); a trial restarts from its beginning")
    log_predictions: bool = field(True, help="log each trial's test predictions to MLflow as artifacts")

    def __post_init__(self):
        if self.cpus_per_trial <= 0:
            raise ConfigError("sweep.cpus_per_trial must be > 0 (a trial always needs some CPU)")
        if self.max_failures < 0:
            raise ConfigError("sweep.max_failures must be >= 0")
        if self.gpus_per_trial < 0 and self.gpus_per_trial != -1:
            raise ConfigError("sweep.gpus_per_trial must be -1 (auto) or >= 0")
        if any(lr <= 0 for lr in self.learning_rates):
            raise ConfigError("sweep.learning_rates must be positive")
        for task, grid in self.epochs.items():
            if not grid or any(e < 1 for e in grid):
                raise ConfigError(f"sweep.epochs.{task}: need positive epoch counts, got {list(grid)}")
