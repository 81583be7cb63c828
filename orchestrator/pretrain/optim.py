"""Optimisers and the learning-rate schedule of NVIDIA's BERT recipe (seed 000).

LAMB is implemented here (You et al. 2019, "Large Batch Optimization for Deep Learning",
Algorithm 2, with bias correction as in NVIDIA's FusedLAMB). ``pytorch-optimizer``'s ``Lamb`` was
compared (tests/test_lamb_reference.py): by default it scales the step by 1 / (1 - beta1^t) after
the trust ratio, leaves v uncorrected, clamps ||w|| at 10 and adapts every tensor, so it is not the
paper's update; with those undone the two agree to 1e-9. apex's FusedLAMB needs a CUDA build.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from orchestrator.modeling.precision import fused_optimizer_runs
from orchestrator.pretrain.config import OptimConfig, PretrainConfig


class Lamb(torch.optim.Optimizer):
    """Layer-wise adaptive moments: an Adam direction rescaled per tensor by ||w|| / ||update||.

    For each parameter tensor w with gradient g (step t):
        m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2
        u = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * w
        w = w - lr * (||w|| / ||u||) * u        (trust ratio 1 when either norm is 0)

    The trust ratio is applied only to tensors with weight decay, as NVIDIA's FusedLAMB does by
    default (``use_nvlamb=False``) and Google's reference (``exclude_from_layer_adaptation``
    defaults to the weight-decay exclusions): biases and LayerNorm parameters take the plain Adam
    step. ``adapt_all=True`` applies it everywhere (NVLAMB). Adapting a bias that starts at 0 pins
    it near 0: its first step is tiny (warm-up) and every later one is scaled by its own small norm.

    Every tensor of a group is updated at once by ``torch._foreach_*`` multi-tensor kernels, the
    trust ratios too (``foreach=False``: the same arithmetic tensor by tensor, the reference the
    tests compare it with); the step never reads a value back to the host.

    ``compiled=True`` (``pretrain.speed.compile_optimizer``): the same multi-tensor function
    (``_lamb_update``) ``torch.compile``d, which fuses the moments, the update, the norms and the trust
    ratios into a few kernels. ``compile_backend``: torch.compile's backend (the tests' aot_eager).
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01, adapt_all: bool = False, foreach: bool = True,
                 compiled: bool = False, compile_backend: str = "inductor"):
        if lr <= 0 or eps <= 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"invalid LAMB hyper-parameters lr={lr} betas={betas} eps={eps} wd={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adapt_all=adapt_all,
                                      foreach=foreach))
        self.compiled = compiled
        self.compile_backend = compile_backend
        self._scalars: dict[int, torch.Tensor] = {}  # per group: its lr and bias corrections, on its device

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for index, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                if p.grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
            exp_avg = [self.state[p]["exp_avg"] for p in params]
            exp_avg_sq = [self.state[p]["exp_avg_sq"] for p in params]
            step = self.state[params[0]]["step"]
            if self.compiled or group.get("foreach", True):
                self._step_foreach(index, group, params, exp_avg, exp_avg_sq, step)
            else:
                _lamb_per_tensor(group, params, exp_avg, exp_avg_sq, step)
        return loss

    def _step_foreach(self, index: int, group: dict, params: list[torch.Tensor], exp_avg: list[torch.Tensor],
                      exp_avg_sq: list[torch.Tensor], step: int) -> None:
        """``_lamb_update`` for one group, eager or (``compiled``) compiled. What changes from step to step
        (the learning rate the schedule sets, the bias corrections) enters as device tensors filled in
        place: a value the compiled code read as a Python number would be a guard, and every new value a
        recompile; ``fill_`` launches a kernel with the value, where a copy from the host would wait for
        the device."""
        beta1, beta2 = group["betas"]
        scalars = self._scalars.get(index)
        if scalars is None or (scalars.device, scalars.dtype) != (params[0].device, params[0].dtype):
            # the weights' own dtype, as a Python number is taken (float64 weights get float64 rates)
            scalars = self._scalars[index] = torch.zeros(3, dtype=params[0].dtype, device=params[0].device)
        for slot, value in enumerate((-group["lr"], 1 - beta1 ** step, math.sqrt(1 - beta2 ** step))):
            scalars[slot].fill_(value)
        update = _compiled_lamb(self.compile_backend) if self.compiled else _lamb_update
        update(params, [p.grad for p in params], exp_avg, exp_avg_sq, scalars, beta1, beta2, group["eps"],
               group["weight_decay"], bool(group["weight_decay"]) or group.get("adapt_all", False))


