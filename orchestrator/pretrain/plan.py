"""The pretraining stage's dry run (``plan_pretrain``): the model, each phase's batch arithmetic, what a
multi-node run needs, the inputs checked, and what the run would do with an output directory's checkpoints
(reuse, resume, refuse another run's). Trains nothing."""
from __future__ import annotations

from pathlib import Path

from orchestrator.core.artifacts import InstanceInfo, check_model, read_instance_info
from orchestrator.core.errors import InputError
from orchestrator.core.manifest import read_manifest
from orchestrator.core.reuse import KEY_FIELD, made_under
from orchestrator.pretrain.checkpoint import CHECKPOINTS, latest_checkpoint, other_run, other_run_error
from orchestrator.pretrain.config import (
    SIZE_PRESETS,
    PretrainConfig,
    batch_plan,
    input_keys,
    passes_text,
    relocated_pretrain_key,
)
from orchestrator.pretrain.data import check_vocab_matches
from orchestrator.pretrain.nodes import check_multi_node
from orchestrator.pretrain.trainer import check_init_from, earlier_key, phase_inputs, run_storage, special_ids


def plan_pretrain(cfg: PretrainConfig, instances: dict[int, Path] | None, tokenizer_dir: Path | None, *,
                  tracking_uri: str | None = None, nodes: list[dict] | None = None,
                  driver_node: dict[str, float] | None = None, out_dir: Path | None = None,
                  built: dict[int, Path] | None = None) -> str:
    """Dry run: the model, batch arithmetic per phase and its passes over its instances, what a multi-node run
    needs and, when given, checked inputs. Trains nothing. ``tracking_uri``: the configured MLflow store (None
    when off); ``nodes`` / ``driver_node``: an attached cluster's alive nodes and the driver node's resources
    (None: not attached; ``pretrain.multi_node`` alone then says whether the run spans nodes); ``built``: the
    instances outputs the stage has already made, by length (a chain's or an arm's, before its run), whose
    counts give the passes where ``instances`` is not given. Imports torch and transformers only to count a
    new model's parameters (with ``tokenizer_dir``): a dry run before the corpus stage has run answers
    without them."""
    lines = []
    made = {int(n): Path(p) for n, p in {**(built or {}), **(instances or {})}.items()}
    paths = [Path(p) for _, p in sorted((instances or {}).items())]
    multi_node = check_multi_node(cfg, tracking_uri, nodes=nodes, driver_resources=driver_node, out_dir=out_dir,
                                  instances=paths, tokenizer_dir=tokenizer_dir)
    if multi_node:
        where = cfg.storage_path or (Path(out_dir) / CHECKPOINTS if out_dir else "<out_dir>/checkpoints")
        lines.append(f"nodes: several ({multi_node}); shared storage declared, checkpoints in {where}, "
                     f"MLflow {tracking_uri or 'off'}")
    if cfg.model.init_from:
        hf = check_model("pretrain.model.init_from", cfg.model.init_from, tokenizer=False)
        lines.append(f"model: continue from {cfg.model.init_from} (hidden {hf['hidden']}, {hf['layers']} layers), "
                     f"objective {cfg.model.objective}")
    else:
        hidden, layers, heads, inter = SIZE_PRESETS[cfg.model.size]
        lines.append(f"model: {cfg.model.size} BERT (hidden {hidden}, {layers} layers, {heads} heads, "
                     f"FFN {inter}), objective {cfg.model.objective}")
    if cfg.adapters.enabled:
        lines.append(f"adapters: bottleneck hidden/{cfg.adapters.reduction_factor} after each FFN, base frozen")
    lines.append(f"optimizer: {cfg.optim.name}, precision {cfg.precision}, workers {cfg.num_workers} "
                 f"({'GPU, NCCL' if cfg.use_gpu else 'CPU, gloo'})")
    for name, phase in cfg.active_phases():
        plan = batch_plan(phase.global_batch_size, cfg.num_workers, phase.device_batch_size, where=name)
        lines.append(f"{name}: len {phase.max_seq_length}, {phase.steps} steps, global batch {plan.global_batch} = "
                     f"{plan.workers} x {plan.device_batch} x {plan.accumulation} accumulation, "
                     f"lr {phase.learning_rate:g}, warm-up {int(phase.warmup_proportion * phase.steps)} steps; "
                     + passes_text(phase.steps, plan.global_batch, *_count(made.get(phase.max_seq_length))))
    if cfg.stop.enabled:
        stop = cfg.stop
        rules = [f"MLM accuracy >= {stop.mlm_accuracy:g}"] if stop.mlm_accuracy else []
        if stop.plateau_patience:
            rules.append(f"MLM loss not {stop.plateau_min_delta:.1%} below the phase's best for "
                         f"{stop.plateau_patience} windows")
        lines.append(f"stop: a phase ends at its steps, or earlier at the end of a {stop.window}-step window with "
                     f"{' or '.join(rules)} (the LR schedule stays over the steps)")
    if tokenizer_dir is not None:
        special = special_ids(Path(tokenizer_dir))
        check_init_from(cfg, special.vocab_size, Path(tokenizer_dir))
        if not cfg.model.init_from:
            import torch  # heavy: torch

            from orchestrator.pretrain.model import bert_config, model_class  # heavy: torch, transformers

            with torch.device("meta"):
                model = model_class(cfg.model.objective)(bert_config(cfg.model, special.vocab_size, special.pad))
            lines.append(f"parameters: {sum(p.numel() for p in model.parameters()):,} "
                         f"(vocabulary {special.vocab_size})")
        if instances is not None:
            infos = phase_inputs(cfg, {int(k): Path(v) for k, v in instances.items()})
            for name, info in infos.items():
                check_vocab_matches(info, Path(tokenizer_dir), special.vocab_size)
                lines.append(f"{name} input: {info.path} ({info.instances} instances, {info.masking} masking)")
            if out_dir is not None:  # what the run does with the checkpoints it finds
                lines += _resume_plan(cfg, instances, infos, Path(tokenizer_dir), Path(out_dir))
    else:
        lines.append("inputs: produced by the corpus stage (checked when it has run)")
    return "\n".join(lines)


