"""Fine-tuning's optimizer and schedule without torch.optim (orchestrator/finetune/optim.py): torch.optim's numbers."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from orchestrator.finetune.optim import FusedAdam, linear_schedule, make_optimizer
from orchestrator.finetune.trial import TrialSpec


def _trial(**kw) -> TrialSpec:
    return TrialSpec(trial_id="t", model_name="m", model_dir="", task="t", data_dir="", learning_rate=3e-2, seed=0,
                     eval_epochs=(3,), batch_size=4, warmup_proportion=0.25, **kw)


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.dense, self.LayerNorm, self.head = torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 2)
        self.unused = torch.nn.Linear(2, 2)  # no gradient: not stepped, as torch.optim leaves it

    def forward(self, x):
        return self.head(self.LayerNorm(self.dense(x)))


@pytest.mark.parametrize("optimizer", ["adamw", "adam"])
def test_weights_and_learning_rates_equal_torch_optim_and_transformers_schedule_bit_for_bit(optimizer):
    """Twelve steps of a warm-up then decay: every weight and learning rate equals AdamW(fused=True) /
    Adam(fused=True) under transformers' get_linear_schedule_with_warmup (LambdaLR), not approximately."""
    from transformers import get_linear_schedule_with_warmup

    from orchestrator.finetune.optim import decays

    trial = _trial(optimizer=optimizer)
    torch.manual_seed(0)
    ours_model = _Tiny()
    theirs_model = _Tiny()
    theirs_model.load_state_dict(ours_model.state_dict())
    ours = make_optimizer(list(ours_model.named_parameters()), trial)
    assert isinstance(ours, FusedAdam) and ours.decoupled == (optimizer == "adamw")
    named = list(theirs_model.named_parameters())
    if optimizer == "adam":
        theirs = torch.optim.Adam([p for _, p in named], lr=trial.learning_rate, weight_decay=0.0, fused=True)
    else:
        theirs = torch.optim.AdamW([{"params": [p for n, p in named if decays(n)], "weight_decay": 0.01},
                                    {"params": [p for n, p in named if not decays(n)], "weight_decay": 0.0}],
                                   lr=trial.learning_rate, fused=True)
    sched_ours = linear_schedule(ours.param_groups, trial, train_size=13)  # 4 steps an epoch x 3: 12, warm-up 3
    sched_theirs = get_linear_schedule_with_warmup(theirs, 3, 12)
    for step in range(12):
        x = torch.randn(4, 6) * (1 + step)
        for model, optim, sched in ((ours_model, ours, sched_ours), (theirs_model, theirs, sched_theirs)):
            model(x).pow(2).sum().backward()
            torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)
            optim.step()
            sched.step()
            optim.zero_grad(set_to_none=True)
        assert sched_ours.get_last_lr() == sched_theirs.get_last_lr()
        for (name, a), b in zip(ours_model.named_parameters(), theirs_model.parameters()):
            assert torch.equal(a, b), (step, name)
    assert sched_ours.get_last_lr() == [0.0] * len(ours.param_groups)  # decayed to 0 at the last step
    assert torch.equal(ours_model.unused.weight, theirs_model.unused.weight)


def test_a_step_with_non_finite_gradients_is_skipped_on_the_device_and_a_finite_one_is_unchanged():
    """``optimizer_update(read=False)`` (fine-tuning's step): no value read back, the norm and the skip as tensors.
    A finite step's weights equal the step that reads the norm, bit for bit; a step whose gradients hold an inf
    leaves every weight, moment and step count as they were (the kernel's ``found_inf``), as the reading step did."""
    from orchestrator.modeling.precision import make_scaler, optimizer_update

    torch.manual_seed(0)
    models = [_Tiny(), _Tiny()]
    models[1].load_state_dict(models[0].state_dict())
    trial = _trial()
    runs = []
    for model in models:
        optim = make_optimizer(list(model.named_parameters()), trial)
        runs.append((model, optim, linear_schedule(optim.param_groups, trial, train_size=13)))
    scaler = make_scaler("fp32", torch.device("cpu"), init_scale=1.0)
    for step in range(4):
        x = torch.randn(4, 6)
        if step == 2:
            x[0, 0] = float("inf")
        results = []
        for (model, optim, sched), read in zip(runs, (True, False)):
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            moments = {id(p): {k: v.clone() for k, v in st.items()} for p, st in optim.state.items()}
            model(x).pow(2).sum().backward()
            norm, skipped = optimizer_update([p for p in model.parameters()], optim, sched, scaler, 1.0, read=read)
            results.append((norm, skipped))
            if step == 2:  # skipped: nothing moved, the schedule did
                assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
                assert all(torch.equal(v, moments[id(p)][k]) for p, st in optim.state.items() for k, v in st.items())
        (norm_read, skipped_read), (norm_dev, skipped_dev) = results
        assert isinstance(norm_read, float) and isinstance(skipped_read, bool)
        assert torch.is_tensor(norm_dev) and torch.is_tensor(skipped_dev)
        assert bool(skipped_dev) == skipped_read == (step == 2)
        for (name, a), b in zip(models[0].named_parameters(), models[1].parameters()):
            assert torch.equal(a, b), (step, name)
    assert {float(st["step"]) for st in runs[1][1].state.values()} == {3.0}  # 4 steps, one skipped


def test_fp16_and_unfused_devices_keep_torch_optim():
    """A loss scaler steps a torch.optim optimizer (GradScaler.step wants one): fp16 trials keep AdamW(fused)."""
    params = [("dense.weight", torch.nn.Parameter(torch.ones(2)))]
    optim = make_optimizer(params, _trial(precision="fp16"))
    assert type(optim) is torch.optim.AdamW and optim.defaults["fused"]
    with pytest.raises(ValueError, match="not adamw or adam"):
        make_optimizer(params, _trial(optimizer="sgd"))


def test_a_trial_step_imports_no_dynamo():
    """The point of it: torch.optim's first parameter group imports torch._dynamo (about 1.1 s a sweep worker);
    FusedAdam and the schedule step without it."""
    script = """
import sys, torch
from orchestrator.finetune.optim import linear_schedule, make_optimizer
from orchestrator.finetune.trial import TrialSpec
trial = TrialSpec(trial_id="t", model_name="m", model_dir="", task="t", data_dir="", learning_rate=1e-3, seed=0,
                  eval_epochs=(1,))
p = torch.nn.Parameter(torch.zeros(3, 3))
optim = make_optimizer([("w", p)], trial)
sched = linear_schedule(optim.param_groups, trial, 64)
p.grad = torch.ones(3, 3)
optim.step(); sched.step(); optim.zero_grad()
print("torch._dynamo" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
