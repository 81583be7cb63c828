"""When a pretraining phase stops: at its step cap, or earlier when a rule of ``pretrain.stop`` fires.

    stopper = Stopper(cfg.stop)                          # afresh at the start of each phase
    window = stopper.add(mlm_loss, correct, count)       # every step, with values summed over the workers
    if window and window["stopped_by"]: ...              # the phase ends at this step
    state["stop"] = stopper.state_dict()                 # into the checkpoint; Stopper.from_state on resume

The rules look at windows of ``stop.window`` steps. At a window's end its mean MLM loss and its MLM
accuracy (masked positions predicted right / masked positions) decide: the accuracy rule fires when
the window reaches ``stop.mlm_accuracy``; the plateau rule when ``stop.plateau_patience`` windows in a
row have not lowered the phase's best window loss by the relative ``stop.plateau_min_delta`` (as
``ReduceLROnPlateau``'s ``threshold_mode="rel"``). The values come in summed over all workers, so
every rank holds the same state and decides the same at the same step. Pure: no torch, no Ray.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from orchestrator.pretrain.config import StopConfig

#: What ended a phase, as the manifest and MLflow record it.
STEPS, PLATEAU, MLM_ACCURACY = "steps", "plateau", "mlm_accuracy"


@dataclasses.dataclass
class Stopper:
    rule: StopConfig
    steps: int = 0  # steps of the current window so far
    loss_sum: float = 0.0  # their worker-mean MLM losses, summed
    correct: float = 0.0  # masked positions predicted right, all workers
    count: float = 0.0  # masked positions, all workers
    best: float = math.inf  # the phase's lowest window loss
    stale: int = 0  # windows in a row that did not lower ``best`` by plateau_min_delta

    def add(self, mlm_loss: float, correct: float, count: float) -> dict[str, Any] | None:
        """One step: its MLM loss (the mean over workers) and all workers' correct / masked counts.
        Returns the window this step ends, ``{"mlm_loss", "mlm_accuracy", "stopped_by"}`` with
        ``stopped_by`` MLM_ACCURACY, PLATEAU or None; None when no window ends (or no rule is set)."""
        if not self.rule.enabled:
            return None
        self.steps += 1
        self.loss_sum += mlm_loss
        self.correct += correct
        self.count += count
        if self.steps < self.rule.window:
            return None
        loss, accuracy = self.loss_sum / self.steps, self.correct / max(self.count, 1.0)
        self.steps, self.loss_sum, self.correct, self.count = 0, 0.0, 0.0, 0.0
        if loss < self.best * (1.0 - self.rule.plateau_min_delta):  # a NaN window never improves
            self.best, self.stale = loss, 0
        else:
            self.stale += 1
        stopped_by = None
        if self.rule.mlm_accuracy and accuracy >= self.rule.mlm_accuracy:
            stopped_by = MLM_ACCURACY
        elif self.rule.plateau_patience and self.stale >= self.rule.plateau_patience:
            stopped_by = PLATEAU
        return {"mlm_loss": loss, "mlm_accuracy": accuracy, "stopped_by": stopped_by}

    def state_dict(self) -> dict[str, Any]:
        """Plain values for a checkpoint's training state: a resumed phase decides as the uninterrupted would."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "rule"}

    @classmethod
    def from_state(cls, rule: StopConfig, state: dict[str, Any] | None) -> Stopper:
        return cls(rule, **(state or {}))
