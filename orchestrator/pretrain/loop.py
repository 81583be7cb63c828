"""The per-worker training loop (runs inside Ray Train workers) and its pure building blocks.

``train_step`` and ``orchestrator.modeling.precision.optimizer_update`` hold the numerics
(accumulation, autocast, loss scaling, clipping, skip-on-overflow) and are tested directly, without
Ray. ``train_loop_per_worker`` is the Ray edge: dataset shards, DDP, checkpoints, resume, metrics.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from orchestrator.core.config import is_number
from orchestrator.core.console import due, worker_line
from orchestrator.core.cost import duration
from orchestrator.core.errors import ConfigError, OrchestratorError
from orchestrator.core.runtime import seed_everything
from orchestrator.instances.config import Specials
from orchestrator.modeling.adapters import add_adapters, parameter_counts
from orchestrator.modeling.precision import allow_tf32, autocast_context, make_scaler, optimizer_update
from orchestrator.pretrain.checkpoint import checkpoint_name, load_training_state, load_weights, save_checkpoint
from orchestrator.pretrain.config import PretrainConfig, batch_plan
from orchestrator.pretrain.data import LocalShard, Prefetcher, StaticShapes, micro_batches
from orchestrator.pretrain.float8 import check_fp8
from orchestrator.pretrain.model import build_model, check_same_architecture, checkpoint_activations, training_module
from orchestrator.pretrain.optim import build_scheduler, optimizer_for
from orchestrator.pretrain.peaks import peak_flops
from orchestrator.pretrain.stopping import MLM_ACCURACY, PLATEAU, STEPS, Stopper
from orchestrator.track import schema as S
from orchestrator.track.runs import RankZeroLogger, set_run_tags

log = logging.getLogger(__name__)


class TrainingDiverged(OrchestratorError):
    """The loss stayed NaN/inf: stop instead of burning accelerator hours."""


#: What ``train_step`` sums on the device over an optimizer step's micro-batches (the losses as means).
STAT_FIELDS = ("loss", "mlm_loss", "nsp_loss", "mlm_correct", "mlm_count", "tokens")


@dataclasses.dataclass
class StepStats:
    """One optimizer step's statistics. ``totals`` (float64, on the device, ``STAT_FIELDS`` in order)
    is what the loop all-reduces, read back once per step; the named values read it on first use."""
    totals: torch.Tensor
    sequences: int
    grad_norm: float | torch.Tensor  # tensors from train_step(read=False)
    skipped: bool | torch.Tensor
    loss_scale: float
    _values: list[float] | None = dataclasses.field(default=None, repr=False)

    def value(self, name: str) -> float:
        if self._values is None:
            self._values = self.totals.tolist()
        return self._values[STAT_FIELDS.index(name)]

    loss = property(lambda self: self.value("loss"))
    mlm_loss = property(lambda self: self.value("mlm_loss"))
    nsp_loss = property(lambda self: self.value("nsp_loss"))
    mlm_correct = property(lambda self: self.value("mlm_correct"))
    mlm_count = property(lambda self: self.value("mlm_count"))
    tokens = property(lambda self: self.value("tokens"))


def train_step(module: torch.nn.Module, micro_batches: list[dict[str, torch.Tensor]], optimizer, scheduler,
               scaler: torch.amp.GradScaler, *, precision: str, device: torch.device, grad_clip: float,
               params: list[torch.nn.Parameter], cuda_graphs: bool = False, read: bool = True) -> StepStats:
    """One optimizer step over ``len(micro_batches)`` accumulated micro-batches.

    Gradients are synchronised across DDP workers only on the last micro-batch (``no_sync``). The
    statistics stay on the device (no host sync per micro-batch): each micro-batch's loss enters as
    float64 divided by ``n``, so the sums are the ones the host used to add up, to the last bit.

    ``cuda_graphs`` (``speed.cuda_graphs``): the gradients stay allocated from step to step (zeroed in
    place, never freed), so every backward adds into them. A gradient a backward creates is the
    compiled backward's output itself, which lives in the CUDA graph's memory: the next micro-batch's
    replay overwrites it, and accumulation loses all but the last micro-batch (pytorch/pytorch#96693,
    #169545).

    ``read=False`` passes on to ``optimizer_update``: with an optimizer that skips on the device, the step
    reads nothing back (``grad_norm`` and ``skipped`` are then device tensors). The loop reads (LAMB skips on
    the host); ``benchmarks/pretrain_gpu.py``'s ``+ no_host_reads`` row measures what not reading would gain.
    """
    if cuda_graphs:
        for p in params:
            if p.grad is None:  # the first step: afterwards optimizer_update zeroes them in place
                p.grad = torch.zeros_like(p)
    n = len(micro_batches)
    totals = torch.zeros(len(STAT_FIELDS), dtype=torch.float64, device=device)
    sequences = 0
    for i, batch in enumerate(micro_batches):
        # speed.cuda_graphs: a new forward, so the compiled encoder may reuse its graphs' output memory
        # (the previous micro-batch's backward is done); without graphs this does nothing
        torch.compiler.cudagraph_mark_step_begin()
        sync = i == n - 1 or not hasattr(module, "no_sync")
        with contextlib.nullcontext() if sync else module.no_sync():
            with autocast_context(precision, device):
                out = module(**batch)
            scaler.scale(out["loss"] / n).backward()
        zero = out["loss"].new_zeros(())
        losses = torch.stack([out["loss"].detach(), out["mlm_loss"].detach(),
                              out.get("nsp_loss", zero).detach()]).double() / n
        counts = torch.stack([out["mlm_correct"], out["mlm_count"], batch["attention_mask"].sum()]).double()
        totals += torch.cat([losses, counts])
        sequences += int(batch["input_ids"].shape[0])
    scale = scaler.get_scale() if scaler.is_enabled() else 1.0
    grad_norm, skipped = optimizer_update(params, optimizer, scheduler, scaler, grad_clip, keep_grads=cuda_graphs,
                                          read=read)
    return StepStats(totals, sequences=sequences, grad_norm=grad_norm, skipped=skipped, loss_scale=scale)


def static_shapes(speed, rows: int, length: int) -> StaticShapes | None:
    """The micro-batches' fixed shapes under ``speed.cuda_graphs`` (a graph replays one shape), else None."""
    return StaticShapes.for_batch(rows, length) if speed.cuda_graphs else None


#: Where a BERT's weights run, by parameter name: the pooler and the NSP classifier once a sequence,
#: the MLM head (its transform, LayerNorm and bias; the decoder weight is the word embeddings) at the
#: masked positions only; every other weight outside the embeddings at every token.
PER_SEQUENCE, AT_MASKED = ("bert.pooler.", "cls.seq_relationship."), ("cls.predictions.",)


def training_flops_per_token(model: torch.nn.Module, seq_len: float, masked_fraction: float) -> float:
    """Training FLOPs per token of a BERT (Kaplan et al. / PaLM's 6N + 12LHS, counted as BERT runs):

    - each weight outside the embeddings costs 6 FLOPs each time it is applied when it trains
      (forward 2, backward 2 for the activations' gradient and 2 for its own) and 4 when it is frozen
      (adapters): the encoder's at every token, the pooler's and the NSP classifier's once a sequence
      (per token: divided by ``seq_len``), the MLM head's at the masked positions (x ``masked_fraction``);
    - the embedding lookups cost nothing; the MLM decoder, tied to the word embeddings, runs only at
      the masked positions: 6 (or 4, frozen) x hidden x vocabulary x ``masked_fraction``;
    - attention scores and their weighted sum: 12 x layers x hidden x ``seq_len``."""
    embeddings = getattr(model, "bert", model).embeddings
    lookup = {id(p) for p in embeddings.parameters()}
    flops = 0.0
    for name, p in model.named_parameters():
        if id(p) in lookup:
            continue
        share = (1.0 / max(seq_len, 1.0) if name.startswith(PER_SEQUENCE)
                 else masked_fraction if name.startswith(AT_MASKED) else 1.0)
        flops += (6 if p.requires_grad else 4) * p.numel() * share
    config = model.config
    words = embeddings.word_embeddings.weight
    decoder = (6 if words.requires_grad else 4) * config.hidden_size * config.vocab_size * masked_fraction
    return flops + decoder + 12 * config.num_hidden_layers * config.hidden_size * seq_len


#: How ``mfu`` is computed, logged beside it (MLflow tag ``mfu.formula``) so a reader knows what it counts.
MFU_FORMULA = ("mfu = training_flops_per_token x tokens_per_s / workers / peak_flops(device, precision); "
               "training_flops_per_token = 6 x trained + 4 x frozen non-embedding weights (the encoder's; the "
               "pooler's and NSP's / seq_len; the MLM head's x masked_fraction) + (6 or 4) x hidden x vocab x "
               "masked_fraction + 12 x layers x hidden x seq_len (padding tokens not counted)")


def device_label(device: torch.device) -> str:
    """The name the peak table is keyed by: CUDA's device name; "cpu" (no peak: MFU null) elsewhere."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def mfu_basis(device: torch.device, precision: str) -> dict[str, str]:
    """What an MFU is measured against, as MLflow tags: the device, the peak used, the formula."""
    name = device_label(device)
    peak = peak_flops(name, precision, tf32=device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32)
    return {"mfu.device": name, "mfu.precision": precision,
            "mfu.peak_flops": f"{peak:.4g}" if peak else "none (no peak for this device in pretrain/peaks.py: "
                                                          "MFU not logged)",
            "mfu.formula": MFU_FORMULA}


def throughput_text(record: dict[str, Any], steps: int | None = None) -> str:
    """'last 50 steps: 1,234 seq/s, 158k tokens/s, MFU 0.210' for the progress line (MFU n/a without a peak): the
    rates of the ``steps`` since the last record, which the line's steps/s (the phase's, pauses for checkpoints
    and evaluations included) is not (a probe, session 47, read 6.59 steps/s beside 593 seq/s at batch 32)."""
    mfu = record.get("mfu")
    return ((f"last {steps} step{'s' if steps != 1 else ''}: " if steps else "")
            + f"{record['seq_per_s']:,.1f} seq/s, {record['tokens_per_s']:,.0f} tokens/s, "
            f"MFU {'n/a' if mfu is None else f'{mfu:.3f}'}")


def estimate_mfu(flops_per_token: float, tokens_per_s: float, world: int, device_name: str,
                 precision: str) -> float | None:
    """Model FLOPs utilisation of one device: the cluster's ``tokens_per_s`` spread over ``world``
    devices, against the peak of ``device_name`` (None for a device the table does not know)."""
    peak = peak_flops(device_name, precision, tf32=torch.backends.cuda.matmul.allow_tf32)  # peaks.PEAKS, exact name
    if peak is None:
        return None
    return flops_per_token * tokens_per_s / world / peak


# --------------------------------------------------------------------------------------------- Ray edge
def _batch_to_torch(objective_nsp: bool, pin: bool):
    """On the data thread: numpy micro-batch -> torch tensors (pinned for asynchronous copies on CUDA)."""
    def convert(item):
        batch, position = item
        out = {k: torch.from_numpy(v) for k, v in batch.items() if objective_nsp or k != "next_sentence_label"}
        if pin:
            out = {k: v.pin_memory() for k, v in out.items()}
        return out, position
    return convert


def _to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _all_gather(obj: Any, world: int) -> list[Any]:
    """Every rank's ``obj`` (at checkpoints only: RNG states and data positions)."""
    import torch.distributed as dist  # heavy: torch

    if not (dist.is_available() and dist.is_initialized()) or world == 1:
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj)
    return out


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's random number generators: torch (CPU, and CUDA on a GPU), numpy's, Python's."""
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                      "has_gauss": int(np_state[3]), "gauss": float(np_state[4])},
            "python": random.getstate()}


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["gauss"]))
    random.setstate(state["python"])