def _count(path: Path | None) -> tuple[int | None, str | None]:
    """(instance count, masking) of an instances output; (None, None) when it is not made yet, or cannot be
    read (the inputs' check that follows says why)."""
    try:
        info = read_instance_info(path) if path is not None else None
    except InputError:
        info = None
    return (info.instances, info.masking) if info is not None else (None, None)


def _resume_plan(cfg: PretrainConfig, instances: dict, infos: dict[str, InstanceInfo], tokenizer_dir: Path,
                 out_dir: Path) -> list[str]:
    """The dry run's word on ``out_dir``: a finished output reused, checkpoints resumed, or another run's
    checkpoints refused (as the run refuses them: the dry run said "valid") or discarded. The checkpoints are
    looked for where the run keeps them: ``out_dir/checkpoints``, or with ``pretrain.storage_path`` the run's
    folder there (an object store is not read: Ray Train resumes a run of that name it holds)."""
    key = relocated_pretrain_key(cfg, *input_keys({int(k): Path(v) for k, v in instances.items()}, tokenizer_dir),
                                 out_dir, beside=False)  # as the run computes it
    same = (earlier_key(cfg, infos, tokenizer_dir) or "",)
    finished = (out_dir / "final" / "config.json").is_file()
    manifest = read_manifest(out_dir) if finished else {}
    if finished and manifest.get(KEY_FIELD) in (key, *same):
        return [f"output: finished for this config and inputs, reused ({out_dir / 'final'}){made_under(manifest)}"]
    storage_path, name, ckpt_dir = run_storage(cfg, out_dir, key)
    if ckpt_dir is None:
        return [f"checkpoints: {storage_path.rstrip('/')}/{name} (an object store: Ray Train resumes the run of "
                "that name if it holds one)"]
    if (latest := latest_checkpoint(ckpt_dir)) is None:
        return []
    if not (what := other_run(ckpt_dir, key, cfg.training_fields(), same)):
        return [f"checkpoints: resumes from {latest}"]
    if cfg.on_mismatch == "refuse":
        raise other_run_error(ckpt_dir, what)
    return [f"checkpoints: {ckpt_dir} holds another run's ({what}): discarded (on_mismatch=restart)"]
