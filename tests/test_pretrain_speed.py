"""Issue 30: each ``pretrain.speed`` switch computes the plain path's loss and gradients (fp32, CPU).

A tiny BERT with NSP, no dropout, on micro-batches of unequal lengths (so with padding), compared
switch on against switch off: the losses, the MLM accuracy counts and every parameter's gradient.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from orchestrator.instances.config import MaskingRule, Specials
from orchestrator.pretrain.config import ModelConfig, OptimConfig, PretrainConfig, SpeedConfig
from orchestrator.pretrain.data import collate

SPECIAL = Specials(cls=2, sep=3, mask=4, vocab_size=100, continuation=frozenset(range(50, 100)), pad=0)
TOL = dict(rtol=1e-5, atol=1e-6)


def _model(attention: str = "sdpa", objective: str = "mlm_nsp", fp8: bool = False):
    from orchestrator.pretrain.model import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(size="tiny", objective=objective, max_position_embeddings=64, dropout=0.0),
                        100, 0, attention=attention, fp8=fp8)
    return model.eval()  # no dropout: the paths compared must see the same arithmetic


def _batch(seed: int = 0, size: int = 6, indices: bool = False) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed)
    rows = {"input_ids": [np.array([2, *rng.integers(5, 100, int(k)), 3]) for k in rng.integers(8, 30, size)],
            "next_sentence_label": rng.integers(0, 2, size)}
    rows["token_type_ids"] = [np.zeros(len(r), np.int64) for r in rows["input_ids"]]
    batch = collate(rows, SPECIAL, rule=MaskingRule(masked_lm_prob=0.2), gen=rng, indices=indices)
    assert (batch["attention_mask"] == 0).any(), "the batch must hold padding"
    return {k: torch.from_numpy(v) for k, v in batch.items()}


def _forward_backward(module, batch) -> tuple[dict, dict[str, torch.Tensor]]:
    module.zero_grad(set_to_none=True)
    out = module(**batch)
    out["loss"].backward()
    grads = {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in out.items()}, grads


def _assert_same(a: tuple[dict, dict], b: tuple[dict, dict]) -> None:
    (out_a, grads_a), (out_b, grads_b) = a, b
    for k in ("loss", "mlm_loss", "nsp_loss"):
        torch.testing.assert_close(out_a[k], out_b[k], **TOL)
    assert int(out_a["mlm_correct"]) == int(out_b["mlm_correct"]) and int(out_a["mlm_count"]) == int(
        out_b["mlm_count"])
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 30
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")


def test_the_switches_default_on_and_stay_out_of_the_run_key():
    speed = SpeedConfig()
    assert speed.masked_only_head and speed.attention == "sdpa" and speed.fused_optimizer and speed.unpad
    assert not speed.compile
    plain = PretrainConfig(speed=SpeedConfig(masked_only_head=False, attention="eager", fused_optimizer=False,
                                             unpad=False))
    assert plain.training_fields() == PretrainConfig().training_fields()  # how, not what: same checkpoints reused


def test_masked_only_decoder_gives_the_full_logits_loss_accuracy_and_gradients():
    """Priority 1: the decoder at the masked positions only = decoding every position and keeping the
    masked ones = BertForPreTraining's own loss (its forward computes full-vocabulary logits)."""
    from orchestrator.pretrain.model import PretrainingModule

    model = _model()
    batch = _batch()
    masked = _forward_backward(PretrainingModule(model, masked_only=True), batch)
    full = _forward_backward(PretrainingModule(model, masked_only=False), batch)
    _assert_same(masked, full)
    assert int(masked[0]["mlm_count"]) == int((batch["labels"] != -100).sum()) > 0
    hf = model(**{k: v for k, v in batch.items() if k != "next_sentence_label"},
               next_sentence_label=batch["next_sentence_label"])
    torch.testing.assert_close(hf.loss.detach(), masked[0]["loss"], **TOL)


def test_sdpa_runs_the_fused_kernel_and_computes_what_eager_attention_does():
    """Priority 2: ``attention: sdpa`` is what runs (the config transformers reads at each forward,
    and torch's scaled_dot_product_attention op in the profile), with eager's loss and gradients."""
    from torch.profiler import ProfilerActivity, profile

    from orchestrator.pretrain.model import PretrainingModule

    batch = _batch(1)
    results = {}
    for attention in ("sdpa", "eager"):
        model = _model(attention)
        assert model.config._attn_implementation == attention
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            results[attention] = _forward_backward(PretrainingModule(model), batch)
        ops = {e.key for e in prof.key_averages()}
        assert ("aten::scaled_dot_product_attention" in ops) is (attention == "sdpa"), attention
    _assert_same(results["sdpa"], results["eager"])