def _lamb_update(params: list[torch.Tensor], grads: list[torch.Tensor], exp_avg: list[torch.Tensor],
                 exp_avg_sq: list[torch.Tensor], scalars: torch.Tensor, beta1: float, beta2: float, eps: float,
                 weight_decay: float, adapt: bool) -> None:
    """One LAMB step of a group as multi-tensor kernels (a few launches for all its tensors), a function
    of its inputs alone so that torch.compile can take it whole: ``scalars`` holds (-lr, 1 - beta1^t,
    sqrt(1 - beta2^t)) as device tensors of the weights' dtype; the other hyper-parameters are constant
    over a run.
    ``adapt``: the trust ratio applies (weight decay, or ``adapt_all``)."""
    neg_lr, bias1, bias2_sqrt = scalars.unbind(0)
    torch._foreach_mul_(exp_avg, beta1)
    torch._foreach_add_(exp_avg, grads, alpha=1 - beta1)
    torch._foreach_mul_(exp_avg_sq, beta2)
    torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)
    denom = torch._foreach_sqrt(exp_avg_sq)
    torch._foreach_div_(denom, bias2_sqrt)
    torch._foreach_add_(denom, eps)
    updates = torch._foreach_div(exp_avg, denom)
    del denom
    torch._foreach_div_(updates, bias1)
    if weight_decay:
        torch._foreach_add_(updates, params, alpha=weight_decay)
    if adapt:
        w_norm = torch.stack(torch._foreach_norm(params))
        u_norm = torch.stack(torch._foreach_norm(updates))
        trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
        torch._foreach_mul_(updates, (trust * neg_lr).unbind(0))
    else:
        torch._foreach_mul_(updates, neg_lr)
    torch._foreach_add_(params, updates)


_compiled_lamb_steps: dict[str, object] = {}  # backend -> _lamb_update compiled so (per process)


def _compiled_lamb(backend: str):
    if backend not in _compiled_lamb_steps:
        _compiled_lamb_steps[backend] = torch.compile(_lamb_update, backend=backend, dynamic=False)
    return _compiled_lamb_steps[backend]


def _lamb_per_tensor(group: dict, params: list[torch.Tensor], exp_avg: list[torch.Tensor],
                     exp_avg_sq: list[torch.Tensor], step: int) -> None:
    """The same step tensor by tensor (about ten kernel launches each): the reference for the tests."""
    beta1, beta2 = group["betas"]
    adapt = bool(group["weight_decay"]) or group.get("adapt_all", False)
    for p, m, v in zip(params, exp_avg, exp_avg_sq):
        g = p.grad
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v.sqrt() / math.sqrt(1 - beta2 ** step)).add_(group["eps"])
        u = (m / denom) / (1 - beta1 ** step)
        if group["weight_decay"]:
            u.add_(p, alpha=group["weight_decay"])
        if not adapt:
            p.add_(u, alpha=-group["lr"])
            continue
        wn, un = p.norm(), u.norm()
        trust = torch.where((wn > 0) & (un > 0), wn / un, torch.ones_like(wn))
        p.sub_(u * (trust * group["lr"]))


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Trainable parameters, with biases and LayerNorm weights exempt from weight decay (BERT's rule)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, lr: float, fused: bool = True,
                    compiled: bool = False) -> torch.optim.Optimizer:
    """LAMB (always multi-tensor; ``compiled``: torch.compile'd, ``pretrain.speed.compile_optimizer``) or
    AdamW: with ``fused``, one fused kernel for all tensors on CUDA and CPU (``fused=True``) and multi-tensor
    ``foreach`` kernels elsewhere; without, the per-tensor loop. Build it after the model is on its
    device (the choice follows where the parameters are)."""
    groups = parameter_groups(model, cfg.weight_decay)
    if cfg.name == "lamb":
        return Lamb(groups, lr=lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay,
                    compiled=compiled)
    if compiled:  # PretrainConfig refuses the combination; a direct caller is told too
        raise ValueError("compiled=True compiles LAMB's update; AdamW's is one fused kernel on CUDA already")
    return torch.optim.AdamW(groups, lr=lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                             weight_decay=cfg.weight_decay, **adamw_kernel(model, fused))


def optimizer_for(model: torch.nn.Module, cfg: PretrainConfig, lr: float) -> torch.optim.Optimizer:
    """``build_optimizer`` with the run's ``optim`` settings and its ``speed`` switches (``fused_optimizer``,
    ``compile_optimizer``): what the loop and the GPU benchmark build."""
    return build_optimizer(model, cfg.optim, lr, fused=cfg.speed.fused_optimizer, compiled=cfg.speed.compile_optimizer)


def adamw_kernel(model: torch.nn.Module, fused: bool) -> dict[str, bool]:
    """AdamW's implementation switches: PyTorch's fused kernel where it runs (CUDA and CPU:
    ``fused_optimizer_runs``), foreach elsewhere, or neither (per tensor)."""
    if not fused:
        return {"foreach": False, "fused": False}
    return {"fused": True} if fused_optimizer_runs(model.parameters()) else {"foreach": True}


def lr_factor(step: int, warmup_steps: int, total_steps: int, power: float) -> float:
    """Multiplier of the peak LR for 0-based optimizer step ``step``: linear warm-up reaching 1 at
    the last warm-up step, then polynomial decay ((total - step) / (total - warmup)) ** power."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    remaining = max(total_steps - warmup_steps, 1)
    return max(0.0, (total_steps - step) / remaining) ** power


def build_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                    power: float) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup_steps, total_steps, power))