def _all_reduce(values: list[float] | torch.Tensor, device: torch.device) -> list[float]:
    """Sums over the workers, read back to the host (the one host sync of a step's statistics)."""
    import torch.distributed as dist  # heavy: torch

    t = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


#: A window's decision as a number every rank can all-reduce.
DECISIONS = (None, PLATEAU, MLM_ACCURACY)


def _check_same_decision(decision: str | None, world: int, device: torch.device, step: int) -> None:
    """Every rank decides from the same all-reduced values, so the decisions agree; this checks it at
    each window's end, so that ranks that disagree fail here, saying so, instead of the one that
    stopped waiting forever for the others in the next collective."""
    code = float(DECISIONS.index(decision))
    total, squares = _all_reduce([code, code * code], device)
    if total != world * code or squares != world * code * code:  # equal sums of x and x^2: all the same
        raise OrchestratorError(f"step {step}: the workers disagree on whether the phase stops (this rank: "
                                f"{decision or 'go on'}); the stopping rule must see the all-reduced values")


class Progress:
    """A console line when one is due (``orchestrator.core.console.due``: at least ``every_s`` seconds
    apart, about 20 a phase) and at the phase's end: a pretraining phase runs for hours and its metrics
    otherwise go only to MLflow. Printed for the driver's terminal (``console.worker_line``: the
    progress line there) and kept in the run's log.

    Its steps/s, and the time left, are counted from the end of the phase's first step, which holds
    torch.compile's compile and the allocator's warm-up: counted from the phase's start, a small model's
    first line on an H200 said "about 10m29s left" 33 s in, with 47 s left."""

    def __init__(self, phase_name: str, steps: int, start_step: int, every_s: float = 30.0):
        self.phase_name, self.steps, self.start_step, self.every_s = phase_name, steps, start_step, every_s
        self.started = self.last = time.monotonic()
        self.last_step = start_step
        self.steady: tuple[float, int] | None = None  # (time, phase step) at the end of the first step

    def step(self, phase_step: int, mlm_loss: float, mlm_accuracy: float, force: bool = False,
             throughput: str = "") -> str | None:
        now = time.monotonic()
        if self.steady is None:
            self.steady = (now, phase_step)
        if not force and not due(now - self.last, phase_step - self.last_step, self.steps, every_s=self.every_s):
            return None
        self.last, self.last_step = now, phase_step
        since, first = self.steady
        if phase_step > first:  # the rate after the first step
            rate = (phase_step - first) / max(now - since, 1e-9)
        else:  # only the first step yet
            rate = (phase_step - self.start_step) / max(now - self.started, 1e-9)
        eta = (self.steps - phase_step) / rate if rate > 0 else float("inf")
        left = f", about {duration(eta, tenths=False)} left" if phase_step < self.steps and math.isfinite(eta) else ""
        line = (f"{self.phase_name}: step {phase_step}/{self.steps}, MLM loss {mlm_loss:.4f}, accuracy "
                f"{mlm_accuracy:.3f}, {rate:.2f} steps/s overall" + (f" ({throughput})" if throughput else "")
                + f", {duration(now - self.started, tenths=False)} elapsed" + left)
        worker_line(line, is_progress=True)
        return line


