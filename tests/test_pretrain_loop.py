"""The pretraining loop's fast paths (issue 18 items 6, 8, 12): the data path off the training thread,
multi-tensor LAMB and device-side statistics, gradient checkpointing, and exact resumes (random
generators and data position in the checkpoint). Each fast path is compared with the plain one."""
from __future__ import annotations

import copy
import threading
import time

import numpy as np
import pytest
import torch

from orchestrator.instances.config import MaskingRule, Specials
from orchestrator.pretrain.config import ModelConfig, OptimConfig, PretrainConfig
from orchestrator.pretrain.data import Prefetcher, collate, micro_batches

# [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4; ids 50-99 are ## continuation pieces
SPECIAL = Specials(cls=2, sep=3, mask=4, vocab_size=100, continuation=frozenset(range(50, 100)), pad=0)
RULE = MaskingRule(masked_lm_prob=0.15, max_predictions_per_seq=5, whole_word_mask=True)


def _tiny(dropout: float = 0.0, seed: int = 0):
    from orchestrator.pretrain.model import PretrainingModule, build_model

    torch.manual_seed(seed)
    model = build_model(ModelConfig(size="tiny", max_position_embeddings=64, dropout=dropout), 100, 0)
    return model, PretrainingModule(model)


def _batches(n: int, seed: int = 0, size: int = 4) -> list[dict[str, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        rows = {"input_ids": [np.array([2, *rng.integers(5, 100, int(k)), 3]) for k in rng.integers(8, 30, size)],
                "next_sentence_label": rng.integers(0, 2, size)}
        rows["token_type_ids"] = [np.zeros(len(r), np.int64) for r in rows["input_ids"]]
        out.append({k: torch.from_numpy(v) for k, v in collate(rows, SPECIAL, rule=RULE, gen=rng).items()})
    return out


# ------------------------------------------------------------------------------------------- LAMB
@pytest.mark.parametrize("adapt_all", [False, True])
def test_multi_tensor_lamb_takes_the_per_tensor_steps(adapt_all):
    """Issue 18 item 8: one set of multi-tensor kernels per group instead of ~10 launches per tensor; the
    same trajectory, weight-decay exclusions and bias correction included, over several steps."""
    from orchestrator.pretrain.optim import Lamb, parameter_groups

    runs = []
    for foreach in (True, False):
        model, module = _tiny()
        opt = Lamb(parameter_groups(model, 0.01), lr=5e-3, weight_decay=0.01, adapt_all=adapt_all, foreach=foreach)
        for batch in _batches(5):
            module(**batch)["loss"].backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        runs.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    _assert_same_weights(*runs)


def _assert_same_weights(fast: dict[str, torch.Tensor], slow: dict[str, torch.Tensor]) -> None:
    """Every weight within 1e-6 of the other's largest, or 1e-7 absolute: a floor far below a step here
    (~1e-3), for the attention's key bias, whose gradient is zero in exact arithmetic (softmax ignores a
    shift), so it moves by rounding noise that differs between two orders of the same arithmetic."""
    moved = 0
    for name in fast:
        assert float((fast[name] - slow[name]).abs().max()) <= 1e-6 * float(slow[name].abs().max()) + 1e-7, name
        moved += not torch.equal(fast[name], _tiny()[0].state_dict()[name])
    assert moved > 10  # the steps did something to compare


@pytest.mark.parametrize("adapt_all", [False, True])
def test_compiled_lamb_takes_the_multi_tensor_steps_and_the_schedule_does_not_recompile_it(adapt_all):
    """``speed.compile_optimizer``: LAMB's update compiled (aot_eager here: inductor's numerics are
    torch's to test) takes the multi-tensor steps, over steps whose learning rate the schedule changes
    every time: compiled once per parameter group (the learning rate and bias corrections are tensors),
    not once per step."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from orchestrator.pretrain.optim import (
        Lamb,
        _compiled_lamb_steps,
        _lamb_update,
        build_scheduler,
        parameter_groups,
    )

    torch._dynamo.reset()
    runs = []
    try:
        for compiled in (True, False):
            model, module = _tiny()
            opt = Lamb(parameter_groups(model, 0.01), lr=5e-3, weight_decay=0.01, adapt_all=adapt_all,
                       compiled=compiled, compile_backend="aot_eager")
            schedule = build_scheduler(opt, warmup_steps=5, total_steps=6, power=1.0)
            rates = []
            for batch in _batches(5):
                module(**batch)["loss"].backward()
                rates.append(opt.param_groups[0]["lr"])
                opt.step()
                schedule.step()
                opt.zero_grad(set_to_none=True)
            runs.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            assert len(set(rates)) == 5  # the schedule moved the learning rate at every step
        assert len(_debug_get_cache_entry_list(_lamb_update.__code__)) == 2  # the two groups, once each
    finally:
        _compiled_lamb_steps.pop("aot_eager", None)
        torch._dynamo.reset()
    _assert_same_weights(*runs)


def test_compile_optimizer_is_lamb_only_and_stays_out_of_the_run_key():
    from orchestrator.core.errors import ConfigError
    from orchestrator.pretrain.config import SpeedConfig
    from orchestrator.pretrain.optim import build_optimizer

    with pytest.raises(ConfigError, match="compile_optimizer compiles LAMB's update; optim.name is adamw"):
        PretrainConfig(optim=OptimConfig(name="adamw"), speed=SpeedConfig(compile_optimizer=True))
    assert PretrainConfig(speed=SpeedConfig(compile_optimizer=True)).training_fields() == \
        PretrainConfig().training_fields()  # how, not what
    with pytest.raises(ValueError, match="AdamW's is one fused kernel"):
        build_optimizer(_tiny()[0], OptimConfig(name="adamw"), 1e-3, compiled=True)
    assert build_optimizer(_tiny()[0], OptimConfig(), 1e-3, compiled=True).compiled


# ----------------------------------------------------------------------------------- statistics
def test_step_statistics_stay_on_the_device_and_sum_to_what_the_host_summed():
    """Issue 18 item 8: the loss and accuracy counts were read back after every micro-batch (six host
    syncs each); now they are summed on the device and read once a step, to the same numbers: each
    micro-batch's loss as float64 over the accumulation count, as the host added them."""
    from orchestrator.modeling.precision import make_scaler
    from orchestrator.pretrain.loop import train_step
    from orchestrator.pretrain.optim import build_optimizer, build_scheduler

    model, module = _tiny()
    model.eval()
    micro = _batches(3, seed=1)
    reference = copy.deepcopy(module)
    outs = [reference(**b) for b in micro]
    opt = build_optimizer(model, OptimConfig(), 1e-3)
    cpu = torch.device("cpu")
    stats = train_step(module, micro, opt, build_scheduler(opt, 0, 10, 1.0), make_scaler("fp32", cpu, 1),
                       precision="fp32", device=cpu, grad_clip=1.0,
                       params=[p for p in model.parameters() if p.requires_grad])
    assert stats.totals.dtype == torch.float64 and stats.totals.shape == (6,)
    for name in ("loss", "mlm_loss", "nsp_loss"):
        host = 0.0
        for out in outs:
            host += float(out[name]) / 3
        assert getattr(stats, name) == host, name
    assert stats.mlm_correct == sum(int(o["mlm_correct"]) for o in outs)
    assert stats.mlm_count == sum(int((b["labels"] != -100).sum()) for b in micro) > 0
    assert stats.tokens == sum(int(b["attention_mask"].sum()) for b in micro)
    assert stats.sequences == 12 and not stats.skipped


def test_the_step_reads_back_only_the_gradient_norm_and_nothing_with_an_optimizer_that_skips_on_the_device():
    """On a GPU a read back to the host waits for the device. The engine's step (unpadded encoder, the data
    thread's indices of the real and masked tokens) reads one value, the gradient norm LAMB's skip needs;
    ``read=False`` with an optimizer that skips on the device reads none, and trains the same
    (``benchmarks/pretrain_gpu.py``'s ``+ no_host_reads`` row measures what that would gain)."""
    import importlib.util
    from pathlib import Path

    from torch.utils._python_dispatch import TorchDispatchMode

    from orchestrator.modeling.precision import make_scaler
    from orchestrator.pretrain.loop import train_step
    from orchestrator.pretrain.optim import build_optimizer, build_scheduler

    class HostReads(TorchDispatchMode):
        READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default)
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func in self.READS
            return func(*args, **(kwargs or {}))

    # the benchmark row's optimizer: taken as skipping on the device, it steps always (these gradients are finite)
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("pretrain_gpu", root / "benchmarks" / "pretrain_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    rng = np.random.default_rng(1)
    micro = []
    for _ in range(4):  # rows of 10-19 tokens: every micro-batch has padding, so the encoder runs unpadded
        rows = {"input_ids": [np.array([2, *rng.integers(5, 100, int(k)), 3]) for k in rng.integers(8, 18, 4)],
                "next_sentence_label": rng.integers(0, 2, 4)}
        rows["token_type_ids"] = [np.zeros(len(r), np.int64) for r in rows["input_ids"]]
        micro.append({k: torch.from_numpy(v) for k, v in collate(rows, SPECIAL, rule=RULE, gen=rng,
                                                                  indices=True).items()})
    cpu = torch.device("cpu")
    runs = {}
    for read in (True, False):
        model, module = _tiny()
        module.unpad = True
        opt = build_optimizer(model, OptimConfig(), 1e-3)
        sched = build_scheduler(opt, 0, 10, 1.0)
        stepped = opt if read else bench._StepsWithoutSkip(opt)
        with HostReads() as reads:
            for step in range(2):
                stats = train_step(module, micro[2 * step:2 * step + 2], stepped, sched,
                                   make_scaler("fp32", cpu, 1), precision="fp32", device=cpu, grad_clip=1.0,
                                   params=[p for p in model.parameters() if p.requires_grad], read=read)
        assert reads.count == (2 if read else 0), (read, reads.count)  # the norm, once a step; or nothing
        assert isinstance(stats.grad_norm, float if read else torch.Tensor)
        runs[read] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    _assert_same_weights(runs[True], runs[False])


def test_with_cuda_graphs_the_gradients_are_kept_and_added_into_in_place_with_the_same_steps():
    """``speed.cuda_graphs``: each parameter's gradient is one tensor for the whole run, zeroed after each
    step and added into by every micro-batch's backward (a gradient a backward creates would be the CUDA
    graph's own output memory, overwritten by the next micro-batch's replay). The steps are those of
    freed gradients: the same weights after three steps of two accumulated micro-batches."""
    from orchestrator.modeling.precision import make_scaler
    from orchestrator.pretrain.loop import train_step
    from orchestrator.pretrain.optim import build_optimizer, build_scheduler

    cpu, micro = torch.device("cpu"), _batches(6, seed=2)
    weights = []
    for graphs in (False, True):
        model, module = _tiny()
        params = [p for p in model.parameters() if p.requires_grad]
        opt = build_optimizer(model, OptimConfig(), 1e-3)
        sched, scaler = build_scheduler(opt, 0, 10, 1.0), make_scaler("fp32", cpu, 1)
        held = None
        for step in range(3):
            train_step(module, micro[2 * step:2 * step + 2], opt, sched, scaler, precision="fp32", device=cpu,
                       grad_clip=1.0, params=params, cuda_graphs=graphs)
            if graphs:
                assert all(p.grad is not None and not p.grad.any() for p in params)  # zeroed, not freed
                held = held or [p.grad for p in params]
                assert all(p.grad is g for p, g in zip(params, held))  # the same tensors every step
            else:
                assert all(p.grad is None for p in params)
        weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    freed, kept = weights
    for name in freed:
        torch.testing.assert_close(kept[name], freed[name], rtol=1e-6, atol=1e-7, msg=name)
    assert not torch.equal(freed["bert.encoder.layer.0.output.dense.weight"],
                           _tiny()[0].state_dict()["bert.encoder.layer.0.output.dense.weight"])


# ------------------------------------------------------------------------------ gradient checkpointing
def test_gradient_checkpointing_changes_memory_not_the_step():
    """Issue 18 item 12: recomputed activations (dropout replayed from the saved RNG state) give the same
    step, so the option is operational: not in the run key, a resume may switch it."""
    from orchestrator.modeling.precision import make_scaler
    from orchestrator.pretrain.loop import train_step
    from orchestrator.pretrain.model import checkpoint_activations
    from orchestrator.pretrain.optim import build_optimizer, build_scheduler

    results = []
    for checkpointing in (False, True):
        model, module = _tiny(dropout=0.1)
        if checkpointing:
            checkpoint_activations(model)
        calls: list[int] = []
        model.bert.encoder.layer[0].attention.register_forward_pre_hook(lambda *_, seen=calls: seen.append(1))
        module.train()
        opt = build_optimizer(model, OptimConfig(), 1e-3)
        torch.manual_seed(7)
        stats = train_step(module, _batches(2, seed=2), opt, build_scheduler(opt, 0, 10, 1.0),
                           make_scaler("fp32", torch.device("cpu"), 1), precision="fp32", device=torch.device("cpu"),
                           grad_clip=1.0, params=[p for p in model.parameters() if p.requires_grad])
        assert len(calls) == (4 if checkpointing else 2)  # 2 micro-batches, each layer run again in backward
        results.append((stats.loss, {k: v.clone() for k, v in model.state_dict().items()}))
    (loss_a, a), (loss_b, b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-6)
    assert all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7) for k in a)
    on = PretrainConfig(gradient_checkpointing=True)
    assert "gradient_checkpointing" not in on.training_fields()
    assert on.training_fields() == PretrainConfig().training_fields()


