"""Learning-rate bundles (orchestrator.finetune.bundle): trials trained as one batched computation give
the records the separate trials give."""
from __future__ import annotations

import pytest

from orchestrator.finetune.trial import TrialSpec


def _trials(tiny_bert, task: str, lrs: tuple[float, ...], **settings) -> list[TrialSpec]:
    from orchestrator.finetune.spec import SAMPLE_DIR, load_task

    base = dict(model_name="tiny", model_dir=str(tiny_bert), task=task, data_dir=str(SAMPLE_DIR / load_task(task).dir),
                seed=2, batch_size=16, max_seq_length=48, eval_epochs=(1, 3))
    return [TrialSpec(trial_id=f"{task}-{i}", learning_rate=lr, **{**base, **settings}) for i, lr in enumerate(lrs)]


def _assert_same_record(bundled: dict, alone: dict) -> None:
    """The same trial, its scores and predictions; losses equal up to float rounding (the batched matrix
    products add in another order: in fp32 ~1e-7 after an epoch, which a high learning rate grows to ~1e-4 in
    three; in bf16 both round every activation, each in its own order (the bundle adds a linear layer's bias
    after rounding its product): up to ~1e-4 after one epoch, which three at 1e-2 grow to ~3e-3); the counts
    are the trial's, the times the bundle's shared out."""
    assert bundled["trial"] == alone["trial"] and bundled["trial_id"] == alone["trial_id"]
    assert bundled["bundle"]["size"] > 1 and alone["trial_id"] in bundled["bundle"]["trial_ids"]
    assert [r["epoch"] for r in bundled["epochs"]] == [r["epoch"] for r in alone["epochs"]]
    for b, a in zip(bundled["epochs"], alone["epochs"]):
        assert set(b) == set(a)
        fp32 = alone["trial"]["precision"] == "fp32"
        first, later = (1e-5, 2e-3) if fp32 else (2e-4, 6e-3)
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=first if b["epoch"] == 1 else later)
        for split in ("dev", "test"):
            if split in a:  # a correlation of near-constant predictions moves with their rounding; the rest count
                assert b[split] == pytest.approx(a[split], abs=2e-3 if bundled["task"] == "BIOSSES" else 1e-12)
    assert bundled["predictions"].keys() == alone["predictions"].keys()
    for epoch, pred in alone["predictions"].items():
        if isinstance(pred["test"][0], float):  # regression: scores to float rounding
            assert bundled["predictions"][epoch]["test"] == pytest.approx(pred["test"], rel=1e-3, abs=1e-4)
        else:
            assert bundled["predictions"][epoch]["test"] == pred["test"]
    assert bundled["per_tag"] == alone["per_tag"] and bundled.get("early_stopping") == alone.get("early_stopping")
    counts = {k: v for k, v in bundled["counts"].items() if not k.endswith("seconds")}
    assert counts == {k: v for k, v in alone["counts"].items() if not k.endswith("seconds")}


@pytest.mark.parametrize("task,lrs,settings", [
    ("chemprot", (1e-3, 3e-3, 3e-2), {"reinit_layers": 1}),  # classification, AdamW with weight decay, top layer
                                                                # re-initialised
    # NER, seed 000's Adam, bf16 autocast: its rounding is ~1e3 times fp32's, and at 3e-2 three epochs grow
    # it into other predictions (dev F1 1.0 vs 0.86 in one run), as they would on another GPU; not at 1e-2
    ("bc5cdr_chemical", (1e-3, 3e-3, 1e-2), {"optimizer": "adam", "precision": "bf16"}),
    ("biosses", (1e-3, 3e-3, 3e-2), {"tune": "adapters", "patience": 1, "eval_epochs": (4,)}),  # regression,
])                                                                       # a frozen encoder, early stopping
def test_a_bundle_gives_each_trial_the_record_it_gets_alone(tiny_bert, task, lrs, settings):
    from orchestrator.finetune.bundle import run_bundle
    from orchestrator.finetune.loop import run_trial

    trials = _trials(tiny_bert, task, lrs, **settings)
    reports: list[dict] = []
    bundled = run_bundle(trials, report=reports.append)
    alone = [run_trial(t) for t in trials]
    for b, a in zip(bundled, alone):
        _assert_same_record(b, a)
    assert len({str(a["predictions"]) for a in alone}) > 1  # the learning rates train different models
    assert [r["epoch"] for r in reports] == list(range(1, max(len(a["epochs"]) for a in alone) + 1))
    assert sum(b["counts"]["train_seconds"] for b in bundled) <= bundled[0]["bundle"]["seconds"]
    if settings.get("patience"):
        assert any(a["early_stopping"]["stopped_epoch"] < 4 for a in alone)  # a trial stopped early, on its own


