"""This project's LAMB against pytorch-optimizer's (issue 14): the same algorithm where the two are
meant to agree, and the differences that are why the project keeps its own (docs/METHODS.md).

pytorch-optimizer 4.1.0's ``Lamb`` differs from the paper's Algorithm 2 and NVIDIA's FusedLAMB in
four ways: (1) it divides the step by 1 - beta1^t *after* the trust ratio, so early steps are up to
10x larger (the paper corrects m inside u, where the trust ratio normalises it away); (2) it does
not bias-correct v; (3) it clamps ||w|| at 10 in the trust ratio, which caps the step of every
BERT-base weight matrix (their norms are 15-30); (4) by default it adapts every tensor, biases and
LayerNorm included, and decays weights outside the update. Undo (1) and (2) by the learning rate
each step, and (3), (4) by its options, and the two trajectories are the same to float64 rounding.
"""
from __future__ import annotations

import math

import pytest
import torch

from orchestrator.pretrain.optim import Lamb

reference = pytest.importorskip("pytorch_optimizer")

LR, BETAS, STEPS = 0.01, (0.9, 0.999), 40
EPS = 1e-30  # where the two add eps differs (after or before the v correction): make it vanish


def _problem(seed: int = 0) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """A two-layer regression in float64; the first matrix has norm ~16, above the clamp of 10."""
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(32, 16, generator=g, dtype=torch.float64) * 0.7
    b1 = torch.randn(32, generator=g, dtype=torch.float64) * 0.1
    w2 = torch.randn(1, 32, generator=g, dtype=torch.float64) * 0.2
    x = torch.randn(64, 16, generator=g, dtype=torch.float64)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    return [w1, b1, w2], x, y


def _loss(params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    w1, b1, w2 = params
    return ((torch.tanh(x @ w1.T + b1) @ w2.T - y) ** 2).mean()


def _run(make_optimizer, lr_at=None) -> tuple[list[torch.Tensor], list[float]]:
    """Full-batch training for STEPS steps; ``lr_at(t)`` (t from 1) sets every group's lr before step t."""
    start, x, y = _problem()
    params = [p.clone().requires_grad_(True) for p in start]
    opt = make_optimizer(params)
    losses = []
    for t in range(1, STEPS + 1):
        if lr_at is not None:
            for group in opt.param_groups:
                group["lr"] = lr_at(t)
        opt.zero_grad()
        loss = _loss(params, x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return [p.detach() for p in params], losses


def _reference(params, *, adam: bool, clamp: float = math.inf, **kwargs):
    opt = reference.Lamb(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0, weight_decouple=False,
                         adam=adam, foreach=False, **kwargs)
    opt.clamp = clamp
    return opt


def test_trust_ratio_steps_agree_once_the_bias_correction_and_clamp_are_undone():
    ours, ours_losses = _run(lambda ps: Lamb(ps, lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0, adapt_all=True))
    # theirs multiplies the normalised step by 1 / (1 - beta1^t): give it lr * (1 - beta1^t)
    theirs, their_losses = _run(lambda ps: _reference(ps, adam=False),
                                lr_at=lambda t: LR * (1 - BETAS[0] ** t))
    assert ours_losses[-1] < 0.5 * ours_losses[0]  # the problem is learned, not a no-op
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_adam_steps_agree_once_the_second_moment_correction_is_undone():
    # no weight decay and no adapt_all: this Lamb takes plain Adam steps (biases, LayerNorm)
    ours, _ = _run(lambda ps: Lamb(ps, lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0))
    # theirs: lr/(1-b1^t) * m/sqrt(v); ours: lr * (m/(1-b1^t)) / sqrt(v/(1-b2^t)); lr * sqrt(1-b2^t) bridges them
    theirs, _ = _run(lambda ps: _reference(ps, adam=True), lr_at=lambda t: LR * math.sqrt(1 - BETAS[1] ** t))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_with_its_defaults_the_first_step_is_ten_times_larger_and_clamped():
    start, x, y = _problem()
    steps = {}
    for name, make in (("ours", lambda ps: Lamb(ps, lr=LR, betas=BETAS, weight_decay=0.01, adapt_all=True)),
                       ("theirs", lambda ps: reference.Lamb(ps, lr=LR, betas=BETAS, weight_decay=0.01))):
        params = [p.clone().requires_grad_(True) for p in start]
        opt = make(params)
        _loss(params, x, y).backward()
        opt.step()
        steps[name] = [(p.detach() - s).norm().item() for p, s in zip(params, start)]
    w1_norm = start[0].norm().item()
    assert w1_norm > 10
    # the paper's trust ratio: each tensor moves by lr * ||w||
    assert steps["ours"][0] == pytest.approx(LR * w1_norm, rel=1e-6)
    # theirs: lr / (1 - beta1) * min(||w||, 10), i.e. 10 x the step, with the norm capped at 10
    assert steps["theirs"][0] == pytest.approx(LR / (1 - BETAS[0]) * 10.0, rel=1e-3)
    assert steps["theirs"][2] / steps["ours"][2] == pytest.approx(1 / (1 - BETAS[0]), rel=1e-3)
