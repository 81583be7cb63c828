"""The pretraining stage: instances + tokenizer -> a BERT trained on Ray Train.

    result = pretrain(cfg, {128: runs/x/instances/len128}, runs/x/vocab, runs/x/pretrain,
                      TrackingConfig(), runs/x)

Output (``out_dir``):
    checkpoints/ckpt-<step>/   Ray Train's persisted checkpoints (HF dir + training state), last K kept
    checkpoints/run.json       the run the checkpoints belong to (its key and training settings)
    final/                     the final model: AutoModelForPreTraining / AutoTokenizer load it; its
                               manifest holds the sha256 of every model file (its content identity)
    history.json               one record per logged step
    manifest.json              config, input hashes, counts (first/last loss, params), seed, key, and
                               per phase what stopped it (``phases``: steps, plateau or mlm_accuracy, at
                               which step), also on the MLflow run (``schema.stopped_by_tag``)

A run is its training settings plus its inputs (``pretrain_key``). Re-running the same run resumes
from its latest complete checkpoint, or reuses a finished output (also with ``model.init_from``'s files moved since:
``relocated_pretrain_key``, the run keeping the key it started with); checkpoints of another run (a
changed learning rate, seed, corpus ...) are refused with what changed, or discarded with
``on_mismatch: restart``. A worker that dies mid-run is restarted from the latest checkpoint
(``max_failures``). Everything that can be checked before workers start (vocabulary, architecture,
batch arithmetic, data size) is checked here, in the driver, so a mistake fails in seconds.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

from orchestrator.core.artifacts import INSTANCE_COLUMNS, InstanceInfo, check_model, read_instance_info
from orchestrator.core.cost import COST_FIELD, device_text, duration, measured
from orchestrator.core.errors import ConfigError, InputError, OrchestratorError, keep_sigint_handler, worker_failure
from orchestrator.core.manifest import (
    MANIFEST,
    atomic_dir,
    atomic_write_json,
    check_replaceable,
    file_sha256,
    read_manifest,
    write_manifest,
)
from orchestrator.core.reuse import (
    KEY_FIELD,
    MODEL_FILES_FIELD,
    content_key,
    made_under,
    model_file_record,
    output_key,
    output_lock,
    reusable,
)
from orchestrator.core.runtime import alive_nodes, check_fits, generators_kept, ray_session
from orchestrator.instances.config import Specials
from orchestrator.pretrain.checkpoint import (
    CHECKPOINTS,
    HF_FILES,
    RUN_RECORD,
    STORAGE_RECORD,
    TOKENIZER_FILES,
    check_tokenizer_files,
    checkpoints_dir,
    latest_checkpoint,
    other_run,
    other_run_error,
    save_hf,
)
from orchestrator.pretrain.config import (
    PretrainConfig,
    batch_plan,
    check_init_positions,
    input_keys,
    passes_text,
    read_hf_config,
    relocated_pretrain_key,
    run_params,
    started_as,
)
from orchestrator.pretrain.data import (
    check_instance_files,
    check_vocab_matches,
    instance_files,
    masking_rule,
    ordered_ingest,
    resolve_ingest,
)
from orchestrator.pretrain.nodes import (
    check_multi_node,
    driver_resources,
    is_uri,
    tracking_problem,
)
from orchestrator.pretrain.stopping import STEPS
from orchestrator.track import schema as S
from orchestrator.track.caller import stage_call
from orchestrator.track.runs import (
    PENDING,
    RUN_MARKER,
    RankZeroLogger,
    end_stage_run,
    ended_status,
    log_recorded_run,
    recorded_run_unfinished,
    set_run_tags,
    start_stage_run,
)
from orchestrator.vocab.quality import check_tokenizer_dir_files

log = logging.getLogger(__name__)
#: How often Ray Train's controller polls its workers (Ray's default: 2 s). A finished run is noticed up
#: to that long after its workers return, and a dead worker as late: 0.5 s took a 2-worker smoke
#: pretraining's end (last step to fit() returning) from 4.7 s to 1.8 s on 2 cores. A user's own
#: RAY_TRAIN_HEALTH_CHECK_INTERVAL_S wins.
HEALTH_CHECK_ENV, HEALTH_CHECK_INTERVAL_S = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5"


@dataclasses.dataclass
class PretrainResult:
    model_dir: Path
    history: list[dict]
    first_loss: float
    last_loss: float
    checkpoints_dir: Path
    params: dict[str, int]
    #: per phase {"phase", "stopped_by" (steps, plateau, mlm_accuracy), "step" (global), "phase_step", "max_steps"}
    phases: list[dict] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        early = "".join(f"; {p['phase']} stopped by {p['stopped_by']} at step {p['phase_step']} of {p['max_steps']}"
                        for p in self.phases if p["stopped_by"] != STEPS)
        return (f"pretrain: {len(self.history)} logged steps, loss {self.first_loss:.4f} -> {self.last_loss:.4f}, "
                f"trainable params {self.params.get('trainable', 0):,}{early}; model: {self.model_dir}")


def special_ids(tokenizer_dir: Path) -> Specials:
    """Token ids collation and masking need, read from the tokenizer directory (AutoTokenizer)."""
    from transformers import AutoTokenizer  # heavy: transformers

    if not Path(tokenizer_dir).is_dir():  # else transformers takes the path for a model hub name
        raise InputError(tokenizer_dir, "no such directory" if not Path(tokenizer_dir).exists() else "not a directory",
                         expected="a tokenizer directory, e.g. the vocab stage's output")
    try:
        tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        # no tokenizer files at all: say which are expected (transformers advises installing sentencepiece)
        check_tokenizer_dir_files(tokenizer_dir)
        raise InputError(tokenizer_dir, f"cannot load tokenizer: {exc}", expected="an HF tokenizer directory") \
            from None
    missing = [name for name in ("cls", "sep", "mask", "pad") if getattr(tok, f"{name}_token_id") is None]
    if missing:
        raise InputError(tokenizer_dir, f"tokenizer has no {', '.join(missing)} token",
                         expected="a BERT WordPiece vocab")
    return Specials.from_tokenizer(tok)


DATA_CPU_RESERVE = 1.0


def worker_cpus(cfg: PretrainConfig, cluster_cpus: float, data_reads: bool = True) -> float:
    """CPUs to reserve per Train worker, leaving ``DATA_CPU_RESERVE`` for Ray Data's read tasks.

    Workers that take every CPU starve the streaming reads that feed them and the run hangs
    (2 workers x 1 CPU on a 2-core laptop); there, each worker's share is shrunk to fit. Without
    ``data_reads`` (every phase read by the workers themselves: ``pretrain.ingest``) nothing is left over.
    """
    wanted = cfg.cpus_per_worker * cfg.num_workers
    if cfg.use_gpu or cluster_cpus <= 0 or wanted + (DATA_CPU_RESERVE if data_reads else 0.0) <= cluster_cpus:
        return cfg.cpus_per_worker
    share = (cluster_cpus - DATA_CPU_RESERVE) / cfg.num_workers
    if share <= 0.05:
        raise ConfigError(f"num_workers {cfg.num_workers} do not fit on {cluster_cpus:g} CPUs")
    log.info("pretrain: %d workers x %g CPUs would starve the data reads on %g CPUs; using %.2f CPUs per worker",
             cfg.num_workers, cfg.cpus_per_worker, cluster_cpus, share)
    return round(share, 2)


def phase_inputs(cfg: PretrainConfig, instances: dict[int, Path]) -> dict[str, InstanceInfo]:
    out = {}
    for name, phase in cfg.active_phases():
        path = instances.get(phase.max_seq_length)
        if path is None:
            raise ConfigError(f"{name}.max_seq_length is {phase.max_seq_length} but instances exist only for "
                              f"lengths {sorted(instances)}")
        info = read_instance_info(Path(path))
        check_instance_files(info)
        if info.max_seq_length != phase.max_seq_length:
            raise InputError(Path(path) / "manifest.json", f"max_seq_length is {info.max_seq_length}",
                             expected=f"{phase.max_seq_length} for {name}")
        plan = batch_plan(phase.global_batch_size, cfg.num_workers, phase.device_batch_size, where=name)
        if info.instances is not None and info.instances < plan.workers * plan.device_batch:
            raise InputError(Path(path), f"only {info.instances} instances",
                             expected=f"at least num_workers x device_batch_size = "
                                      f"{plan.workers * plan.device_batch} for {name}")
        out[name] = info
    return out


def phase_passes(cfg: PretrainConfig, infos: dict[str, InstanceInfo]) -> dict[str, str]:
    """Each phase's passes over its instances in words (``passes_text``), for its line when it starts."""
    return {name: passes_text(phase.steps, phase.global_batch_size, infos[name].instances, infos[name].masking)
            for name, phase in cfg.active_phases()}