def test_fused_adamw_takes_the_per_tensor_steps():
    """Priority 3: fused=True on CUDA and CPU (the CPU kernel does the arithmetic CUDA's does), per tensor
    when off, and the multi-tensor foreach kernels (the CPU default until session 28): the same updates."""
    from orchestrator.pretrain.model import PretrainingModule
    from orchestrator.pretrain.optim import adamw_kernel, build_optimizer

    assert adamw_kernel(_model(), fused=True) == {"fused": True}
    assert adamw_kernel(_model(), fused=False) == {"foreach": False, "fused": False}
    cfg = OptimConfig(name="adamw")
    kernels = {"per_tensor": {"fused": False}, "cpu_fused": {"fused": True}, "foreach": "foreach"}
    weights = {}
    for name, how in kernels.items():
        model = _model()
        if how == "foreach":
            opt = build_optimizer(model, cfg, 1e-2, fused=False)
            opt = torch.optim.AdamW(opt.param_groups, lr=1e-2, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, foreach=True)
        else:
            opt = build_optimizer(model, cfg, 1e-2, **how)
            assert bool(opt.defaults["fused"]) is (name == "cpu_fused")
        module = PretrainingModule(model)
        for seed in range(3):
            _forward_backward(module, _batch(seed))
            opt.step()
        weights[name] = {n: p.detach().clone() for n, p in model.named_parameters()}
    for name in ("foreach", "cpu_fused"):
        for key, w in weights["per_tensor"].items():
            torch.testing.assert_close(weights[name][key], w, rtol=1e-5, atol=1e-6, msg=lambda m, k=key: f"{k}: {m}")


def test_compiled_encoder_gives_eager_loss_and_gradients_and_the_same_state_dict(tmp_path):
    """Priority 4: ``speed.compile`` (inductor on the encoder, in place) gives eager's loss and
    gradients, keeps the parameter names (checkpoints, DDP) and saves a model ``from_pretrained`` loads.
    Traced by dynamo and AOT autograd as in a run, but with the aot_eager backend: inductor's code
    generation takes ~100 s of a busy CPU even for the tiny model (its numerics are torch's to test)."""
    from transformers import BertForPreTraining

    from orchestrator.pretrain.model import PretrainingModule, compile_encoder

    if not hasattr(torch, "compile"):
        pytest.skip("torch.compile is not available")
    batch = _batch(2)
    eager = _forward_backward(PretrainingModule(_model()), batch)
    model = _model()
    keys = list(model.state_dict())
    compile_encoder(model, backend="aot_eager")
    started = time.perf_counter()
    compiled = _forward_backward(PretrainingModule(model), batch)
    print(f"first compiled forward+backward: {time.perf_counter() - started:.1f}s")
    _assert_same(compiled, eager)
    assert list(model.state_dict()) == keys
    model.save_pretrained(tmp_path)
    loaded = BertForPreTraining.from_pretrained(str(tmp_path))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items())