def test_the_bundled_forwards_compute_attention_in_a_form_vmap_batches_on_every_device(tiny_bert):
    """vmap of SDPA's fused CUDA kernels failed in the first GPU runs of a bundle: with dropout (random draws
    on a batched input under ``randomness="same"``) and without (efficient attention's batching rule and
    BERT's broadcast mask). The bundle's forwards run no SDPA: attention as its math path computes it, the
    same masks and loss as one trial's plain forward, which does run SDPA (so the check can fail); the
    bundle's predictions are each row's own."""
    import torch
    from torch.func import functional_call
    from torch.nn import functional as F
    from torch.profiler import profile

    from orchestrator.finetune.bundle import StackedWeights, _attention, _batched_loss, _predict
    from orchestrator.finetune.loop import _batches, build_model, predict_with, prepare

    q, k, v = torch.randn(3, 2, 4, 16, 8).unbind(0)
    mask = torch.rand(2, 1, 16, 16) > 0.2
    mask[..., 0] = True
    for kwargs in ({"attn_mask": mask}, {"attn_mask": torch.where(mask, 0.0, -1e4)}, {"is_causal": True}, {}):
        torch.manual_seed(0)
        want = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, **kwargs)
        torch.manual_seed(0)
        torch.testing.assert_close(_attention(q, k, v, dropout_p=0.1, **kwargs), want, rtol=1e-6, atol=1e-6)

    trial = _trials(tiny_bert, "chemprot", (1e-3, 3e-3))[0]
    prep = prepare(trial)
    model = build_model(trial, prep)
    stack = StackedWeights(model, [1e-3, 3e-3], 0.01, decoupled=True)
    _, batch, labels = next(iter(_batches(prep.enc["train"], list(range(16)), 16, prep.pad_id, prep.device)))
    model.train()
    with profile() as bundled:
        torch.manual_seed(0)
        losses = _batched_loss(model, stack)(batch, labels)
    assert "aten::scaled_dot_product_attention" not in {e.name for e in bundled.events()}
    assert "aten::dropout" in {e.name for e in bundled.events()}
    with profile() as plain:
        torch.manual_seed(0)
        params = {k: v[0] for k, v in stack.params.items()}
        alone = model.loss(functional_call(model, (params, stack.shared), kwargs=batch).float(), labels)
    assert "aten::scaled_dot_product_attention" in {e.name for e in plain.events()}
    assert losses[0].item() == pytest.approx(alone.item(), rel=1e-6) and losses[0].item() == losses[1].item()

    with torch.no_grad():  # rows with different weights: row 1 predicts the head's last class everywhere
        stack.flat[1].mul_(1.5)
        stack.params["head.bias"][1, -1] += 100.0
    with profile() as predicted:
        preds = _predict(model, stack, prep, "dev", 16)
    assert "aten::scaled_dot_product_attention" not in {e.name for e in predicted.events()}
    for t in range(2):
        params = {k: v[t].detach() for k, v in stack.params.items()}
        alone_preds = predict_with(lambda batch, params=params: functional_call(model, (params, stack.shared),
                                                                               kwargs=batch)[None],
                                   1, prep.spec, prep.enc["dev"], 16, prep.pad_id, prep.device)
        assert preds[t] == alone_preds[0]
    assert preds[0] != preds[1]


def test_a_bf16_bundle_computes_in_the_dtypes_of_its_trial_alone(tiny_bert):
    """vmap's rule for a linear layer with a bias adds the bias after autocast's bf16 product, so the sum came
    out fp32 (torch 2.13): every activation of a "bf16" bundle was fp32 (twice the memory, a cast before each
    matmul). Under autocast each module of the bundle's forward now gives its output in the dtype the trial's
    own forward gives (bf16 linear layers, fp32 LayerNorm), and the loss to bf16's rounding; without autocast,
    fp32 throughout (the plain ``F.linear``, not the bias added apart) and the trial's loss to fp32's."""
    import torch
    from torch.func import functional_call

    from orchestrator.finetune.bundle import StackedWeights, _batched_loss
    from orchestrator.finetune.loop import _batches, build_model, prepare
    from orchestrator.modeling.precision import autocast_context

    trial = _trials(tiny_bert, "chemprot", (1e-3, 3e-3), precision="bf16")[0]
    prep = prepare(trial)
    model = build_model(trial, prep)
    stack = StackedWeights(model, [1e-3, 3e-3], 0.01, decoupled=True)
    _, batch, labels = next(iter(_batches(prep.enc["train"], list(range(16)), 16, prep.pad_id, prep.device)))
    model.eval()  # no dropout: the two forwards compare value for value
    seen: dict[str, list[torch.dtype]] = {}
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.LayerNorm)):
            module.register_forward_hook(lambda _m, _i, out, name=name: seen.setdefault(name, []).append(out.dtype))
    params = {k: v[0] for k, v in stack.params.items()}
    for precision in ("bf16", "fp32"):
        seen.clear()
        with autocast_context(precision, prep.device):
            alone = model.loss(functional_call(model, (params, stack.shared), kwargs=batch).float(), labels)
            alone_dtypes = {name: dtypes[0] for name, dtypes in seen.items()}
            seen.clear()
            losses = _batched_loss(model, stack)(batch, labels)
        bundled_dtypes = {name: dtypes[0] for name, dtypes in seen.items()}
        assert bundled_dtypes == alone_dtypes and len(alone_dtypes) > 10, precision
        wanted = torch.bfloat16 if precision == "bf16" else torch.float32
        assert alone_dtypes["encoder.encoder.layer.0.intermediate.dense"] == wanted
        assert alone_dtypes["encoder.encoder.layer.0.output.LayerNorm"] == torch.float32
        # each rounds its activations (bf16: independently), so the losses agree to that rounding
        assert losses[0].item() == pytest.approx(alone.item(), rel=1e-3 if precision == "bf16" else 1e-6)