def _check_existing_checkpoint(cfg: PretrainConfig, ckpt_dir: Path, vocab_size: int, pad: int) -> Path | None:
    """A checkpoint already in ``ckpt_dir`` must be of the architecture this config builds."""
    from orchestrator.pretrain.model import bert_config, check_same_architecture  # heavy: torch, transformers

    latest = latest_checkpoint(ckpt_dir)
    if latest is None:
        return None
    if cfg.model.init_from:
        expected = read_hf_config(Path(cfg.model.init_from))
        expected = {**expected, "vocab_size": vocab_size}
    else:
        expected = bert_config(cfg.model, vocab_size, pad).to_dict()
    check_same_architecture(expected, latest)
    return latest


def check_init_from(cfg: PretrainConfig, vocab_size: int, tokenizer_dir: Path | None = None) -> None:
    """A model to continue must be a BERT with this tokenizer's vocabulary (size, and the very tokens
    when both directories have a vocab.txt), unless ``allow_vocab_resize``."""
    if not cfg.model.init_from:
        return
    # weights there, not only a config; the tokenizer is tokenizer_dir's (the vocabularies are compared below)
    hf = check_model("pretrain.model.init_from", cfg.model.init_from, tokenizer=False,
                     segment_b="pretraining's instances")
    check_init_positions(cfg)
    if hf["model_type"] != "bert":
        raise InputError(Path(cfg.model.init_from) / "config.json",
                         f"model_type is {hf['model_type']!r}; only BERT models can be continued",
                         expected="model_type 'bert'")
    if hf["vocab_size"] != vocab_size and not cfg.model.allow_vocab_resize:
        raise ConfigError(f"model.init_from {cfg.model.init_from} has vocab_size {hf['vocab_size']} but the "
                          f"tokenizer has {vocab_size}; use that model's own tokenizer (vocab.from_model), or set "
                          "model.allow_vocab_resize=true to resize the embeddings")
    if tokenizer_dir is None or cfg.model.allow_vocab_resize:
        return
    theirs, ours = Path(cfg.model.init_from) / "vocab.txt", Path(tokenizer_dir) / "vocab.txt"
    # the same size but other tokens: every id would be read as another token
    if not (theirs.is_file() and ours.is_file()):
        return
    theirs_sha, ours_sha = file_sha256(theirs), file_sha256(ours)
    if theirs_sha != ours_sha:
        raise ConfigError(f"model.init_from {cfg.model.init_from} was trained with another vocabulary than "
                          f"{ours} (vocab.txt sha256 {theirs_sha[:12]} vs {ours_sha[:12]}); "
                          f"set vocab.from_model={cfg.model.init_from} to build the instances with its own "
                          "tokenizer, or model.allow_vocab_resize=true to accept the mismatch")


