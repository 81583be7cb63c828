"""Fine-tuning's optimizer and learning-rate schedule without ``torch.optim``: the same numbers, 1.1 s less a worker.

    optim = FusedAdam(groups, decoupled=True)        # AdamW(fused=True)'s update; decoupled=False: Adam's
    sched = LinearSchedule(optim.param_groups, warmup, total)   # transformers' linear warm-up and decay

``torch.optim.Optimizer`` imports ``torch._dynamo`` (and with it sympy and torch.distributed.tensor) the first
time a parameter group is added: about 1.1 s in each sweep worker before its first trial could train, more
than any other import left there once fine-tuning's BERT is the project's own (``modeling/bert.py``). A trial
needs none of it. ``FusedAdam.step`` calls the kernel ``AdamW(fused=True)`` / ``Adam(fused=True)`` call, with
the same state (moments, a float32 step count a parameter) and arguments, so the weights equal torch.optim's
bit for bit; ``LinearSchedule`` sets each group's learning rate to the same product ``LambdaLR`` and
transformers' ``get_linear_schedule_with_warmup`` form (``tests/test_finetune_optim.py``).

Used where that kernel runs (``precision.fused_optimizer_runs``: CPU and CUDA) and no fp16 loss scaler steps the
optimizer (``torch.amp.GradScaler.step`` wants a ``torch.optim.Optimizer``); elsewhere torch.optim's.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from orchestrator.finetune.trial import TrialSpec
from orchestrator.modeling.precision import fused_optimizer_runs

ADAM_BETAS, ADAM_EPS = (0.9, 0.999), 1e-8  # torch.optim.Adam(W)'s defaults


class FusedAdam:
    """Adam(W) over ``param_groups`` (each: ``params``, ``lr``, ``weight_decay``) through PyTorch's fused kernel:
    ``decoupled`` AdamW's decay (``torch._fused_adamw_``), else Adam's L2 (``torch._fused_adam_``). A parameter
    without a gradient is not stepped, as torch.optim leaves it."""

    #: ``step`` takes ``found_inf``: ``precision.optimizer_update(read=False)`` skips a step on the device
    skips_on_device = True

    def __init__(self, param_groups: list[dict[str, Any]], decoupled: bool):
        self.param_groups = [{**g, "params": list(g["params"])} for g in param_groups]
        self.decoupled = decoupled
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    @torch.no_grad()
    def step(self, found_inf: torch.Tensor | None = None) -> None:
        """One update of every parameter with a gradient. ``found_inf`` (a 0-d tensor on the parameters' device,
        true where the gradients are not finite): the kernel then leaves the weights and moments as they are and
        the step counts are put back, decided on the device (as torch.optim's fused step under a GradScaler)."""
        kernel = torch._fused_adamw_ if self.decoupled else torch._fused_adam_
        flag = None if found_inf is None else found_inf.to(torch.float32)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [self._state(p) for p in params]
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, 1)
            kernel(params, [p.grad for p in params], [s["exp_avg"] for s in states],
                   [s["exp_avg_sq"] for s in states], [], steps, amsgrad=False, lr=group["lr"], beta1=ADAM_BETAS[0],
                   beta2=ADAM_BETAS[1], weight_decay=group["weight_decay"], eps=ADAM_EPS, maximize=False,
                   grad_scale=None, found_inf=flag)
            if flag is not None:
                torch._foreach_sub_(steps, [flag] * len(steps))

    def _state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        """A parameter's moments and step count, made at its first step as torch.optim makes them (fused)."""
        state = self.state.get(p)
        if state is None:
            state = self.state[p] = {"step": torch.zeros((), dtype=torch.float32, device=p.device),
                                     "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                     "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        return state

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_()
                    p.grad.zero_()


def linear_factor(step: int, warmup: int, total: int) -> float:
    """transformers' ``get_linear_schedule_with_warmup`` factor at ``step``: up from 0 over ``warmup`` steps, then
    down to 0 at ``total``."""
    if step < warmup:
        return float(step) / float(max(1, warmup))
    return max(0.0, float(total - step) / float(max(1, total - warmup)))


class LinearSchedule:
    """``LambdaLR`` with ``linear_factor`` over ``param_groups``: each group's learning rate is its first one x the
    factor of the steps taken (0 at the start, as ``LambdaLR`` sets it when made)."""

    def __init__(self, param_groups: list[dict[str, Any]], warmup: int, total: int):
        self.param_groups, self.warmup, self.total = param_groups, warmup, total
        self.base_lrs = [group["lr"] for group in param_groups]
        self.last_epoch = -1
        self.step()

    def step(self) -> None:
        self.last_epoch += 1
        factor = linear_factor(self.last_epoch, self.warmup, self.total)
        for group, base in zip(self.param_groups, self.base_lrs):
            group["lr"] = base * factor

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.param_groups]


NO_DECAY = ("bias", "LayerNorm.weight", "norm.weight")  # AdamW's weight decay leaves these out (BERT's recipe)


def decays(name: str) -> bool:
    """Whether AdamW's weight decay applies to the parameter ``name``: every weight but biases and LayerNorm."""
    return not name.endswith(NO_DECAY)


def make_optimizer(trained: list[tuple[str, torch.nn.Parameter]],
                   trial: TrialSpec) -> FusedAdam | torch.optim.Optimizer:
    """``trial.optimizer``: 'adamw' decays every weight but biases and LayerNorm by ``trial.weight_decay``
    (BERT's recipe); 'adam' is Adam without weight decay (seed 000 fine-tuned with Adam). ``FusedAdam`` where
    PyTorch's fused kernel runs (CPU and CUDA: ``fused_optimizer_runs``) and no fp16 loss scaler steps it;
    elsewhere torch.optim's (fused under fp16, the default kernel on other devices)."""
    if trial.optimizer not in ("adam", "adamw"):
        raise ValueError(f"trial {trial.trial_id}: optimizer {trial.optimizer!r} is not adamw or adam")
    if trial.optimizer == "adam":
        groups = [{"params": [p for _, p in trained], "lr": trial.learning_rate, "weight_decay": 0.0}]
    else:
        groups = [{"params": [p for n, p in trained if decays(n)], "lr": trial.learning_rate,
                   "weight_decay": trial.weight_decay},
                  {"params": [p for n, p in trained if not decays(n)], "lr": trial.learning_rate, "weight_decay": 0.0}]
    fused = bool(trained) and fused_optimizer_runs(p for _, p in trained)
    if fused and trial.precision != "fp16":
        return FusedAdam(groups, decoupled=trial.optimizer == "adamw")
    kernel = {"fused": True} if fused else {}
    return (torch.optim.Adam if trial.optimizer == "adam" else torch.optim.AdamW)(groups, **kernel)


def linear_schedule(param_groups: list[dict[str, Any]], trial: TrialSpec, train_size: int) -> LinearSchedule:
    """BERT's schedule over an optimizer's ``param_groups``: linear warm-up over ``trial.warmup_proportion`` of
    the steps, then linear decay to 0 at the end of ``trial.max_epochs``."""
    total = math.ceil(train_size / trial.batch_size) * trial.max_epochs
    return LinearSchedule(param_groups, int(trial.warmup_proportion * total), total)


__all__ = ["ADAM_BETAS", "ADAM_EPS", "FusedAdam", "LinearSchedule", "decays", "linear_factor", "linear_schedule",
           "make_optimizer"]
