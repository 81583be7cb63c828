"""A run's result and the summary the main job prints at its end: where the run, its reports and its
full log are, how each arm fared, what each stage cost, and the command that opens MLflow on it."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from orchestrator.core.cost import StageCost, cost_lines
from orchestrator.track import ui_address, ui_command
from orchestrator.track.experiments import ui_url

#: ChainResult.report's key for an experiment's comparison page (dashboards/, written by jobs/blue_sweep.py).
PAGE = "page"
#: ChainResult.report's key for an experiment's retrieval table (seed 002, Table 6).
RETRIEVAL = "retrieval"


@dataclasses.dataclass
class ChainResult:
    run_dir: Path
    report: dict[str, Path]
    results: dict
    tracking_uri: str
    pretrain_loss: tuple[float, float] | None = None
    arms: dict[str, dict] = dataclasses.field(default_factory=dict)  # an experiment's arms: status, error
    mlflow_run_id: str = ""  # an experiment's MLflow parent run ("" without tracking)
    experiment_id: str = ""  # the MLflow experiment the runs are in ("" without tracking)
    costs: dict[str, list[StageCost]] = dataclasses.field(default_factory=dict)  # per arm (or model): stage costs
    log_file: Path | None = None  # where Ray's, Tune's and the workers' output went (None: the terminal)
    wall_s: float | None = None  # how long this run took

    @property
    def exit_code(self) -> int:
        """3 when an experiment's arm failed (the others finished and are reported), else 0."""
        return 3 if any(arm["status"] == "failed" for arm in self.arms.values()) else 0

    def mlflow_ui_command(self) -> str:
        return ui_command(self.tracking_uri)

    def summary(self) -> str:
        lines = ["", "=" * 72, f"run directory : {self.run_dir}"]
        for name, arm in self.arms.items():
            lines.append(f"arm {name:<10}: {arm['status']}" + (f" ({arm['error']})" if arm.get("error") else ""))
        if self.pretrain_loss:
            lines.append(f"pretraining   : loss {self.pretrain_loss[0]:.3f} -> {self.pretrain_loss[1]:.3f}")
        for kind in ("html", "md", "png", PAGE, RETRIEVAL):
            if kind in self.report:
                lines.append(f"report ({kind:4}): {self.report[kind]}")
        lines += cost_lines(self.costs, self.wall_s)
        if self.log_file:
            lines.append(f"full log      : {self.log_file} (Ray, Tune and worker output; --verbose shows it here)")
        if self.tracking_uri:
            lines.append("MLflow UI     : " + self.mlflow_ui_command())
            address = ui_address(self.tracking_uri)
            url = ui_url(self.experiment_id, address) if self.experiment_id else address
            lines.append(f"                then open {url}")
        else:
            lines.append("MLflow        : off (tracking.enabled=false)")
        lines.append("=" * 72)
        return "\n".join(lines)