def check_output(out_dir: Path) -> None:
    """Raise unless ``out_dir`` may take this stage's output: absent, empty, an earlier pretraining
    output (``check_replaceable``), or a run of ours being resumed (its checkpoints' run record, or the
    record of where they are). jobs/pretrain.py and its dry run call it before Ray starts or anything is
    written; training calls it again."""
    out_dir = Path(out_dir)
    if not ((out_dir / CHECKPOINTS / RUN_RECORD).is_file() or (out_dir / STORAGE_RECORD).is_file()):
        check_replaceable(out_dir, "pretrain")


def _check_run(cfg: PretrainConfig, key: str, ckpt_dir: Path, out_dir: Path) -> None:
    """Checkpoints in ``ckpt_dir`` must come from this very run (same key); else refuse, saying what
    changed, or (``on_mismatch: restart``) discard them, and the record of that run's MLflow run: the new
    training was logged into the old run, at the same steps, under the old params (probe L4). Records the run
    before training starts."""
    if what := other_run(ckpt_dir, key, cfg.training_fields()):
        if cfg.on_mismatch == "refuse":
            raise other_run_error(ckpt_dir, what)
        log.warning("pretrain: discarding the checkpoints of another run in %s (%s)", ckpt_dir, what)
        shutil.rmtree(ckpt_dir)
        for name in (RUN_MARKER, PENDING):
            (out_dir / name).unlink(missing_ok=True)
    record = ckpt_dir / RUN_RECORD
    if not record.is_file() or json.loads(record.read_text()).get("key") != key:
        atomic_write_json(record, {"key": key, "config": cfg.training_fields()})