@pytest.mark.parametrize("objective, unpad, masked_only", [("mlm_nsp", True, True), ("mlm", False, False)])
def test_the_compiled_heads_give_eager_losses_and_gradients_for_every_masked_count(objective, unpad, masked_only):
    """``speed.compile_head``: the heads and their losses (``head_losses``) compiled as one function give
    eager's losses, accuracy counts and gradients, over micro-batches with different numbers of masked
    positions: compiled once (dynamic shapes), not once per count. The heads' modules and state dict stay
    the model's own. aot_eager, as above (inductor's numerics are torch's to test)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from orchestrator.pretrain.model import (
        COMPILED_HEAD,
        PretrainingModule,
        _compiled_heads,
        compile_encoder,
        head_losses,
    )

    torch._dynamo.reset()
    model, reference = _model(objective=objective), _model(objective=objective)
    keys = list(model.state_dict())
    compile_encoder(model, backend="aot_eager", unpad=unpad, head=True)
    try:
        assert getattr(model.cls, COMPILED_HEAD) == ("aot_eager", None)
        compiled = PretrainingModule(model, masked_only=masked_only, unpad=unpad)
        eager = PretrainingModule(reference, masked_only=masked_only, unpad=unpad)
        masked = set()
        for seed in (3, 4, 5):
            batch = _batch(seed, indices=True)
            masked.add(int(batch["masked_index"].numel()))
            if objective == "mlm":
                del batch["next_sentence_label"]
            results = _forward_backward(compiled, batch), _forward_backward(eager, batch)
            if objective == "mlm":
                assert all("nsp_loss" not in out for out, _ in results)
                for out, _ in results:
                    out["nsp_loss"] = torch.zeros(())
            _assert_same(*results)
        assert len(masked) == 3, "the micro-batches must differ in their masked positions"
        assert ("aot_eager", None) in _compiled_heads
        assert len(_debug_get_cache_entry_list(head_losses.__code__)) == 1  # traced once for every count
        assert list(model.state_dict()) == keys
    finally:
        _compiled_heads.pop(("aot_eager", None), None)
        torch._dynamo.reset()


def test_the_training_module_is_built_as_the_speed_switches_say():
    """``training_module`` (the loop's and the GPU benchmark's one builder): the decoder and encoder
    choices, the wrapper around the module (Ray Train's prepare_model), and, with ``compile``, the
    encoder compiled in place (in reduce-overhead mode with ``cuda_graphs``) and the heads marked
    compiled only with ``compile_head``. Compilation is lazy: nothing compiles here."""
    from orchestrator.pretrain.model import COMPILED_HEAD, PretrainingModule, training_module
    from orchestrator.pretrain.optim import optimizer_for

    model = _model()
    wrapped = []
    module = training_module(model, SpeedConfig(masked_only_head=False, unpad=False),
                             wrap=lambda m: wrapped.append(m) or m)
    assert wrapped == [module] and isinstance(module, PretrainingModule)
    assert (module.masked_only, module.unpad) == (False, False)
    assert model.bert._compiled_call_impl is None and not hasattr(model.cls, COMPILED_HEAD)

    model = _model()
    module = training_module(model, SpeedConfig(compile=True, compile_head=True, cuda_graphs=True))
    assert (module.masked_only, module.unpad) == (True, True) and module.model is model
    assert model.bert._compiled_call_impl is not None
    assert getattr(model.cls, COMPILED_HEAD) == ("inductor", "reduce-overhead")
    model = _model()
    training_module(model, SpeedConfig(compile=True))
    assert model.bert._compiled_call_impl is not None and not hasattr(model.cls, COMPILED_HEAD)

    cfg = PretrainConfig(speed=SpeedConfig(compile_optimizer=True))
    assert optimizer_for(model, cfg, 1e-3).compiled
    cfg = PretrainConfig(optim=OptimConfig(name="adamw"), speed=SpeedConfig(fused_optimizer=False))
    assert optimizer_for(model, cfg, 1e-3).defaults["foreach"] is False


def test_compile_head_needs_compile():
    from orchestrator.core.errors import ConfigError

    with pytest.raises(ConfigError, match="compile_head needs pretrain.speed.compile"):
        SpeedConfig(compile_head=True)
    assert SpeedConfig(compile=True, compile_head=True).compile_head
    assert PretrainConfig(speed=SpeedConfig(compile=True, compile_head=True)).training_fields() == \
        PretrainConfig().training_fields()  # how, not what: the run key stays


def test_the_gpu_benchmark_runs_its_cpu_smoke_mode_with_the_ablation_table():
    """Priority 7: benchmarks/pretrain_gpu.py in CPU smoke mode (tiny model, one timed step, in its own
    interpreter: it opens a gloo world and a Ray session), printing the table and its JSON. One
    configuration (each costs a Ray Data read: the whole ablation took 5 minutes on the loaded
    machine); the ablation's configurations are checked as data."""
    import importlib.util
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("pretrain_gpu", root / "benchmarks" / "pretrain_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    configs = dict(bench.speed_configs("each", True, "adamw"))
    assert list(configs) == ["all on", "+ no_host_reads", "+ compile_head", "+ cuda_graphs",
                             "+ compile_head + cuda_graphs", "+ cuda_graphs + fp8", "- masked_only_head",
                             "- attention=eager", "- fused_optimizer", "- compile", "- unpad",
                             "all off"]  # AdamW: nothing to compile_optimizer
    assert configs["+ compile_head"] == {**configs["all on"], "compile_head": True}
    assert configs["+ cuda_graphs"] == {**configs["all on"], "cuda_graphs": True}
    assert configs["+ compile_head + cuda_graphs"] == {**configs["+ cuda_graphs"], "compile_head": True}
    lamb = dict(bench.speed_configs("none", True, "lamb"))
    assert list(lamb) == ["all on", "+ no_host_reads", "+ compile_head", "+ compile_optimizer", "+ cuda_graphs",
                          "+ compile_head + compile_optimizer + cuda_graphs", "+ cuda_graphs + fp8"]
    assert lamb["+ compile_head + compile_optimizer + cuda_graphs"] == {
        **lamb["all on"], "compile_head": True, "compile_optimizer": True, "cuda_graphs": True}
    assert lamb["+ no_host_reads"] == {**lamb["all on"], bench.NO_HOST_READS: True}
    for speed in lamb.values():  # every row is a valid configuration
        PretrainConfig(precision="bf16", speed=SpeedConfig(**{k: v for k, v in speed.items()
                                                              if k != bench.NO_HOST_READS}))
    assert configs["+ cuda_graphs + fp8"] == {**configs["+ cuda_graphs"], "fp8": True}
    assert "+ cuda_graphs + fp8" not in dict(bench.speed_configs("none", True, "lamb", "fp16"))  # bf16 only
    assert configs["all off"] == {"masked_only_head": False, "attention": "eager", "fused_optimizer": False,
                                  "compile": False, "unpad": False}
    assert configs["all on"]["unpad"] and configs["all on"]["compile"]  # the compiled unpadded encoder
    cpu = dict(bench.speed_configs("each", False, "lamb"))
    assert "- fused_optimizer" not in cpu and "- compile" not in cpu and cpu["all on"]["unpad"]
    assert "+ cuda_graphs" not in cpu and "+ compile_head" not in cpu  # both extend the compiled encoder
    assert not cpu["- unpad"]["unpad"]
    picked = bench.select_rows(list(configs.items()), "- unpad, all on")  # --rows: the table's order
    assert [label for label, _ in picked] == ["all on", "- unpad"]
    with pytest.raises(SystemExit, match="no row '- unpadd'"):
        bench.select_rows(list(configs.items()), "all on,- unpadd")
    # --lengths real: rows as long as real instances, about a quarter of a batch padding
    lengths = bench.row_lengths(np.random.default_rng(0), 4096, 128, "real")
    assert 0.2 < 1 - lengths.mean() / 128 < 0.3 and (bench.row_lengths(None, 3, 128, "full") == 128).all()
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "pretrain_gpu.py"), "--device", "cpu",
                           "--steps", "1", "--batch", "4", "--accumulation", "1", "--length", "16", "--cpus", "1",
                           "--ablate", "none", "--rows", "all on,+ no_host_reads"], cwd=root, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| configuration | seq/s |" in done.stdout and "training_flops_per_token" in done.stdout
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    result, unread = summary["results"]
    # the row whose step reads nothing back runs and trains (its numerics: tests/test_pretrain_loop.py; the
    # rows' losses are not compared: Ray Data may hand the two rows' reads their blocks in other orders)
    assert unread["label"] == "+ no_host_reads" and 0 < unread["loss"] < 20 and 0 < result["loss"] < 20
    assert summary["ddp"] is False  # a one-worker run's module, unwrapped as Ray Train leaves it
    assert result["label"] == "all on" and result["seq_per_s"] > 0 and result["mfu"] is None
    assert 0 <= result["data_wait_share"] <= 1 and result["first_step_s"] > 0
    # the encoder's input shapes by phase: the one warm-up step's one micro-batch, then the timed step's
    assert result["shapes_warmup"] == 1 and result["shapes_new_timed"] in (0, 1)