def test_a_bundle_that_fails_before_its_first_epoch_ends_trains_its_trials_alone(tiny_bert, monkeypatch, caplog):
    """A device that cannot run the bundle (the first GPU runs: a vmap batching rule refused) costs the
    sweep its batching, not its trials: they train alone, their records as ``run_trial`` gives them and
    marked; after an epoch has ended (reported) a failure is raised, not hidden."""
    from orchestrator.finetune import bundle
    from orchestrator.finetune.loop import run_trial

    message = "Vmap does not currently support same randomness with a batched tensor input."
    real, epochs_seen = bundle._batched_loss, []

    def failing(model, stack, *rest):
        losses = real(model, stack, *rest)

        def fail_after(batch, labels):
            if len(epochs_seen) >= fail_at:
                raise RuntimeError(message)
            return losses(batch, labels)
        return fail_after

    monkeypatch.setattr(bundle, "_batched_loss", failing)
    trials = _trials(tiny_bert, "chemprot", (1e-3, 3e-3), eval_epochs=(1, 2))
    fail_at = 0
    with caplog.at_level("WARNING", logger="orchestrator.finetune.bundle"):
        records = bundle.run_bundle(trials, report=epochs_seen.append)
    assert "failed before its first epoch ended" in caplog.text
    for record, want in zip(records, [run_trial(t) for t in trials]):
        ids = [t.trial_id for t in trials]
        assert record["bundle_failed"] == {"trial_ids": ids, "error": f"RuntimeError: {message}"}
        assert record["predictions"] == want["predictions"] and "bundle" not in record
        assert [r["train_loss"] for r in record["epochs"]] == [r["train_loss"] for r in want["epochs"]]
    assert [len(e["rows"]) for e in epochs_seen] == [1, 1, 1, 1]  # each trial's 2 epochs, one row each

    epochs_seen.clear()
    fail_at = 1
    with pytest.raises(RuntimeError, match="same randomness"):
        bundle.run_bundle(trials, report=epochs_seen.append)
    assert len(epochs_seen) == 1


def test_a_trials_seconds_do_not_move_with_the_wall_clocks_steps(tiny_bert, monkeypatch):
    """A step of the wall clock during a trial (an NTP correction, a VM's clock catching up: a step of about
    16.5 s is what one run of benchmarks/sweep_overhead.py on this project's host showed, inferred from its
    impossible figures) is not the trial's time: a trial's and a bundle's seconds are on the monotonic
    clock. Here the wall clock steps an hour at every read."""
    import itertools
    import time

    from orchestrator.finetune.bundle import run_bundle
    from orchestrator.finetune.loop import run_trial

    wall, steps = time.time, itertools.count()
    monkeypatch.setattr(time, "time", lambda: wall() + 3600 * next(steps))
    trials = _trials(tiny_bert, "biosses", (1e-3, 3e-3), eval_epochs=(1,))
    records = [*run_bundle(trials), run_trial(trials[0])]
    for rec in records:
        counts = rec["counts"]
        assert 0 < counts["train_seconds"] + counts["eval_seconds"] <= rec["seconds"] + 1e-3 < 600  # rounded to ms