def _reused(out_dir: Path) -> PretrainResult:
    manifest = read_manifest(out_dir)
    history = json.loads((out_dir / "history.json").read_text()) if (out_dir / "history.json").is_file() else []
    counts = manifest.get("counts", {})
    checkpoints = checkpoints_dir(out_dir)  # with pretrain.storage_path: there
    log.info("pretrain: output complete for this config and inputs, reused (%s)%s", out_dir / "final",
             made_under(manifest))  # an upgrade keeps it (no key holds a version), said
    return PretrainResult(model_dir=out_dir / "final", history=history, first_loss=counts.get("first_loss", math.nan),
                          last_loss=counts.get("last_loss", math.nan), checkpoints_dir=checkpoints,
                          params={"trainable": counts.get("trainable_params"), "total": counts.get("total_params")},
                          phases=manifest.get("phases", []))


def _finish_run(tracking_info: dict | None, phases: list[dict]) -> None:
    """End the stage's MLflow run FINISHED, with what ended each phase: a tag (steps, plateau, mlm_accuracy)
    and the global step it stopped at as a metric."""
    if not tracking_info:
        return
    set_run_tags(tracking_info["uri"], tracking_info["run_id"],
                 {S.stopped_by_tag(p["phase"]): p["stopped_by"] for p in phases})
    logger = RankZeroLogger(tracking_info)
    for p in phases:
        logger.log({S.stop_step_metric(p["phase"]): p["step"]}, p["step"])
    logger.close()
    end_stage_run(tracking_info)


def _export_final(checkpoint, tokenizer_dir: Path, final: Path, cfg: PretrainConfig, key: str) -> None:
    """The last checkpoint's model and the tokenizer into ``final/``, with a manifest holding the
    hash of every model file (its content identity); refuses a tokenizer that does not load back."""
    from transformers import AutoTokenizer  # heavy: transformers

    with checkpoint.as_directory() as ckpt, atomic_dir(final, "model") as tmp:
        for name in HF_FILES:
            if (Path(ckpt) / name).is_file():
                shutil.copy2(Path(ckpt) / name, tmp / name)
        missing = [n for n in TOKENIZER_FILES if (Path(tokenizer_dir) / n).is_file() and not (tmp / n).is_file()]
        try:
            loaded = AutoTokenizer.from_pretrained(str(tmp)).get_vocab()
        except (OSError, ValueError) as exc:
            loaded, missing = {}, missing or [str(exc)]
        if missing or loaded != AutoTokenizer.from_pretrained(str(tokenizer_dir)).get_vocab():
            problem = ", ".join(missing) if missing else "its vocabulary differs"
            raise OrchestratorError(f"pretrain: the final model's tokenizer is incomplete ({problem}): the "
                                    f"checkpoint {ckpt} lacks files of {tokenizer_dir}")
        write_manifest(tmp, stage="model", config=cfg, inputs=[tokenizer_dir],
                       extra={MODEL_FILES_FIELD: model_file_record(tmp), "pretrain_key": key})