# ---------------------------------------------------------------------------------------- data path
ROWS = 45  # 5 full batches of 8 an epoch


@pytest.fixture(scope="module")
def rows_dataset(ray_local):
    import ray.data

    rng = np.random.default_rng(3)
    items = []
    for i in range(ROWS):
        a, b = rng.integers(5, 100, int(rng.integers(3, 12))), rng.integers(5, 100, int(rng.integers(3, 12)))
        ids = np.concatenate([[2], a, [3], b, [3]]).astype(np.int32)
        items.append({"input_ids": ids, "token_type_ids": (np.arange(len(ids)) > len(a) + 1).astype(np.int8),
                      "masked_lm_positions": np.zeros(0, np.int32), "masked_lm_ids": np.zeros(0, np.int32),
                      "next_sentence_label": i % 2})
    ds = ray.data.from_items(items)
    # as ordered_ingest() has Ray Train split the training data: without it, Ray Data formats batches on
    # several threads and yields them in the order they finish (measured: two orders in four epochs)
    ds.context.execution_options.preserve_order = True
    return ds


def _todays_stream(shard, seed: int, key: tuple[int, ...], n: int) -> list[dict[str, np.ndarray]]:
    """The loop's data path before issue 18 item 6: read, collate and mask on the training thread."""
    out, epoch = [], 0
    while len(out) < n:
        gen = np.random.default_rng((seed, *key, epoch))
        for rows in shard.iter_batches(batch_size=8, batch_format="numpy", drop_last=True, prefetch_batches=2,
                                       local_shuffle_buffer_size=32, local_shuffle_seed=seed + epoch):
            out.append(collate(rows, SPECIAL, rule=RULE, gen=gen, continuation=SPECIAL.continuation_mask(),
                               indices=True))
        epoch += 1
    return out[:n]