def data_start(resume: dict[str, Any] | None, phase_index: int, phase_name: str, phase_step: int, ingest: str,
               rank: int) -> tuple[Any, str | None]:
    """Where this worker's stream of a phase starts on a resume, and a warning when it cannot go on.

    ``resume`` is the checkpoint's resume data (None: a fresh run, or another world size). A phase
    interrupted mid-way goes on at this rank's saved position when the checkpoint was written by the
    same reader (``ingest``: "local" or "ray_data"; checkpoints from before ``pretrain.ingest`` were
    all "ray_data"). The other reader's positions count other rows, so its phase starts a fresh epoch.
    """
    if resume is None or resume["data"]["phase"] != phase_index or phase_step <= 0:
        return None, None
    written_by = resume["data"].get("ingest", "ray_data")
    if written_by == ingest:
        return resume["data"]["positions"][rank], None  # go on where this worker's shard stopped
    return None, (f"warning: the checkpoint's data position is of another reader ({written_by}, this run "
                  f"{ingest}): {phase_name}'s data starts a fresh epoch")


def train_loop_per_worker(config: dict[str, Any]) -> dict[str, Any]:
    """Ray Train entry point. ``config``: cfg (the PretrainConfig itself), tokenizer_dir, special
    (Specials), dynamic (per phase name: its MaskingRule, or None for static masks), tracking ({uri,
    run_id} or None), resume_dir (a checkpoint to start from when Ray has none),
    fail_at (test hook: {step, marker} makes rank 1 die once at that step).

    Returns (rank 0) {"history": [...], "diverged": message or None, "params": counts, "phases": per
    phase {"phase", "stopped_by" (steps, plateau, mlm_accuracy), "step" (global), "phase_step", "max_steps"}}.
    """
    import ray.train  # heavy: ray
    import ray.train.torch

    cfg: PretrainConfig = config["cfg"]
    tokenizer_dir = Path(config["tokenizer_dir"])
    special: Specials = config["special"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)  # the device the checkpoints' all_gather_object uses under NCCL
    allow_tf32(device)
    torch.set_num_threads(max(1, int(cfg.cpus_per_worker)))
    seed_everything(cfg.seed)

    if cfg.speed.fp8:
        check_fp8(device)
    model = build_model(cfg.model, special.vocab_size, special.pad, attention=cfg.speed.attention, fp8=cfg.speed.fp8)
    if cfg.adapters.enabled:
        add_adapters(model, cfg.adapters.reduction_factor, cfg.adapters.train_heads)
    if cfg.gradient_checkpointing:  # recompute each layer's activations in the backward pass: less memory
        checkpoint_activations(model)
    counts = parameter_counts(model)
    state: dict[str, Any] = {"step": 0, "phase": 0, "phase_step": 0, "history": [], "phases": []}
    training_state = None
    checkpoint = ray.train.get_checkpoint()
    resume_ctx = checkpoint.as_directory() if checkpoint is not None else contextlib.nullcontext(
        config.get("resume_dir"))
    with resume_ctx as resume_dir:
        if resume_dir:
            check_same_architecture(model.config, Path(resume_dir))
            load_weights(model, Path(resume_dir))
            training_state = load_training_state(Path(resume_dir))
            state = {"phases": [], **training_state["state"]}
            if rank == 0:
                worker_line(f"resuming from {resume_dir} at step {state['step']}")
    nsp = cfg.model.objective == "mlm_nsp"
    module = training_module(model, cfg.speed, wrap=ray.train.torch.prepare_model)
    resume = (training_state or {}).get("resume")
    if resume is not None and resume.get("world") != world:
        if rank == 0:
            worker_line(f"warning: the checkpoint was written by {resume.get('world')} workers, this run has "
                        f"{world}: the random generators and the data position start afresh")
        resume = None
    if resume is not None:  # dropout and the other random draws go on as in the uninterrupted run
        set_rng_state(resume["rng"][rank], device)
    params = [p for p in model.parameters() if p.requires_grad]
    tracker = RankZeroLogger(config.get("tracking") if rank == 0 else None)
    if rank == 0 and config.get("tracking"):
        set_run_tags(config["tracking"]["uri"], config["tracking"]["run_id"], mfu_basis(device, cfg.precision))
    throughput = ""
    fail_at = config.get("fail_at")
    diverged = None
    nonfinite_run = 0

    for phase_index, (phase_name, phase) in enumerate(cfg.active_phases()):
        if phase_index < state["phase"]:
            continue
        plan = batch_plan(phase.global_batch_size, world, phase.device_batch_size, where=phase_name)
        optimizer = optimizer_for(model, cfg, phase.learning_rate)
        warmup = int(phase.warmup_proportion * phase.steps)
        scheduler = build_scheduler(optimizer, warmup, phase.steps, cfg.optim.decay_power)
        scaler = make_scaler(cfg.precision, device, cfg.init_loss_scale)
        if training_state is not None and state["phase"] == phase_index and state["phase_step"] > 0:
            optimizer.load_state_dict(training_state["optimizer"])
            scheduler.load_state_dict(training_state["scheduler"])
            if training_state["scaler"] is not None and scaler.is_enabled():
                scaler.load_state_dict(training_state["scaler"])
            stopper = Stopper.from_state(cfg.stop, state.get("stop"))  # mid-window, with its plateau count
        else:
            state["phase_step"] = 0
            stopper = Stopper(cfg.stop)
        state["phase"] = phase_index
        local = config.get("local_files", {}).get(phase_name)
        ingest = "local" if local else "ray_data"
        shard = LocalShard(local, rank, world) if local else ray.train.get_dataset_shard(phase_name)
        rule = config["dynamic"][phase_name]
        start, warning = data_start(resume, phase_index, phase_name, state["phase_step"], ingest, rank)
        if warning and rank == 0:
            worker_line(warning)
        # read, collate and mask (and pin) on a background thread while the device runs the steps
        stream = Prefetcher(micro_batches(shard, plan.device_batch, special, rule,
                                          seed=cfg.seed, seed_key=(rank, phase_index, state["step"]),
                                          prefetch=cfg.dataloader_prefetch,
                                          pad_to=8 if device.type == "cuda" else 1, start=start,
                                          shapes=static_shapes(cfg.speed, plan.device_batch, phase.max_seq_length)),
                            depth=max(1, cfg.dataloader_prefetch) * plan.accumulation,
                            transform=_batch_to_torch(nsp, pin=device.type == "cuda"), name=f"data-{phase_name}")
        position = start
        if rank == 0:
            worker_line(f"{phase_name}: {phase.steps} steps, global batch {plan.global_batch} = {world} workers x "
                        f"{plan.device_batch} x {plan.accumulation} accumulation, lr {phase.learning_rate:g}"
                        + (f"; {said}" if (said := config.get("passes", {}).get(phase_name)) else ""))
        window = {"t": time.perf_counter(), "seq": 0, "tok": 0, "step": state["step"]}
        progress = Progress(phase_name, phase.steps, state["phase_step"])
        first_step_s = None
        try:
            while state["phase_step"] < phase.steps:
                if fail_at and rank == min(1, world - 1) and state["step"] == fail_at["step"] \
                        and not os.path.exists(fail_at["marker"]):
                    Path(fail_at["marker"]).write_text("died once\n")
                    _reports_collected()
                    os._exit(1)
                micro = []
                for _ in range(plan.accumulation):
                    batch, position = next(stream)
                    micro.append(_to_device(batch, device))
                module.train()
                lr = optimizer.param_groups[0]["lr"]
                step_started = time.perf_counter()
                stats = train_step(module, micro, optimizer, scheduler, scaler, precision=cfg.precision,
                                   device=device, grad_clip=cfg.optim.grad_clip, params=params,
                                   cuda_graphs=cfg.speed.cuda_graphs)
                nonfinite_flag = (~torch.isfinite(stats.totals[:1])).double()
                loss, mlm, nsp_l, correct, count, toks, nonfinite = _all_reduce(
                    torch.cat([stats.totals, nonfinite_flag]), device)
                seqs = stats.sequences * world  # every worker's micro-batches are full (drop_last)
                if state["phase_step"] == progress.start_step:  # this process's first step of the phase:
                    first_step_s = time.perf_counter() - step_started  # compile (speed.compile), allocator
                    if rank == 0:
                        log.info("%s: first step %.2fs%s", phase_name, first_step_s,
                                 " (includes torch.compile's compile)" if cfg.speed.compile else "")
                state["step"] += 1
                state["phase_step"] += 1
                window["seq"] += seqs
                window["tok"] += toks
                nonfinite_run = nonfinite_run + 1 if nonfinite else 0
                window_end = stopper.add(mlm / world, correct, count)
                state["stop"] = stopper.state_dict()
                stopped_by = None
                if window_end is not None:
                    stopped_by = window_end["stopped_by"]
                    _check_same_decision(stopped_by, world, device, state["step"])
                if stopped_by is None and state["phase_step"] == phase.steps:
                    stopped_by = STEPS
                if stats.skipped and rank == 0:
                    log.warning("step %d skipped: non-finite gradients (loss scale now %g)", state["step"],
                                scaler.get_scale() if scaler.is_enabled() else 1.0)
                if nonfinite_run >= cfg.max_nonfinite_steps:
                    diverged = (f"loss was NaN/inf for {nonfinite_run} consecutive steps (step {state['step']}, "
                                f"{phase_name}, precision {cfg.precision}); lower the learning rate or use bf16/fp32")
                    break
                if state["step"] % cfg.log_every == 0 or stopped_by or window_end is not None:
                    elapsed = max(time.perf_counter() - window["t"], 1e-9)
                    record = {"step": state["step"], "phase": phase_index + 1, "loss": loss / world,
                              "mlm_loss": mlm / world, "mlm_accuracy": correct / max(count, 1.0),
                              "lr": lr, "grad_norm": stats.grad_norm,
                              "loss_scale": stats.loss_scale, "skipped": float(stats.skipped),
                              "seq_per_s": window["seq"] / elapsed, "tokens_per_s": window["tok"] / elapsed}
                    if nsp:
                        record["nsp_loss"] = nsp_l / world
                    if window_end is not None:  # what the stopping rule saw
                        record[S.WINDOW_MLM_LOSS] = window_end["mlm_loss"]
                        record[S.WINDOW_MLM_ACCURACY] = window_end["mlm_accuracy"]
                    per_token = training_flops_per_token(model, toks / max(seqs, 1), count / max(toks, 1.0))
                    record["mfu"] = estimate_mfu(per_token, record["tokens_per_s"], world, device_label(device),
                                                 cfg.precision)  # None without a peak (CPU): not logged
                    if first_step_s is not None:  # logged once, with the first record of the phase
                        record["first_step_s"], first_step_s = first_step_s, None
                    throughput = throughput_text(record, state["step"] - window["step"])
                    state["history"].append(record)
                    tracker.log({k: v for k, v in record.items() if k != "step"}, state["step"])
                    window = {"t": time.perf_counter(), "seq": 0, "tok": 0, "step": state["step"]}
                phase_done = stopped_by is not None
                if rank == 0:
                    progress.step(state["phase_step"], mlm / world, correct / max(count, 1.0), force=phase_done,
                                  throughput=throughput)
                if phase_done:
                    state["phases"].append({"phase": phase_name, "stopped_by": stopped_by, "step": state["step"],
                                            "phase_step": state["phase_step"], "max_steps": phase.steps})
                    if rank == 0 and stopped_by != STEPS:
                        worker_line(f"{phase_name} stopped by {stopped_by} at step {state['phase_step']} of "
                                    f"{phase.steps} (window MLM loss {window_end['mlm_loss']:.4f}, accuracy "
                                    f"{window_end['mlm_accuracy']:.4f})")
                if phase_done or (cfg.checkpoint_every and state["step"] % cfg.checkpoint_every == 0):
                    if phase_done and phase_index + 1 < len(cfg.active_phases()):
                        state = {**state, "phase": phase_index + 1, "phase_step": 0}
                    # every worker's generators and data position, so that a resume goes on from here
                    resume_state = {"world": world, "rng": _all_gather(rng_state(device), world),
                                    "data": {"phase": phase_index, "positions": _all_gather(position, world),
                                             "ingest": ingest}}
                    _report_checkpoint(rank, model, tokenizer_dir, optimizer, scheduler, scaler, state,
                                       resume_state)
                if phase_done:
                    break
        finally:
            stream.close(timeout=5.0)
        if diverged:
            break
    tracker.close()
    if diverged:
        ray.train.report({"step": state["step"], "diverged": 1.0})
    return {"history": state["history"], "diverged": diverged, "params": counts,
            "phases": state["phases"]} if rank == 0 else {}