def earlier_key(cfg: PretrainConfig, infos: dict[str, InstanceInfo], tokenizer_dir: Path) -> str | None:
    """The key pretraining computed before issue 32 (its phases' instances and vocab.txt's hash)."""
    vocab = Path(tokenizer_dir) / "vocab.txt"
    return content_key("pretrain", cfg.training_fields(), {str(i.max_seq_length): output_key(i.path)
                                                          for i in infos.values()}, file_sha256(vocab)) \
        if vocab.is_file() else None


def _adopt_earlier_key(out_dir: Path, key: str, cfg: PretrainConfig, infos: dict[str, InstanceInfo],
                       tokenizer_dir: Path) -> None:
    """An output made before issue 32 records the key pretraining computed then (its phases' instances and
    vocab.txt's hash, not the stages' keys): when it records that key of these very inputs, it is this run,
    and its manifest and checkpoints' run record are stamped with ``key`` once, so it is reused or resumed."""
    if not (earlier := earlier_key(cfg, infos, tokenizer_dir)):
        return
    for record in (out_dir / MANIFEST, out_dir / CHECKPOINTS / RUN_RECORD):
        data = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else {}
        if data.get(KEY_FIELD if record.name == MANIFEST else "key") == earlier:
            data[KEY_FIELD if record.name == MANIFEST else "key"] = key
            atomic_write_json(record, data)
            log.info("pretrain: %s recorded this run's earlier key; stamped with its key now", record)