def test_a_trial_whose_gradients_are_not_finite_skips_its_step_and_the_others_do_not():
    """Each row takes the step of PyTorch's AdamW as ``run_trial`` makes it (``make_optimizer``: no decay on
    biases and LayerNorm), clipped by its own norm; a row with an inf gradient is left as it was, its moments
    and step count too, as the separate loop skips a non-finite step; the other rows step."""
    import copy

    import torch

    from orchestrator.finetune.bundle import StackedWeights
    from orchestrator.finetune.optim import make_optimizer

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dense, self.LayerNorm = torch.nn.Linear(4, 3), torch.nn.LayerNorm(3)

        def forward(self, x):
            return self.LayerNorm(self.dense(x))

    torch.manual_seed(0)
    model = Tiny()
    lrs = [1e-2, 5e-2, 1e-1]
    stack = StackedWeights(model, lrs, weight_decay=0.01, decoupled=True)
    refs = [copy.deepcopy(model) for _ in lrs]
    optims = [make_optimizer(list(ref.named_parameters()),
                             TrialSpec(trial_id="r", model_name="m", model_dir="", task="t", data_dir="",
                                       learning_rate=lr, seed=0, eval_epochs=(1,), weight_decay=0.01))
              for ref, lr in zip(refs, lrs)]
    for step in range(3):
        x = torch.randn(5, 4) * (1 + step)
        for t, (ref, optim) in enumerate(zip(refs, optims)):
            out = torch.func.functional_call(model, {k: v[t] for k, v in stack.params.items()}, (x,))
            out.pow(2).sum().mul(10.0).backward()  # large enough that clipping acts
            ref(x).pow(2).sum().mul(10.0).backward()
            if step == 1 and t == 1:
                stack.grad[1, 0] = float("inf")
                ref.dense.weight.grad[0, 0] = float("inf")
            norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
            if torch.isfinite(norm):
                optim.step()
            optim.zero_grad()
        before = stack.flat.clone()
        stack.step(factor=1.0, grad_clip=1.0)
        if step == 1:
            assert torch.equal(stack.flat[1], before[1]) and stack.steps.flatten().tolist() == [2, 1, 2]
        assert not stack.grad.any()
        for t, ref in enumerate(refs):
            want = torch.cat([dict(ref.named_parameters())[n].detach().flatten() for n in stack.names])
            torch.testing.assert_close(stack.flat[t], want, rtol=1e-4, atol=1e-5)  # steps are ~1e-2
    assert not torch.equal(stack.flat[0], stack.flat[2])


def test_trials_are_grouped_by_everything_but_their_learning_rate(tiny_bert):
    from orchestrator.finetune.trial import group_trials

    a = _trials(tiny_bert, "chemprot", (1e-3, 2e-3))
    b = _trials(tiny_bert, "chemprot", (1e-3, 2e-3), seed=3)
    fp16 = _trials(tiny_bert, "chemprot", (1e-3, 2e-3), precision="fp16")
    groups = group_trials([a[0], b[0], fp16[0], a[1], fp16[1], b[1]], bundle=True)
    assert [[t.trial_id for t in g] for g in groups] == [[a[0].trial_id, a[1].trial_id], [b[0].trial_id, b[1].trial_id],
                                                         [fp16[0].trial_id], [fp16[1].trial_id]]
    assert [len(g) for g in group_trials(a + b, bundle=False)] == [1, 1, 1, 1]