def _take(stream, n: int) -> list:
    return [next(stream) for _ in range(n)]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def test_prefetched_batches_are_todays_batches_and_a_resume_goes_on_where_it_stopped(rows_dataset):
    """Issue 18 items 6 and 12: collated, dynamically masked, NSP-labelled micro-batches made on a
    background thread are the ones the training thread made, over three epochs; a stream started from
    a position (mid-epoch, at an epoch's end, in the second epoch) yields what the uninterrupted one
    yields next, instead of the shard's first rows with fresh masks."""
    from orchestrator.pretrain.loop import _batch_to_torch

    n = 13
    today = _todays_stream(rows_dataset, 42, (0, 0, 0), n)
    with Prefetcher(micro_batches(rows_dataset, 8, SPECIAL, RULE, seed=42, seed_key=(0, 0, 0)), depth=3,
                    transform=_batch_to_torch(True, pin=False)) as stream:
        items = _take(stream, n)
    assert all(isinstance(v, torch.Tensor) for v in items[0][0].values())
    assert all(_same(batch, ref) for (batch, _), ref in zip(items, today))
    assert [p["epoch"] for _, p in items] == [0] * 5 + [1] * 5 + [2] * 3
    assert all((b["labels"] != -100).any() and set(b["next_sentence_label"].tolist()) == {0, 1} for b, _ in items)
    assert not _same(items[0][0], items[5][0])  # a new epoch: other order, other masks
    for k in (3, 5, 7):
        position = items[k - 1][1]
        resumed = micro_batches(rows_dataset, 8, SPECIAL, RULE, seed=42, seed_key=(9, 9, 9), start=position)
        assert all(_same(batch, ref) for (batch, _), ref in zip(_take(resumed, n - k), today[k:])), k
        resumed.close()
    fresh = micro_batches(rows_dataset, 8, SPECIAL, RULE, seed=42, seed_key=(0, 0, 0))
    assert not _same(next(fresh)[0], today[3])  # what a resume without the position read
    fresh.close()