@stage_call()  # called from a notebook: the caller's MLflow session and generators as they were (probes L1, L8)
@generators_kept()
def pretrain(cfg: PretrainConfig, instances: dict[int, Path], tokenizer_dir: Path, out_dir: Path,
             tracking=None, run_dir: Path | None = None, *, fail_at: dict | None = None,
             run_tags: dict[str, str] | None = None) -> PretrainResult:
    """Train (or resume) and export ``out_dir/final``; reuse a finished output of the same run.
    ``run_tags`` go on its MLflow run (an experiment's arm); ``fail_at`` is a test hook (see loop).
    A multi-node run whose paths or MLflow store are the driver's own is refused first
    (``orchestrator.pretrain.nodes``)."""
    out_dir = Path(out_dir).resolve()
    tokenizer_dir = Path(tokenizer_dir)
    run_dir = Path(run_dir) if run_dir is not None else out_dir.parent
    instances = {int(k): Path(v) for k, v in instances.items()}
    special = special_ids(tokenizer_dir)
    check_tokenizer_files(tokenizer_dir)
    infos = phase_inputs(cfg, instances)
    for info in infos.values():
        check_vocab_matches(info, tokenizer_dir, special.vocab_size)
    check_init_from(cfg, special.vocab_size, tokenizer_dir)
    # the key the runner names its folder by (a finished output here made from init_from at another path: its key)
    key = relocated_pretrain_key(cfg, *input_keys(instances, tokenizer_dir), out_dir, beside=False)
    _adopt_earlier_key(out_dir, key, cfg, infos, tokenizer_dir)
    if reusable(out_dir, key) and (out_dir / "final" / "config.json").is_file():
        # metrics an earlier attempt could not send, or its run left open (or FAILED) by a job stopped after the
        # output was written: the run is reopened, given its stop tags and ended FINISHED
        if (out_dir / PENDING).is_file() or recorded_run_unfinished(out_dir, configured_uri(tracking, run_dir) or ""):
            _finish_run(start_stage_run(tracking, run_dir, stage=S.KIND_PRETRAIN, params=cfg, out_dir=out_dir),
                        read_manifest(out_dir).get("phases", []))
        reused = _reused(out_dir)
        # a store with no run of this output (another store, or the run deleted): logged there from the output,
        # with what _finish_run gives a trained one (each phase's stop tag and step)
        log_recorded_run(tracking, run_dir, stage=S.KIND_PRETRAIN, out_dir=out_dir,
                         params=run_params(cfg, [info.path for info in infos.values()]),
                         history=reused.history + [{"step": p["step"], S.stop_step_metric(p["phase"]): p["step"]}
                                                   for p in reused.phases],
                         tags={**(run_tags or {}), S.OUTPUT_KEY: key,
                               **{S.stopped_by_tag(p["phase"]): p["stopped_by"] for p in reused.phases}})
        return reused
    with output_lock(out_dir), ray_session():  # a second job on this output waits here, then reuses it
        if reusable(out_dir, key) and (out_dir / "final" / "config.json").is_file():  # finished meanwhile
            return _reused(out_dir)
        gpu = (cfg.resources_per_worker.get("GPU") or 1.0) if cfg.use_gpu else 0.0
        check_fits({**cfg.resources_per_worker, "GPU": gpu}, "pretrain.use_gpu / pretrain.resources_per_worker",
                   "worker")
        nodes = alive_nodes()
        multi_node = check_multi_node(cfg, configured_uri(tracking, run_dir), nodes=nodes,
                                      driver_resources=driver_resources(nodes), out_dir=out_dir,
                                      instances=[info.path for info in infos.values()], tokenizer_dir=tokenizer_dir)
        if multi_node:
            log.info("pretrain: multi-node run (%s): shared storage declared, checkpoints in %s", multi_node,
                     cfg.storage_path or out_dir / CHECKPOINTS)
        return _train(cfg, infos, tokenizer_dir, out_dir, special, key, tracking, run_dir, run_tags, fail_at,
                      multi_node)


def configured_uri(tracking, run_dir: Path) -> str | None:
    """The MLflow store the config names (its default: the run directory's SQLite file); None when off."""
    return tracking.resolve_uri(run_dir) if tracking is not None and tracking.enabled else None


def run_storage(cfg: PretrainConfig, out_dir: Path, key: str) -> tuple[str, str, Path | None]:
    """Ray Train's (storage_path, run name) and the checkpoints' directory when it is a path (None
    for an object store). Default: ``out_dir/checkpoints``. With ``pretrain.storage_path`` the run is
    named by its key, so runs with other settings or inputs never meet each other's checkpoints (the dry run
    looks there too, ``plan._resume_plan``)."""
    if not cfg.storage_path:
        return str(out_dir), CHECKPOINTS, out_dir / CHECKPOINTS
    name = f"{out_dir.name}-{key[:16]}"
    if is_uri(cfg.storage_path):
        return cfg.storage_path, name, None
    root = Path(cfg.storage_path.removeprefix("file://")).resolve()
    return str(root), name, root / name