def _sibling(tiny_bert, out, seed: int, **config):
    """A model of ``tiny_bert``'s tokenizer and (but for ``config``) architecture, with other weights (``seed``)."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    out.mkdir()
    cfg = BertConfig.from_pretrained(tiny_bert)
    for key, value in config.items():
        setattr(cfg, key, value)
    torch.manual_seed(seed)
    BertModel(cfg).save_pretrained(out)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_bert / name).is_file():
            shutil.copy(tiny_bert / name, out / name)
    return out


def test_models_of_one_architecture_and_tokenizer_bundle_together_each_row_from_its_own_weights(tiny_bert, tmp_path):
    """sweep.bundle_models: an arm and its untrained floor share a tokenizer and an architecture, so their
    trials of one setting read the same batches, start the same head and draw the same dropout masks; in
    one bundle each trial's record is the one it gets alone, its row starting from its own model's weights.
    A model of another architecture or tokenizer, or adapter tuning (a frozen base differs), stays apart."""
    import dataclasses
    import json

    from orchestrator.finetune.bundle import run_bundle
    from orchestrator.finetune.loop import run_trial
    from orchestrator.finetune.trial import bundle_key, group_trials, model_family

    other = _sibling(tiny_bert, tmp_path / "other", seed=1)
    wider = _sibling(tiny_bert, tmp_path / "wider", seed=1, intermediate_size=96)
    retok = _sibling(tiny_bert, tmp_path / "retok", seed=1)
    vocab = (retok / "tokenizer.json")
    vocab.write_text(json.dumps({**json.loads(vocab.read_text()), "truncation": {"max_length": 7, "strategy":
                                 "LongestFirst", "stride": 0, "direction": "Right"}}))
    assert model_family(str(other)) == model_family(str(tiny_bert)) is not None
    assert len({model_family(str(d)) for d in (tiny_bert, wider, retok)}) == 3
    assert model_family(str(tmp_path)) is None  # no config.json

    a = _trials(tiny_bert, "chemprot", (1e-3, 3e-3))
    def of(model_dir) -> list:
        return [dataclasses.replace(t, trial_id=f"{model_dir.name}-{i}", model_name=model_dir.name,
                                    model_dir=str(model_dir)) for i, t in enumerate(a)]

    def ids(groups) -> list:
        return [[t.trial_id for t in g] for g in groups]

    b, c = of(other), of(wider)
    assert ids(group_trials(a + b + c, bundle=True, models=True)) == [[t.trial_id for t in a + b],
                                                                      [t.trial_id for t in c]]
    assert ids(group_trials(a + b, bundle=True)) == [[t.trial_id for t in a], [t.trial_id for t in b]]
    adapters = [dataclasses.replace(t, tune="adapters") for t in a + b]
    assert len(group_trials(adapters, bundle=True, models=True)) == 2
    assert bundle_key(a[0], model_family(str(tiny_bert))) == bundle_key(b[0], model_family(str(other)))

    trials = [a[0], b[0], a[1], b[1]]
    bundled = run_bundle(trials)
    alone = [run_trial(t) for t in trials]
    for got, want in zip(bundled, alone):
        assert "bundle_failed" not in got
        _assert_same_record(got, want)
    assert bundled[0]["bundle"]["trial_ids"] == [t.trial_id for t in trials]
    # the models' own weights: the same learning rate from the two models trains two different models
    assert alone[0]["epochs"][0]["train_loss"] != pytest.approx(alone[1]["epochs"][0]["train_loss"], rel=1e-3)
    with pytest.raises(ValueError, match="differ in more than"):
        run_bundle([a[0], c[0]])


def test_models_whose_builds_draw_other_random_numbers_train_alone(tiny_bert, tmp_path, caplog):
    """A checkpoint lacking weights (here the pooler) draws them when it loads, so its trial's dropout
    stream is not the other model's: the bundle finds it at its start and its trials train alone."""
    import dataclasses

    from safetensors.torch import load_file, save_file

    from orchestrator.finetune.bundle import run_bundle
    from orchestrator.finetune.loop import run_trial
    from orchestrator.finetune.trial import group_trials

    lacking = _sibling(tiny_bert, tmp_path / "lacking", seed=1)
    weights = load_file(lacking / "model.safetensors")
    save_file({k: v for k, v in weights.items() if "pooler" not in k}, lacking / "model.safetensors",
              metadata={"format": "pt"})
    a = _trials(tiny_bert, "chemprot", (1e-3,), eval_epochs=(1,))
    b = [dataclasses.replace(a[0], trial_id="lacking", model_name="lacking", model_dir=str(lacking))]
    assert len(group_trials(a + b, bundle=True, models=True)) == 1  # the files alone cannot tell
    with caplog.at_level("WARNING", logger="orchestrator.finetune.bundle"):
        records = run_bundle(a + b)
    assert "drew different random numbers" in caplog.text
    for record, want in zip(records, [run_trial(t) for t in a + b]):
        assert "random numbers" in record["bundle_failed"]["error"]
        assert record["predictions"] == want["predictions"]


def test_the_dry_run_says_how_many_ray_trials_the_run_starts(tiny_bert):
    """Probe D item 4: with auto (the default) on a machine without GPUs the dry run promised bundles the run
    did not make, and with fp16 (never bundled) '15 Ray trial(s), each training the 3 learning rates'."""
    import dataclasses

    from orchestrator.sweep.config import SweepConfig
    from orchestrator.sweep.runner import plan_sweep

    cfg = SweepConfig(search_space="tiny", tasks=("chemprot",), learning_rates=(1e-3, 3e-2), seeds=(1, 2),
                      epochs={"chemprot": (1, 2)})
    plan = plan_sweep(cfg, {"t": tiny_bert})
    assert ("learning rates bundled if the trials get GPUs (auto; sweep.gpus_per_trial -1 gives each one when the "
            "machine or cluster has or can start GPUs): 2 Ray trial(s), each training the 2 learning rates of one "
            "setting as one batched computation; on CPUs 4 Ray trial(s), one a trial") in plan
    assert ("learning rates not bundled (auto bundles GPU trials; sweep.gpus_per_trial is 0): 4 Ray trial(s)"
            in plan_sweep(dataclasses.replace(cfg, gpus_per_trial=0.0), {"t": tiny_bert}))
    assert "learning rates bundled (auto): 2 Ray trial(s)" in plan_sweep(dataclasses.replace(cfg, gpus_per_trial=0.5),
                                                                         {"t": tiny_bert})
    fp16 = dataclasses.replace(cfg, precision="fp16", bundle_learning_rates="on")
    assert ("learning rates not bundled: 4 Ray trial(s), one a trial (fp16 trials train alone, each with its own "
            "loss scaler)") in plan_sweep(fp16, {"t": tiny_bert})