def test_the_progress_line_and_the_mlflow_tags_say_the_throughput_and_what_the_mfu_is_against():
    """Priority 6: seq/s, tokens/s and MFU on the progress line; on CPU no peak, so MFU n/a (null)."""
    from orchestrator.pretrain.loop import MFU_FORMULA, Progress, mfu_basis, throughput_text

    text = throughput_text({"seq_per_s": 1234.5, "tokens_per_s": 157000.0, "mfu": 0.21}, steps=50)
    line = Progress("phase1", 10, 0, every_s=0.0).step(5, 2.0, 0.1, throughput=text)
    # the rates of the last record's steps, said as such beside the phase's steps/s (pauses included)
    assert "steps/s overall (last 50 steps: 1,234.5 seq/s, 157,000 tokens/s, MFU 0.210)" in line
    assert throughput_text({"seq_per_s": 1.0, "tokens_per_s": 1.0, "mfu": None}).endswith("MFU n/a")
    basis = mfu_basis(torch.device("cpu"), "bf16")
    assert basis["mfu.device"] == "cpu" and basis["mfu.peak_flops"].startswith("none")
    assert basis["mfu.formula"] == MFU_FORMULA


@pytest.mark.parametrize("objective, adapters", [("mlm_nsp", False), ("mlm", False), ("mlm_nsp", True)])
def test_the_unpadded_encoder_gives_the_padded_loss_and_gradients(objective, adapters):
    """``speed.unpad``: the encoder on the real tokens only (pretrain/unpad.py) = BertModel with SDPA on
    the padded batch, at every real position: the same losses, MLM counts and every gradient; with NSP
    (the pooler reads [CLS]), MLM only, and adapters (the layer's output module is the adapter's)."""
    from orchestrator.modeling.adapters import add_adapters
    from orchestrator.pretrain.model import PretrainingModule
    from orchestrator.pretrain.unpad import unpadded_sequence_output

    model = _model(objective=objective)
    if adapters:
        add_adapters(model, reduction_factor=4)
        for p in model.parameters():  # adapters start as the identity: move them off it, or they check nothing
            if p.requires_grad:
                p.data.add_(0.02 * torch.randn_like(p))
    batch = _batch(2)
    if objective == "mlm":
        batch.pop("next_sentence_label")
    unpadded = _forward_backward(PretrainingModule(model, unpad=True), batch)
    padded = _forward_backward(PretrainingModule(model, unpad=False), batch)
    if objective == "mlm":
        for result in (unpadded, padded):
            result[0]["nsp_loss"] = torch.zeros(())
    _assert_same(unpadded, padded) if not adapters else _assert_same_trainable(unpadded, padded)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        ours = unpadded_sequence_output(model.bert, batch["input_ids"], batch["token_type_ids"],
                                        batch["attention_mask"])
        theirs = model.bert(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                            attention_mask=batch["attention_mask"]).last_hidden_state
    torch.testing.assert_close(ours[real], theirs[real], **TOL)
    assert (ours[~real] == 0).all() and (~real).sum() > 10