def test_a_local_shard_is_the_workers_equal_share_shuffled_per_epoch_and_a_stream_over_it_resumes(tmp_path):
    """``pretrain.ingest: local``: each worker reads its equal share of the files itself (rows in file
    order, split as Ray Data's ``split(world, equal=True)``: the remainder left out), shuffled whole with
    the epoch's seed; the micro-batch stream over it resumes from a position exactly, as over Ray Data."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.core.artifacts import instance_schema
    from orchestrator.pretrain.data import LocalShard, instance_files, resolve_ingest

    rng = np.random.default_rng(5)
    rows = []
    for i in range(45):
        ids = np.concatenate([[2], rng.integers(5, 100, int(rng.integers(3, 12))), [3]]).astype(np.int32)
        rows.append({"input_ids": ids.tolist(), "token_type_ids": [0] * len(ids), "masked_lm_positions": [],
                     "masked_lm_ids": [], "next_sentence_label": i % 2, "source": "s", "language": ""})
    for name, part in (("part-1.parquet", rows[20:]), ("part-0.parquet", rows[:20])):  # read in name order
        pq.write_table(pa.Table.from_pylist(part, schema=instance_schema()), tmp_path / name)
    files = instance_files(tmp_path)
    assert [f.name for f in files] == ["part-0.parquet", "part-1.parquet"]
    assert resolve_ingest("auto", files) == "local" and resolve_ingest("ray_data", files) == "ray_data"

    shards = [LocalShard(files, rank, 2) for rank in range(2)]
    assert [s.rows for s in shards] == [22, 22]
    firsts = [tuple(r) for s in shards for r in s.columns["input_ids"]]
    assert firsts == [tuple(r["input_ids"]) for r in rows[:44]]  # rank 0 rows 0-21, rank 1 rows 22-43
    # a share is held as one flat array of its tokens (probe G3: an array a row, of every file, took a worker ~12x
    # its share of the files)
    assert [s.columns["input_ids"].values.nbytes for s in shards] == [
        4 * sum(len(r["input_ids"]) for r in part) for part in (rows[:22], rows[22:44])]

    def epoch(shard, seed):
        return [tuple(map(tuple, b["input_ids"])) for b in shard.iter_batches(
            batch_size=8, batch_format="numpy", drop_last=True, local_shuffle_buffer_size=32, local_shuffle_seed=seed)]
    assert len(epoch(shards[0], 1)) == 2 and epoch(shards[0], 1) == epoch(shards[0], 1)
    assert epoch(shards[0], 1) != epoch(shards[0], 2)
    assert {r for b in epoch(shards[0], 1) for r in b} <= set(firsts[:22])

    n = 7
    today = [b for b, _ in _take(micro_batches(shards[1], 8, SPECIAL, RULE, seed=42, seed_key=(1, 0, 0)), n)]
    whole = micro_batches(shards[1], 8, SPECIAL, RULE, seed=42, seed_key=(1, 0, 0))
    positions = [p for _, p in _take(whole, n)]
    for k in (1, 2, 3):  # mid-epoch, at an epoch's end, in the second epoch
        resumed = micro_batches(LocalShard(files, 1, 2), 8, SPECIAL, RULE, seed=42, seed_key=(9, 9, 9),
                                start=positions[k - 1])
        assert all(_same(batch, ref) for (batch, _), ref in zip(_take(resumed, n - k), today[k:])), k
    # auto keeps the key runs had before ingest existed; a reader named explicitly is part of it
    assert "ingest" not in PretrainConfig().training_fields()
    assert PretrainConfig(ingest="local").training_fields()["ingest"] == "local"


def test_a_resume_goes_on_at_the_saved_position_only_under_the_reader_that_saved_it():
    """A checkpoint's data positions are per reader: under the same reader each rank goes on where it
    stopped; under the other (``pretrain.ingest`` changed, or a checkpoint from before the setting,
    which had only Ray Data) the phase starts a fresh epoch and rank 0 says so; a finished phase, a
    phase not yet begun, or no resume data start fresh without a word."""
    from orchestrator.pretrain.loop import data_start

    saved = {"data": {"phase": 1, "positions": [{"epoch": 0, "batch": 3}, {"epoch": 0, "batch": 4}],
                      "ingest": "local"}}
    assert data_start(saved, 1, "phase2", 5, "local", 1) == ({"epoch": 0, "batch": 4}, None)
    start, warning = data_start(saved, 1, "phase2", 5, "ray_data", 0)
    assert start is None and "another reader (local, this run ray_data)" in warning and "phase2" in warning
    old = {"data": {"phase": 1, "positions": [7, 8]}}  # written before pretrain.ingest existed
    assert data_start(old, 1, "phase2", 5, "ray_data", 1) == (8, None)
    assert data_start(old, 1, "phase2", 5, "local", 1)[1].startswith("warning: the checkpoint's data position")
    for args in ((None, 1, "phase2", 5, "local", 0), (saved, 0, "phase1", 5, "local", 0),
                 (saved, 1, "phase2", 0, "local", 0)):
        assert data_start(*args) == (None, None), args


def test_the_data_thread_stops_when_training_stops_early_and_reports_its_errors(rows_dataset):
    before = {t.ident for t in threading.enumerate()}
    source = micro_batches(rows_dataset, 8, SPECIAL, RULE, seed=1, seed_key=(0,))
    stream = Prefetcher(source, depth=2, name="data-test")
    next(stream)
    time.sleep(0.3)  # the thread has filled the queue and waits on it
    assert stream.alive
    started = time.monotonic()
    assert stream.close(timeout=20)
    assert not stream.alive and time.monotonic() - started < 10
    assert source.gi_frame is None  # the generator was closed, and Ray's iterator with it
    with pytest.raises(StopIteration):
        next(stream)

    def broken():
        yield 1
        raise ValueError("row 2 is not a sequence")

    with Prefetcher(broken(), depth=2) as stream:
        assert next(stream) == 1
        with pytest.raises(ValueError, match="row 2"):
            next(stream)
    try:  # the consumer fails mid-phase: leaving the with block stops the thread too
        with Prefetcher(micro_batches(rows_dataset, 8, SPECIAL, RULE, seed=1, seed_key=(0,)), depth=1) as stream:
            next(stream)
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert not stream.alive
    assert not [t for t in threading.enumerate() if t.ident not in before and t.name.startswith(("data", "prefetch"))]