def test_a_bundled_sweep_records_each_trial_and_restores_one_alone(tiny_bert, ray_local, tmp_path):
    """sweep.bundle_learning_rates=on: the two learning rates of a (task, seed) are one Ray trial whose records
    are written per trial; a lost record is trained again alone and comes back as the bundle had it."""
    import json

    from orchestrator.sweep.config import SweepConfig
    from orchestrator.sweep.runner import plan_sweep, run_sweep

    cfg = SweepConfig(search_space="tiny", tasks=("chemprot",), learning_rates=(1e-3, 3e-2), seeds=(1,),
                      epochs={"chemprot": (1, 2)}, bundle_learning_rates="on")
    assert "learning rates bundled (on): 1 Ray trial(s)" in plan_sweep(cfg, {"tiny": tiny_bert})
    out = tmp_path / "sweep"
    first = run_sweep(cfg, {"tiny": tiny_bert}, out, None, tmp_path)
    assert (first.ran, first.skipped) == (2, 0)
    records = {p.name: json.loads(p.read_text()) for p in (out / "trials").glob("*.json")}
    assert len(records) == 2 and all(r["bundle"]["size"] == 2 for r in records.values())
    assert len(list(out.glob("tune/*/*/result.json"))) == 1  # one Ray trial, holding one trial's slot
    assert json.loads((out / "manifest.json").read_text())["cost"]["units"] == cfg.cpus_per_trial
    cell = first.results["cells"]["tiny"]["ChemProt"]
    assert cell["selected"]["learning_rate"] in (1e-3, 3e-2) and [p["epoch"] for p in cell["curve"]] == [1, 2]

    lost = sorted(records)[1]
    (out / "trials" / lost).unlink()
    second = run_sweep(cfg, {"tiny": tiny_bert}, out, None, tmp_path)
    assert (second.ran, second.skipped) == (1, 1)
    alone = json.loads((out / "trials" / lost).read_text())
    assert "bundle" not in alone
    _assert_same_record(records[lost], alone)
    assert second.results["cells"]["tiny"]["ChemProt"]["selected"] == cell["selected"]


def test_a_sweep_bundles_the_trials_of_two_models_of_one_family_into_one_ray_trial(tiny_bert, ray_local, tmp_path):
    """Two models of one tokenizer and architecture (an arm and its floor): their trials of a (task, seed)
    are one Ray trial; each model keeps its own records, cell and share of the sweep's device time."""
    import json

    from orchestrator.sweep.config import SweepConfig
    from orchestrator.sweep.runner import plan_sweep, run_sweep

    models = {"tiny": tiny_bert, "floor": _sibling(tiny_bert, tmp_path / "floor", seed=1)}
    settings = dict(search_space="tiny", tasks=("chemprot",), learning_rates=(1e-3, 3e-2), seeds=(1,),
                    epochs={"chemprot": (1,)}, bundle_learning_rates="on")
    cfg = SweepConfig(**settings)
    assert "learning rates bundled (on): 1 Ray trial(s)" in plan_sweep(cfg, models)
    assert "learning rates bundled (on): 2 Ray trial(s)" in plan_sweep(SweepConfig(**settings, bundle_models=False),
                                                                       models)
    out = tmp_path / "sweep"
    result = run_sweep(cfg, models, out, None, tmp_path)
    assert (result.ran, result.skipped) == (4, 0)
    assert len(list(out.glob("tune/*/*/result.json"))) == 1
    records = [json.loads(p.read_text()) for p in (out / "trials").glob("*.json")]
    assert sorted(r["trial"]["model_name"] for r in records) == ["floor", "floor", "tiny", "tiny"]
    assert all(r["bundle"]["size"] == 4 for r in records)
    assert set(result.results["cells"]) == {"tiny", "floor"}
    cost = json.loads((out / "manifest.json").read_text())["cost"]
    assert set(cost["by_model"]) == {"tiny", "floor"}
    assert sum(cost["by_model"].values()) == pytest.approx(cost["device_h"], abs=1e-5)
    # each trial's record holds its share of the one Ray trial's slot: a quarter of its CPU for the Ray trial's time
    assert len({r["cost"]["wall_s"] for r in records}) == 1
    assert all(r["cost"]["units"] == pytest.approx(cfg.cpus_per_trial / 4) for r in records)
    assert cost["trials"]["device_h"] == pytest.approx(records[0]["cost"]["wall_s"] * cfg.cpus_per_trial / 3600,
                                                       abs=1e-5)