def _assert_same_trainable(a, b) -> None:
    (out_a, grads_a), (out_b, grads_b) = a, b
    for k in ("loss", "mlm_loss", "nsp_loss"):
        torch.testing.assert_close(out_a[k], out_b[k], **TOL)
    assert grads_a.keys() == grads_b.keys() and any("adapter" in n for n in grads_a)
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")


def test_the_unpadded_encoder_checkpoints_its_layers_as_transformers_does():
    """pretrain.gradient_checkpointing (transformers marks every layer) holds on the unpadded path: each
    layer is recomputed in the backward pass (the checkpoint op runs), with the same gradients."""
    from torch.profiler import ProfilerActivity, profile

    from orchestrator.pretrain.model import PretrainingModule, checkpoint_activations

    batch = _batch(3)
    plain = _forward_backward(PretrainingModule(_model(), unpad=True), batch)
    model = _model()
    checkpoint_activations(model)
    model.train()  # checkpointing acts in training only; dropout is 0, so the arithmetic is eval's
    assert all(layer.gradient_checkpointing for layer in model.bert.encoder.layer)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        checkpointed = _forward_backward(PretrainingModule(model, unpad=True), batch)
    forwards = sum(e.count for e in prof.key_averages() if e.key == "aten::scaled_dot_product_attention")
    assert forwards == 2 * len(model.bert.encoder.layer)  # each layer's attention ran again in the backward
    _assert_same(checkpointed, plain)


def test_unpad_refuses_a_model_it_does_not_cover():
    from orchestrator.core.errors import ConfigError
    from orchestrator.pretrain.model import PretrainingModule

    model = _model()
    model.bert.config.position_embedding_type = "relative_key"
    with pytest.raises(ConfigError, match="relative_key"):
        PretrainingModule(model, unpad=True)


