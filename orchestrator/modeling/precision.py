"""Mixed precision, shared by pretraining and fine-tuning: fp32, bf16 autocast, or fp16 autocast
with a dynamic loss scaler; one optimizer update that unscales, clips and skips a step whose
gradients are not finite."""
from __future__ import annotations

import contextlib
import math
import warnings

import torch

PRECISIONS = ("fp32", "bf16", "fp16")
#: the start of torch's warning when a schedule steps before its optimizer has (a skipped or stand-in step)
SCHEDULE_BEFORE_STEP = "Detected call of `lr_scheduler.step\\(\\)` before"


def allow_tf32(device: torch.device) -> None:
    """On CUDA, let fp32 matrix products and convolutions use TF32 tensor cores (torch's default is
    full fp32: about 67 instead of about 494 TFLOPS on an H100); nothing elsewhere."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


#: where PyTorch's fused Adam/AdamW kernel runs (one pass over weights, gradients and moments); others fall back
FUSED_OPTIMIZER_DEVICES = frozenset({"cpu", "cuda"})


def fused_optimizer_runs(params) -> bool:
    """Whether PyTorch's fused Adam/AdamW kernel can step ``params``: every one on a device it runs on (on 2
    CPUs a tiny BERT's clip and step took 2.7 ms fused, 11.6 ms foreach, 14.5 ms per tensor)."""
    return {p.device.type for p in params} <= FUSED_OPTIMIZER_DEVICES


def autocast_context(precision: str, device: torch.device):
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_scaler(precision: str, device: torch.device, init_scale: float) -> torch.amp.GradScaler:
    """A dynamic loss scaler for fp16 (halves on overflow, doubles after 2000 clean steps); inert otherwise."""
    return torch.amp.GradScaler(device.type, init_scale=init_scale, enabled=precision == "fp16")


def optimizer_update(params: list[torch.nn.Parameter], optimizer, scheduler, scaler: torch.amp.GradScaler,
                     grad_clip: float, keep_grads: bool = False, read: bool = True
                     ) -> tuple[float | torch.Tensor, bool | torch.Tensor]:
    """Unscale, clip, step (or skip), update the scale. Returns (gradient norm, skipped). The gradients
    are then freed, or with ``keep_grads`` zeroed in place (``train_step``'s CUDA graphs).

    A step is skipped when the gradients are not finite: under fp16 the scaler lowers the scale;
    under fp32/bf16 the weights are left untouched. The LR schedule advances on every step, skipped
    or not: a skipped step counts toward the phase's steps, so a schedule that waited for real
    steps would be cut short (the last skipped-step count of it never reached).

    ``read=False``: where the optimizer can skip on the device (its ``step`` takes ``found_inf``, as
    fine-tuning's ``FusedAdam``) and no fp16 scaler steps it, nothing is read back to the host: the norm
    and the skip come back as device tensors, and on a GPU the host queues the next step's work while this
    one runs. Elsewhere, and with ``read=True``, both are read (one host sync a step).
    """
    scaler.unscale_(optimizer)
    if grad_clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if not read and not scaler.is_enabled() and getattr(optimizer, "skips_on_device", False):
        skipped = ~torch.isfinite(norm)
        optimizer.step(found_inf=skipped)
        _schedule_step(scheduler)
        optimizer.zero_grad(set_to_none=not keep_grads)
        return norm, skipped
    norm_value = float(norm)
    if scaler.is_enabled():
        before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        skipped = scaler.get_scale() < before
    else:
        skipped = not math.isfinite(norm_value)
        if not skipped:
            optimizer.step()
    _schedule_step(scheduler)
    optimizer.zero_grad(set_to_none=not keep_grads)
    return norm_value, skipped


def _schedule_step(scheduler) -> None:
    with warnings.catch_warnings():  # torch warns when the schedule moves before a first real step: meant here
        warnings.filterwarnings("ignore", message=SCHEDULE_BEFORE_STEP)
        scheduler.step()