def _seeds(trials: list[TrialSpec], seeds: tuple[int, ...], **settings) -> list[TrialSpec]:
    """``trials`` once for each of ``seeds`` (ids kept apart)."""
    import dataclasses

    return [dataclasses.replace(t, trial_id=f"s{seed}-{t.trial_id}", seed=seed, **settings)
            for seed in seeds for t in trials]


@pytest.mark.parametrize("task", ["chemprot", "bc5cdr_chemical"])
def test_a_bundle_of_several_seeds_trains_each_trial_as_its_seed_does_alone_without_dropout(tiny_bert, tmp_path,
                                                                                            task):
    """sweep.bundle_seeds: each row reads its seed's batches (the seeds' batches stacked, each padded to the
    widest: NER's labels too) and starts from its seed's head. Without dropout, the one thing a bundle of
    several seeds draws otherwise, each trial's record is the one it gets alone."""
    from orchestrator.finetune.bundle import run_bundle
    from orchestrator.finetune.loop import run_trial
    from orchestrator.finetune.trial import group_trials

    still = _sibling(tiny_bert, tmp_path / "still", seed=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    trials = _seeds(_trials(tiny_bert, task, (1e-3, 3e-3)), (2, 5), model_dir=str(still))
    assert [len(g) for g in group_trials(trials, bundle=True, seeds=True)] == [4]
    assert [len(g) for g in group_trials(trials, bundle=True)] == [2, 2]
    bundled = run_bundle(trials)
    alone = [run_trial(t) for t in trials]
    for got, want in zip(bundled, alone):
        assert "bundle_failed" not in got and got["bundle"]["seeds"] == [2, 5]
        _assert_same_record(got, want)
    # the seeds train different models (their orders and heads): a bundle that gave every row one seed's fails here
    assert [r["train_loss"] for r in alone[0]["epochs"]] != pytest.approx([r["train_loss"] for r in alone[2]["epochs"]])


def test_a_bundle_of_several_seeds_with_dropout_draws_each_rows_masks_from_its_own_stream(tiny_bert, monkeypatch,
                                                                                          caplog):
    """With dropout, each row of a bundle of several seeds draws its own masks from the bundle's stream (vmap
    cannot give a row its seed's generator): the same records run after run, close to but not the numbers
    of the trial alone. A bundle of several seeds that fails before its first epoch ends trains one bundle
    per seed instead, whose records are the ones alone (up to rounding)."""
    from orchestrator.finetune import bundle
    from orchestrator.finetune.loop import run_trial

    trials = _seeds(_trials(tiny_bert, "chemprot", (1e-3, 3e-3), eval_epochs=(1,)), (2, 5))
    first, again = bundle.run_bundle(trials), bundle.run_bundle(trials)
    alone = [run_trial(t) for t in trials]
    for a, b, want in zip(first, again, alone):
        assert a["epochs"] == b["epochs"] and a["predictions"] == b["predictions"]
        assert a["epochs"][0]["train_loss"] == pytest.approx(want["epochs"][0]["train_loss"], rel=0.05)
    assert [a["epochs"][0]["train_loss"] for a in first] != pytest.approx(
        [w["epochs"][0]["train_loss"] for w in alone], rel=1e-5)  # other masks: other numbers

    import torch

    real = bundle._batched_loss

    def no_seeds(model, stack, row_seed=None):
        if row_seed is not None:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return real(model, stack)

    monkeypatch.setattr(bundle, "_batched_loss", no_seeds)
    with caplog.at_level("WARNING", logger="orchestrator.finetune.bundle"):
        records = bundle.run_bundle(trials)
    assert "training them one seed at a time" in caplog.text
    ids = [t.trial_id for t in trials]
    for record, want in zip(records, alone):
        assert record["bundle_failed"] == {"trial_ids": ids,
                                           "error": "OutOfMemoryError: CUDA out of memory. Tried to allocate 9.00 GiB"}
        assert record["bundle"]["size"] == 2 and "seeds" not in record["bundle"]
        _assert_same_record(record, want)


def test_a_sweep_bundles_a_settings_seeds_into_one_ray_trial(tiny_bert, ray_local, tmp_path):
    """sweep.bundle_seeds: the 2 seeds x 2 learning rates of a task are one Ray trial; each trial keeps its own
    record and the cell its seeds' mean (sd); the MLflow sweep is the one without it (no fingerprint change)."""
    import dataclasses
    import json

    from orchestrator.sweep.config import SweepConfig
    from orchestrator.sweep.runner import plan_sweep, run_sweep
    from orchestrator.sweep.space import tracked_config

    cfg = SweepConfig(search_space="tiny", tasks=("chemprot",), learning_rates=(1e-3, 3e-2), seeds=(1, 2),
                      epochs={"chemprot": (1,)}, bundle_learning_rates="on", bundle_seeds=True)
    plan = plan_sweep(cfg, {"tiny": tiny_bert})
    assert "learning rates bundled (on): 1 Ray trial(s)" in plan and "its 2 seeds together" in plan
    assert "2 Ray trial(s)" in plan_sweep(dataclasses.replace(cfg, bundle_seeds=False), {"tiny": tiny_bert})
    assert "1 Ray trial(s)" in plan_sweep(dataclasses.replace(cfg, learning_rates=(1e-3,)), {"tiny": tiny_bert})
    assert tracked_config(cfg, cfg.space) == tracked_config(dataclasses.replace(cfg, bundle_seeds=False), cfg.space)
    out = tmp_path / "sweep"
    result = run_sweep(cfg, {"tiny": tiny_bert}, out, None, tmp_path)
    assert (result.ran, result.skipped) == (4, 0)
    assert len(list(out.glob("tune/*/*/result.json"))) == 1
    records = [json.loads(p.read_text()) for p in (out / "trials").glob("*.json")]
    assert sorted(r["trial"]["seed"] for r in records) == [1, 1, 2, 2]
    assert all(r["bundle"]["size"] == 4 and r["bundle"]["seeds"] == [1, 2] for r in records)
    cell = result.results["cells"]["tiny"]["ChemProt"]
    assert cell["selected"]["learning_rate"] in (1e-3, 3e-2) and (cell["n"], cell["seeds"]) == (2, [1, 2])


def test_the_bundle_step_benchmark_runs_and_its_two_steps_agree():
    """benchmarks/bundle_step.py (the fused AdamW step against the elementwise one it replaced) on a tiny
    stack: both steps change the weights the same way, to float rounding, and the fused one is timed."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "benchmarks/bundle_step.py", "--size", "tiny", "--rows", "2",
                           "--warmup", "1", "--steps", "2"], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    [out] = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["rows"] == 2 and out["fused_ms"] > 0 and out["elementwise_ms"] > 0
    assert out["relative_drift"] < 1e-6  # a step moves the weights by ~1e-4 of the largest: the two agree


def test_the_bundle_sharing_benchmark_times_bundles_alone_and_side_by_side():
    """benchmarks/bundle_sharing.py (issue 31: is a GPU sweep's time one process's step, or processes taking
    turns?) on 2 CPUs: the unbundled trial's step and a 2-row bundle's, one process and two at once, each
    with its step time, throughput and, side by side, its gain over one process alone; a one-process cell's
    profile names its heaviest operators (on a GPU, kernels); a malformed cell is refused before any process
    starts."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "benchmarks/bundle_sharing.py", "--size", "tiny", "--warmup", "0", "--steps", "2"]
    done = subprocess.run([*cmd, "--cells", "0x1", "2x1", "2x2", "--profile", "1", "--top", "3"], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    cells = {c["cell"]: c for c in json.loads(done.stdout.strip().splitlines()[-1])}
    assert list(cells) == ["0x1", "2x1", "2x2"]
    assert all(c["step_ms"] > 0 and c["row_steps_per_s"] > 0 and c["host_cpu_ms_a_step"] > 0 for c in cells.values())
    assert cells["2x1"]["sharing_gain"] == 1.0 and 0 < cells["2x2"]["sharing_gain"] <= 2.5
    assert cells["2x2"]["row_steps_per_s"] == pytest.approx(
        cells["2x1"]["row_steps_per_s"] * cells["2x2"]["sharing_gain"], rel=0.01)
    assert "2x2: 2 process(es) of 2-row bundles" in done.stdout and "unbundled trials" in done.stdout
    # profiled alone only (side by side a profile would time the profiler's own contention)
    assert "top" not in cells["2x2"] and "kernel_ms_a_step" not in cells["2x1"]  # kernels: a GPU's
    for name in ("0x1", "2x1"):
        top = cells[name]["top"]
        assert len(top) == 3 and all(t["ms_a_step"] > 0 and t["calls_a_step"] > 0 for t in top), top
        assert [t["ms_a_step"] for t in top] == sorted((t["ms_a_step"] for t in top), reverse=True)
        assert 0 < sum(t["share"] for t in top) <= 1.0
    # a bundle's linear layers and attention are batched matrix products over its rows
    assert any(t["name"] == "aten::bmm" for t in cells["2x1"]["top"]), cells["2x1"]["top"]
    assert done.stdout.count("heaviest operators (own CPU time):") == 2
    bad = subprocess.run([*cmd, "--cells", "6by8"], cwd=root, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "cell '6by8': expected ROWSxPROCESSES" in bad.stderr
