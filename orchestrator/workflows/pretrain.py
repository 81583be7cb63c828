"""What ``python jobs/pretrain.py`` runs: find the corpus stage's outputs, then pretrain them through the
runner (``orchestrator.workflows.runner.pretrain_stage``)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.artifacts import read_instance_info
from orchestrator.core.config import check_set, field
from orchestrator.core.console import LOG_PATH
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.runtime import alive_nodes, cluster_address, ray_session
from orchestrator.pretrain.config import PretrainConfig
from orchestrator.pretrain.nodes import driver_resources
from orchestrator.pretrain.plan import plan_pretrain
from orchestrator.pretrain.trainer import PretrainResult, check_init_from, check_output, configured_uri, special_ids
from orchestrator.track import TrackingConfig
from orchestrator.track.caller import mlflow_state_kept
from orchestrator.workflows.runner import pretrain_stage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PretrainJobConfig:
    instances_dir: str = field("", help="directory holding the instances stage's len<L>/ subdirectories "
                                        "(e.g. runs/<name>/instances)")
    tokenizer_dir: str = field("", help="HF tokenizer directory with vocab.txt (e.g. runs/<name>/vocab)")
    out_dir: str = field("runs/pretrain/pretrain", help="where checkpoints/, final/ and manifest.json go")
    run_dir: str = field("", help="run directory for the default MLflow store (empty = parent of out_dir)")
    ray_address: str = field("", help="Ray cluster address; empty = RAY_ADDRESS / cluster head / embedded local")
    tracking: TrackingConfig = field(default_factory=TrackingConfig, help="MLflow tracking")
    pretrain: PretrainConfig = field(default_factory=PretrainConfig, help="the pretraining stage")

    def __post_init__(self):
        check_set(out_dir=self.out_dir)

    def check_named(self) -> None:
        """The corpus stage's outputs are named: checked by a run and a dry run, not when the config is made,
        so ``--print-config`` shows a preset that leaves them to the user (seed000)."""
        if not self.instances_dir or not self.tokenizer_dir:
            raise ConfigError("instances_dir and tokenizer_dir are required (outputs of the corpus stage)")


def find_instances(instances_dir: Path) -> dict[int, Path]:
    """max_seq_length -> directory, for every finished instances directory under ``instances_dir``."""
    root = Path(instances_dir)
    if not root.is_dir():
        raise InputError(root, "instances directory not found", expected="the corpus stage's instances/")
    found = {}
    for sub in sorted(p for p in root.iterdir() if (p / "manifest.json").is_file()):
        found[read_instance_info(sub).max_seq_length] = sub
    if (root / "manifest.json").is_file():
        found[read_instance_info(root).max_seq_length] = root
    if not found:
        raise InputError(root, "no finished instances directory", expected="len<L>/ with manifest.json")
    return found


@mlflow_state_kept()  # a library call leaves the caller's MLflow session as it was
def run(cfg: PretrainJobConfig) -> PretrainResult:
    """``python jobs/pretrain.py``: pretrain (or resume, or reuse) into ``out_dir`` on the instances and tokenizer
    given; returns the ``PretrainResult`` (the exported model's directory, the loss history, how each phase ended)."""
    cfg.check_named()
    out_dir = Path(cfg.out_dir).resolve()
    run_dir = Path(cfg.run_dir).resolve() if cfg.run_dir else out_dir.parent
    check_output(out_dir)  # a folder the project did not write: refused before Ray, and before logs/job.log
    # the inputs too, before Ray: a missing one, a tokenizer that does not load (pretraining reads it again),
    # a model to continue that the instances do not fit (a vocabulary, positions, segment B's token type)
    instances = find_instances(Path(cfg.instances_dir))
    special = special_ids(Path(cfg.tokenizer_dir))
    check_init_from(cfg.pretrain, special.vocab_size, Path(cfg.tokenizer_dir))
    # Ray's, Train's and the workers' own lines go to the run's log file, the terminal keeping the job's
    # progress (as jobs/blue_sweep.py does); --verbose keeps everything on the terminal
    with ray_session(address=cfg.ray_address or None, log_file=run_dir / LOG_PATH) as info:
        if info["log_file"]:
            log.info("Ray's, Train's and the workers' own output: %s", info["log_file"])
        return pretrain_stage(cfg.pretrain, instances, Path(cfg.tokenizer_dir), out_dir, cfg.tracking, run_dir)


def plan(cfg: PretrainJobConfig) -> str:
    """Dry run. Attached to a cluster (``ray_address``, RAY_ADDRESS, or on a head), its nodes are counted:
    a multi-node run with the driver's own paths or MLflow file is refused here, not when it starts."""
    cfg.check_named()
    out_dir = Path(cfg.out_dir).resolve()
    check_output(out_dir)
    instances = find_instances(Path(cfg.instances_dir))
    run_dir = Path(cfg.run_dir).resolve() if cfg.run_dir else out_dir.parent
    nodes = driver = None
    if cluster_address(cfg.ray_address or None) is not None:
        with ray_session(address=cfg.ray_address or None):
            nodes = alive_nodes()
            driver = driver_resources(nodes)
    return f"output: {out_dir}\n" + plan_pretrain(cfg.pretrain, instances, Path(cfg.tokenizer_dir),
                                                   tracking_uri=configured_uri(cfg.tracking, run_dir),
                                                   nodes=nodes, driver_node=driver, out_dir=out_dir)