def _train(cfg: PretrainConfig, infos: dict[str, InstanceInfo], tokenizer_dir: Path, out_dir: Path,
           special: Specials, key: str, tracking, run_dir: Path, run_tags: dict[str, str] | None,
           fail_at: dict | None, multi_node: str | None) -> PretrainResult:
    import ray  # heavy: ray
    import ray.data
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from orchestrator.pretrain.loop import TrainingDiverged, train_loop_per_worker  # heavy: torch, transformers
    from orchestrator.pretrain.process_group import BoundStoreTorchConfig  # heavy: ray, torch

    started = time.monotonic()
    log.info("pretrain: started (%d workers%s)", cfg.num_workers, ", GPUs" if cfg.use_gpu else "")
    storage_path, run_name, ckpt_dir = run_storage(cfg, out_dir, key)
    check_output(out_dir)  # (again, for the job: another process may have written there since)
    out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.storage_path:  # where this output's checkpoints are
        atomic_write_json(out_dir / STORAGE_RECORD, {"storage_path": storage_path, "name": run_name, "key": key})
    resume_dir, made = None, cfg  # made: the config its manifest records (a run resumed: as it was started)
    # on a filesystem: check and resume what is there; in an object store the run's name is its key, and
    # Ray Train resumes the run of that name from its own record there
    if ckpt_dir is not None:
        _check_run(cfg, key, ckpt_dir, out_dir)
        made = started_as(cfg, ckpt_dir)  # continued from init_from's files moved since: the path it keys
        resume_dir = _check_existing_checkpoint(cfg, ckpt_dir, special.vocab_size, special.pad)
    if resume_dir:
        log.info("pretrain: found %s; training resumes from it", resume_dir.name)
    tracking_info = start_stage_run(tracking, run_dir, stage=S.KIND_PRETRAIN, out_dir=out_dir, tags=run_tags,
                                    params=run_params(cfg, [info.path for info in infos.values()]))
    worker_tracking = tracking_info
    if multi_node and tracking_info and tracking_problem(tracking_info["uri"], alive_nodes()):
        # the configured server did not answer and the driver fell back to its own file
        log.warning("pretrain: MLflow fell back to %s, which rank 0 on another node cannot reach: per-step "
                    "metrics go to history.json and this run's MLflow record only gets its result",
                    tracking_info["uri"])
        worker_tracking = None
    try:
        files = {name: instance_files(info.path) for name, info in infos.items()}
        ingest = {name: resolve_ingest(cfg.ingest, files[name]) for name in infos}
        log.info("pretrain: instances read by %s", ", ".join(
            f"{name}: {'the workers themselves' if how == 'local' else 'Ray Data'}" for name, how in ingest.items()))
        datasets = {name: ray.data.read_parquet([str(p) for p in files[name]]).select_columns(list(INSTANCE_COLUMNS))
                    for name in infos if ingest[name] == "ray_data"}
        # the configs themselves (Ray pickles them): no dict round trip between the driver and the loop
        loop_config = {"cfg": cfg, "tokenizer_dir": str(tokenizer_dir.resolve()),
                       "special": special, "tracking": worker_tracking,
                       "dynamic": {name: masking_rule(info) if info.masking == "dynamic"
                                   else None for name, info in infos.items()},
                       "passes": phase_passes(cfg, infos),
                       "resume_dir": str(resume_dir) if resume_dir else None, "fail_at": fail_at,
                       "local_files": {name: [str(p.resolve()) for p in files[name]]
                                       for name in infos if ingest[name] == "local"}}
        resources = {"CPU": worker_cpus(cfg, ray.cluster_resources().get("CPU", 0.0), data_reads=bool(datasets)),
                     **cfg.resources_per_worker}
        trainer = TorchTrainer(
            train_loop_per_worker, train_loop_config=loop_config, datasets=datasets or None,
            torch_config=BoundStoreTorchConfig(),  # rank 0's rendezvous store on its node address only
            dataset_config=ordered_ingest(),  # the same rows in the same order per worker: exact resumes
            scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                                         resources_per_worker=resources,
                                         accelerator_type=cfg.accelerator_type or None),
            run_config=RunConfig(name=run_name, storage_path=storage_path,
                                 checkpoint_config=CheckpointConfig(num_to_keep=cfg.keep_checkpoints),
                                 failure_config=FailureConfig(max_failures=cfg.max_failures)))
        os.environ.setdefault(HEALTH_CHECK_ENV, HEALTH_CHECK_INTERVAL_S)  # propagated to Train's controller
        try:
            with keep_sigint_handler():  # Ray Train's own would swallow a later Ctrl-C (in the sweep)
                result = trainer.fit()
        except Exception as exc:  # Ray wraps worker errors: a worker's own one line, or what the machine lacks
            said = worker_failure(exc, "pretraining")
            if said is exc:
                raise
            raise said from exc
        returned: dict[str, Any] = result.return_value or {}
        if returned.get("diverged"):
            raise TrainingDiverged(returned["diverged"])
        if result.checkpoint is None:
            raise OrchestratorError(f"pretraining produced no checkpoint under {storage_path}/{run_name}")
        history = returned.get("history", [])
        phases = returned.get("phases", [])
        final = out_dir / "final"
        _export_final(result.checkpoint, tokenizer_dir, final, made, key)
    except BaseException as exc:  # KILLED on an interrupt, FAILED on an error
        end_stage_run(tracking_info, ended_status(exc))
        raise
    atomic_write_json(out_dir / "history.json", history)
    losses = [h["loss"] for h in history]
    first, last = (losses[0], losses[-1]) if losses else (float("nan"), float("nan"))
    params = returned.get("params", {})
    cost = measured("pretrain", time.monotonic() - started, cpus=cfg.num_workers * resources["CPU"],
                    gpus=cfg.num_workers if cfg.use_gpu else 0.0)  # what the Train workers held
    write_manifest(out_dir, stage="pretrain", config=made,
                   inputs=[info.path for info in infos.values()] + [tokenizer_dir], seed=cfg.seed,
                   counts={"steps": history[-1]["step"] if history else 0, "first_loss": first, "last_loss": last,
                           "trainable_params": params.get("trainable"), "total_params": params.get("total")},
                   extra={"final": str(final), "phases": phases, "ingest": ingest,
                          "mlflow_run_id": (tracking_info or {}).get("run_id"), KEY_FIELD: key,
                          COST_FIELD: cost.record()})
    log.info("pretrain: done in %s (%s), loss %.3f -> %.3f", duration(cost.wall_s), device_text(cost),
             first, last)
    _finish_run(tracking_info, phases)
    return PretrainResult(model_dir=final, history=history, first_loss=first, last_loss=last,
                          checkpoints_dir=ckpt_dir if ckpt_dir is not None else Path(storage_path) / run_name,
                          params=params, phases=phases)