def _reports_collected(timeout_s: float = 60.0) -> None:
    """Test hook (``fail_at``): wait until Ray Train's controller has taken this worker's reports before
    dying. It collects them every ~2 s; a worker that dies before that loses its latest checkpoint and
    the restart goes back to the one before (or to the start), which is not the resume under test."""
    try:
        from ray.train.v2._internal.execution.context import get_train_context  # heavy: ray, internal API

        pending = get_train_context().get_result_queue()
    except (ImportError, AttributeError):  # another Ray: wait out a few collection rounds
        time.sleep(6.0)
        return
    deadline = time.monotonic() + timeout_s
    while pending.unfinished_tasks and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the controller registers the checkpoint right after taking it


def check_room_for_checkpoint(where: Path, model, optimizer) -> None:
    """A checkpoint (weights and optimizer state) is written whole into the temp directory before Ray copies it
    to the run's checkpoints folder: a ConfigError naming TMPDIR when it cannot fit there. A full TMPDIR made
    torch's writer fail with "unexpected pos 20864 vs 20758", which said nothing of a disk."""
    need = sum(p.numel() * p.element_size() for p in model.parameters())
    need += sum(t.numel() * t.element_size() for state in optimizer.state.values() for t in state.values()
                if torch.is_tensor(t))
    free = shutil.disk_usage(where).free
    if free < need * 1.1 + (16 << 20):
        size = lambda n: f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"  # noqa: E731
        raise ConfigError(f"a checkpoint of this run needs about {size(need)} in the temp directory {where.parent} "
                          f"before Ray copies it to the run's checkpoints, and {size(free)} is free there: point "
                          "TMPDIR at a larger disk (on every node) and re-run the same command")


def _report_checkpoint(rank, model, tokenizer_dir, optimizer, scheduler, scaler, state, resume) -> None:
    """Every rank reports (a barrier); rank 0 attaches the checkpoint Ray persists to storage."""
    import ray.train  # heavy: ray

    metrics = {"step": state["step"]}
    if state["history"]:
        metrics.update({k: v for k, v in state["history"][-1].items() if is_number(v, finite=False)})
    with tempfile.TemporaryDirectory(prefix="ckpt-") as tmp:
        checkpoint = None
        if rank == 0:
            check_room_for_checkpoint(Path(tmp), model, optimizer)
            save_checkpoint(Path(tmp), model, tokenizer_dir, optimizer=optimizer, scheduler=scheduler,
                            scaler=scaler if scaler.is_enabled() else None, state=state, resume=resume)
            checkpoint = ray.train.Checkpoint.from_directory(tmp)
        ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=checkpoint_name(state["step"]))