def test_the_unpadded_layer_projects_q_k_v_as_one_matmul_and_scatters_them_once():
    """The unpadded layer computes Q, K and V as one matmul of the three weights stacked
    (``unpad._projections``; equal to the three modules' own outputs) and scatters them to the padded
    layout in one ``index_copy`` a layer (three before): the profile counts one a layer and the
    encoder's output's. FP8's layers keep their own matmuls, side by side."""
    from collections import Counter

    from torch.profiler import profile

    from orchestrator.pretrain.unpad import _projections, unpadded_sequence_output

    model, batch = _model(), _batch(3)
    with torch.no_grad(), profile() as prof:
        unpadded_sequence_output(model.bert, batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    counts = Counter(event.name for event in prof.events())
    assert counts["aten::index_copy"] == model.config.num_hidden_layers + 1
    hidden = torch.randn(7, model.config.hidden_size)
    for fp8 in (False, True):
        attention = _model(fp8=fp8).bert.encoder.layer[0].attention.self
        separate = torch.cat([attention.query(hidden), attention.key(hidden), attention.value(hidden)], dim=-1)
        torch.testing.assert_close(_projections(attention, hidden), separate, **TOL)


def test_the_unpadded_encoder_runs_eager_attention_when_asked():
    """``speed.attention: eager`` holds on the unpadded path too (transformers' matmul-softmax-matmul,
    no SDPA op): the padded eager model's loss and gradients."""
    from torch.profiler import ProfilerActivity, profile

    from orchestrator.pretrain.model import PretrainingModule

    batch = _batch(4)
    padded = _forward_backward(PretrainingModule(_model("eager"), unpad=False), batch)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        unpadded = _forward_backward(PretrainingModule(_model("eager"), unpad=True), batch)
    assert not any(e.key == "aten::scaled_dot_product_attention" for e in prof.key_averages())
    _assert_same(unpadded, padded)


@pytest.mark.parametrize("fp8", [False, True])
def test_the_compiled_unpadded_encoder_compiles_once_for_every_token_count(fp8):
    """``speed.compile`` with ``speed.unpad``: the packed encoder compiled with dynamic shapes gives the
    eager unpadded loss and gradients, and batches with other numbers of real tokens (and another
    width) reuse the one compiled graph instead of compiling again; with ``speed.fp8`` too, whose
    matmuls pad the rows to a multiple of 16 (a branch on the count would compile once per case).
    aot_eager, as the compile test above: dynamo's tracing and AOT autograd as in a run, without
    inductor's minutes of CPU."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from orchestrator.pretrain.model import PretrainingModule, compile_encoder
    from orchestrator.pretrain.unpad import _compiled

    if not hasattr(torch, "compile"):
        pytest.skip("torch.compile is not available")
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    batches = [_batch(seed, size) for seed, size in ((5, 6), (6, 5), (7, 7), (22, 5))]
    tokens = [int(b["attention_mask"].sum()) for b in batches]
    assert len(set(tokens)) == 4 and {t % 16 == 0 for t in tokens} == {True, False}  # some padded, one not
    eager, model = PretrainingModule(_model(fp8=fp8), unpad=True), _model(fp8=fp8)
    compile_encoder(model, backend=counter, unpad=True)
    try:
        compiled = PretrainingModule(model, unpad=True)
        for batch in batches:
            _assert_same(_forward_backward(compiled, batch), _forward_backward(eager, batch))
        graphs = [g for g in counter.graphs if len(g.graph.nodes)]  # dynamo hands the backend an empty one too
        assert len(graphs) == 1, f"compiled {len(graphs)} graphs for {len(batches)} batches"
    finally:
        _compiled.pop((counter, None), None)
        torch._dynamo.reset()


@pytest.mark.parametrize("unpad, masked_only", [(True, True), (False, True), (True, False)])
def test_positions_found_on_the_data_thread_leave_the_step_no_nonzero(unpad, masked_only):
    """``collate(..., indices=True)`` (the loop's micro-batches) gives the flat positions of the real and
    the masked tokens: the model then runs no ``nonzero`` (on CUDA a host sync per micro-batch) and
    computes the same losses, counts and gradients as when it finds them itself."""
    from torch.profiler import ProfilerActivity, profile

    from orchestrator.pretrain.model import PretrainingModule

    with_index, plain = _batch(8, indices=True), _batch(8)
    assert with_index.keys() - plain.keys() == {"real_index", "masked_index"}
    assert torch.equal(with_index["real_index"], plain["attention_mask"].reshape(-1).nonzero().squeeze(1))
    assert torch.equal(with_index["masked_index"], (plain["labels"] != -100).reshape(-1).nonzero().squeeze(1))
    found = _forward_backward(PretrainingModule(_model(), unpad=unpad, masked_only=masked_only), plain)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        given = _forward_backward(PretrainingModule(_model(), unpad=unpad, masked_only=masked_only), with_index)
    syncing = {"aten::nonzero", "aten::masked_select"} & {e.key for e in prof.key_averages()}
    assert not syncing, syncing
    _assert_same(given, found)


def _rows(seed: int, size: int) -> dict:
    rng = np.random.default_rng(seed)
    rows = {"input_ids": [np.array([2, *rng.integers(5, 100, int(k)), 3]) for k in rng.integers(8, 30, size)],
            "next_sentence_label": rng.integers(0, 2, size)}
    rows["token_type_ids"] = [np.zeros(len(r), np.int64) for r in rows["input_ids"]]
    rows["masked_lm_positions"] = rows["masked_lm_ids"] = [np.zeros(0, np.int64)] * size  # read without a rule
    return rows


def test_static_shapes_pad_rows_to_the_phase_length_and_fill_the_positions_to_their_buckets():
    """``speed.cuda_graphs``' micro-batches: every row as long as the phase's sequences, the real and the
    masked positions first and in order, then filler to the buckets' multiples: distinct padding
    positions for the tokens, unmasked (IGNORE_INDEX) positions for the masked list."""
    from orchestrator.core.errors import OrchestratorError
    from orchestrator.pretrain.data import IGNORE_INDEX, StaticShapes

    shapes = StaticShapes(width=40, tokens=16, masked=8)
    plain = collate(_rows(3, 6), SPECIAL, rule=MaskingRule(masked_lm_prob=0.2), gen=np.random.default_rng(0),
                    indices=True)
    static = collate(_rows(3, 6), SPECIAL, rule=MaskingRule(masked_lm_prob=0.2), gen=np.random.default_rng(0),
                     indices=True, shapes=shapes)
    width = plain["input_ids"].shape[1]
    assert width < 40 and static["input_ids"].shape == (6, 40)
    for key in ("input_ids", "attention_mask", "labels"):  # the same rows, padded further
        assert (static[key][:, :width] == plain[key]).all()
    real, masked = static["real_index"], static["masked_index"]
    n_real, n_masked = len(plain["real_index"]), len(plain["masked_index"])
    assert len(real) % 16 == 0 and len(real) > n_real and len(masked) % 8 == 0 and len(masked) > n_masked
    flat_mask, flat_labels = static["attention_mask"].reshape(-1), static["labels"].reshape(-1)
    assert (real[:n_real] == np.flatnonzero(flat_mask)).all()
    assert (flat_mask[real[n_real:]] == 0).all() and len(set(real.tolist())) == len(real)
    assert (masked[:n_masked] == np.flatnonzero(flat_labels != IGNORE_INDEX)).all()
    assert (flat_labels[masked[n_masked:]] == IGNORE_INDEX).all()
    # the buckets never ask for more filler than the batch has positions
    full = collate(_rows(3, 2), SPECIAL, indices=True, shapes=StaticShapes(width=30, tokens=64, masked=8))
    assert len(full["real_index"]) == 60
    with pytest.raises(OrchestratorError, match="longer than the phase's 16"):
        collate(_rows(3, 6), SPECIAL, indices=True, shapes=StaticShapes(width=16, tokens=8, masked=8))


@pytest.mark.parametrize("unpad, masked_only", [(True, True), (False, True), (True, False)])
def test_static_shapes_give_the_same_loss_counts_and_gradients(unpad, masked_only):
    """The filler of static shapes changes nothing the step computes: the losses, the MLM counts and every
    gradient are those of the plain micro-batch (the filler's targets are skipped, its tokens attended
    by no real token)."""
    from orchestrator.pretrain.data import StaticShapes
    from orchestrator.pretrain.model import PretrainingModule

    rule, shapes = MaskingRule(masked_lm_prob=0.2), StaticShapes(width=48, tokens=32, masked=16)
    batches = [{k: torch.from_numpy(v) for k, v in collate(_rows(4, 6), SPECIAL, rule=rule,
                                                           gen=np.random.default_rng(1), indices=True,
                                                           shapes=static).items()} for static in (None, shapes)]
    plain, filled = batches
    assert len(filled["real_index"]) > len(plain["real_index"])
    assert len(filled["masked_index"]) > len(plain["masked_index"])
    _assert_same(_forward_backward(PretrainingModule(_model(), unpad=unpad, masked_only=masked_only), filled),
                 _forward_backward(PretrainingModule(_model(), unpad=unpad, masked_only=masked_only), plain))


def test_a_micro_batch_with_nothing_masked_adds_zero_loss_and_no_gradient_to_the_decoder():
    """Nothing masked (only filler in the masked list, or nothing at all): the MLM loss is 0, not the NaN of
    an empty mean, and it sends no gradient into the vocabulary projection."""
    from orchestrator.pretrain.data import StaticShapes
    from orchestrator.pretrain.model import PretrainingModule

    for shapes in (None, StaticShapes(width=32, tokens=8, masked=8)):
        batch = {k: torch.from_numpy(v) for k, v in collate(_rows(5, 3), SPECIAL, indices=True,
                                                            shapes=shapes).items()}
        module = PretrainingModule(_model(objective="mlm"))
        batch.pop("next_sentence_label")
        out, grads = _forward_backward(module, batch)
        assert float(out["mlm_loss"]) == 0.0 and int(out["mlm_count"]) == 0
        assert all(float(g.abs().sum()) == 0.0 for g in grads.values())


def test_cuda_graphs_need_compile_and_give_the_loop_static_shapes():
    from orchestrator.core.errors import ConfigError
    from orchestrator.pretrain.data import StaticShapes
    from orchestrator.pretrain.loop import static_shapes

    with pytest.raises(ConfigError, match="cuda_graphs needs pretrain.speed.compile"):
        SpeedConfig(cuda_graphs=True)
    assert static_shapes(SpeedConfig(compile=True), 256, 128) is None
    assert static_shapes(SpeedConfig(compile=True, cuda_graphs=True), 256, 128) == StaticShapes(128, 1024, 128)


@pytest.mark.parametrize("fp8, head", [(False, True), (True, False)])
def test_the_compiled_encoder_with_cuda_graphs_takes_static_batches_and_gives_eager_results(fp8, head):
    """``speed.cuda_graphs``: the packed encoder compiled in reduce-overhead mode (on CPU inductor leaves
    the graphs out; aot_eager, as above, ignores the mode) runs micro-batches in static shapes with
    eager's losses and gradients; with ``speed.compile_head`` (the heads compiled in the same mode, the
    masked positions' filler in their loss) or ``speed.fp8`` too (the FP8 matmuls traced into the graph)."""
    from orchestrator.pretrain.data import StaticShapes
    from orchestrator.pretrain.model import PretrainingModule, _compiled_heads, compile_encoder
    from orchestrator.pretrain.unpad import _compiled

    torch._dynamo.reset()
    model, reference = _model(fp8=fp8), _model(fp8=fp8)
    compile_encoder(model, backend="aot_eager", unpad=True, cuda_graphs=True, head=head)
    try:
        compiled, eager = PretrainingModule(model, unpad=True), PretrainingModule(reference, unpad=True)
        for seed in (6, 7):
            batch = {k: torch.from_numpy(v) for k, v in collate(
                _rows(seed, 6), SPECIAL, rule=MaskingRule(masked_lm_prob=0.2), gen=np.random.default_rng(seed),
                indices=True, shapes=StaticShapes(width=40, tokens=32, masked=16)).items()}
            _assert_same(_forward_backward(compiled, batch), _forward_backward(eager, batch))
        assert ("aot_eager", "reduce-overhead") in _compiled
        assert (("aot_eager", "reduce-overhead") in _compiled_heads) == head
    finally:
        _compiled.pop(("aot_eager", "reduce-overhead"), None)
        _compiled_heads.pop(("aot_eager", "reduce-overhead"), None)
        torch._dynamo.reset()


def test_fp8_products_are_the_quantised_operands_multiplied_in_float32():
    """``speed.fp8``: each of the three matmuls of a linear layer multiplies the operands rounded to 8 bits
    (x and W in e4m3, the output gradient in e5m2, one scale per tensor), accumulated in float32: the
    same as multiplying those rounded operands in float32. Rows that are not a multiple of 16 are padded
    and cut off again; a frozen weight gets no gradient; under autocast the output is in its dtype."""
    from orchestrator.pretrain.float8 import E4M3, E5M2, float8_linear, quantize

    torch.manual_seed(0)
    x = torch.randn(37, 64, requires_grad=True)  # 37 rows: padded to 48 inside
    w = torch.randn(48, 64, requires_grad=True)
    b = torch.randn(48, requires_grad=True)
    g = torch.randn(37, 48)
    y = float8_linear(x, w, b)
    y.backward(g)
    (xq, x_inv), (wq, w_inv), (gq, g_inv) = quantize(x, E4M3), quantize(w, E4M3), quantize(g, E5M2)
    assert xq.dtype == E4M3 and gq.dtype == E5M2 and xq.float().abs().max() == 448.0
    x8, w8, g8 = xq.float() * x_inv, wq.float() * w_inv, gq.float() * g_inv
    torch.testing.assert_close(y, x8 @ w8.T + b, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(x.grad, g8 @ w8, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(w.grad, g8.T @ x8, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(b.grad, g.sum(0))
    # rounded, so near the exact products but not equal to them
    exact = x.detach() @ w.detach().T + b.detach()
    error = ((y - exact).norm() / exact.norm()).item()
    assert 1e-3 < error < 0.05, error
    x.grad = None
    frozen = w.detach()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = float8_linear(x[:32], frozen, None)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert x.grad.dtype == torch.float32 and x.grad[:32].abs().sum() > 0 and not frozen.requires_grad
    zero, inverse = quantize(torch.zeros(4, 4), E4M3)  # an all-zero tensor: no division by zero
    assert torch.isfinite(inverse) and zero.float().abs().sum() == 0


def test_an_fp8_model_keeps_its_weights_and_checkpoints_and_stays_within_fp8s_error_of_bf16(tmp_path):
    """``use_float8`` switches the six linear layers of every encoder layer in place: the same parameters
    and names (a checkpoint loads in ``transformers`` as a plain BERT), ``_scaled_mm`` in the step, and
    the bf16 model's loss and gradients within what rounding to 8 bits moves them."""
    from transformers import BertForPreTraining

    from orchestrator.pretrain.float8 import Float8Linear, use_float8
    from orchestrator.pretrain.model import PretrainingModule

    plain, fp8 = _model(), _model(fp8=True)
    keys = list(plain.state_dict())
    assert use_float8(_model().bert) == 6 * len(fp8.bert.encoder.layer)
    assert list(fp8.state_dict()) == keys and isinstance(fp8.bert.encoder.layer[0].output.dense, Float8Linear)
    assert type(fp8.cls.predictions.transform.dense) is torch.nn.Linear  # the head stays bf16
    batch = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = _forward_backward(PretrainingModule(plain, unpad=True), batch)
        with torch.profiler.profile() as prof:
            got = _forward_backward(PretrainingModule(fp8, unpad=True), batch)
    assert "aten::_scaled_mm" in {e.key for e in prof.key_averages()}
    torch.testing.assert_close(got[0]["loss"], want[0]["loss"], rtol=0.02, atol=0)
    assert want[1].keys() == got[1].keys()
    for name, grad in want[1].items():
        if name.endswith("key.bias"):  # its true gradient is 0 (softmax ignores a shift of a row's scores): noise
            assert grad.norm() < 1e-5 and got[1][name].norm() < 1e-5
            continue
        cosine = torch.nn.functional.cosine_similarity(got[1][name].flatten(), grad.flatten(), dim=0)
        assert cosine > 0.99, (name, float(cosine))  # measured: >= 0.994 for the FP8 layers, 1.0000 elsewhere
        assert not name.endswith("dense.weight") or "encoder" not in name or cosine < 0.9999, name  # FP8 ran
    fp8.save_pretrained(tmp_path)
    loaded = BertForPreTraining.from_pretrained(tmp_path)
    assert type(loaded.bert.encoder.layer[0].output.dense) is torch.nn.Linear
    torch.testing.assert_close(loaded.state_dict()["bert.encoder.layer.0.output.dense.weight"],
                               fp8.state_dict()["bert.encoder.layer.0.output.dense.weight"])


def test_fp8_needs_bf16_and_is_part_of_the_run_key_only_when_on():
    from orchestrator.core.errors import ConfigError
    from orchestrator.pretrain.float8 import fp8_refusal

    with pytest.raises(ConfigError, match="fp8 needs precision bf16"):
        PretrainConfig(speed=SpeedConfig(fp8=True))
    on = PretrainConfig(precision="bf16", speed=SpeedConfig(fp8=True))
    assert on.training_fields()["fp8"] is True
    assert "fp8" not in PretrainConfig(precision="bf16").training_fields()  # off: the key runs always had
    assert fp8_refusal(torch.device("cpu")) is None