def random_init(cfg: PretrainConfig, tokenizer_dir: Path, out_dir: Path, *, dest: Path | None = None) -> Path:
    """The floor of an experiment: the model ``cfg`` would pretrain, initialised with ``cfg.seed`` and
    never trained, written with the tokenizer to ``out_dir/final`` (a stage output, with a manifest).
    Fine-tuning it measures what the task data alone teach this architecture. ``dest``: where
    ``out_dir`` goes when it is a stage's temporary directory (what the log and manifest name)."""
    import torch  # heavy: torch

    from orchestrator.pretrain.model import build_model  # heavy: torch, transformers

    if cfg.model.init_from:
        raise ConfigError(f"a random-initialisation arm cannot continue from model.init_from "
                          f"{cfg.model.init_from}: it is the untrained floor of the architecture")
    special = special_ids(Path(tokenizer_dir))
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, special.vocab_size, special.pad)
    final = Path(out_dir) / "final"
    final.mkdir(parents=True, exist_ok=True)
    save_hf(model, Path(tokenizer_dir), final)
    write_manifest(final, stage="model", config=cfg.model, inputs=[tokenizer_dir], seed=cfg.seed,
                   extra={MODEL_FILES_FIELD: model_file_record(final), "init": "random"})
    params = sum(p.numel() for p in model.parameters())
    write_manifest(out_dir, stage="pretrain", config=cfg, inputs=[tokenizer_dir], seed=cfg.seed,
                   counts={"steps": 0, "total_params": params, "trainable_params": 0},
                   extra={"final": str(Path(dest or out_dir) / "final"), "init": "random"})
    log.info("random initialisation: %s (%d parameters, seed %d, no training)", Path(dest or out_dir) / "final",
             params, cfg.seed)
    return final
