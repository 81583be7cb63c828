"""Trials that differ only in their learning rate (and model, and seed), trained as one batched computation
(issue 31).

A small BERT's fine-tuning step at batch 32 is a few milliseconds of GPU kernels, so a GPU trial pays
for kernel launches and Python, not arithmetic. The trials of one (model, task, seed, fold, epoch grid,
batch size, ...) that differ only in their learning rate read the same batches in the same order, start
from the same weights (the head's initial weights come from the seed) and draw the same dropout masks
(the dropout stream comes from the seed too). So they can run as one computation: their trained
weights stacked on a first axis of size T, the forward ``torch.func.vmap``-ed over that axis with
``randomness="same"`` (one dropout mask for all, drawn from the stream as one trial draws it), one
backward through the sum of the T losses, and each row's AdamW step at its own learning rate (PyTorch's
fused AdamW kernel, one pass over a row's weights, gradients and moments). Each launch of the forward
and backward then does T trials' work.

Attention under vmap: on a GPU, vmap of SDPA's fused kernels failed twice in the first runs of a
bundle (H200, torch 2.11): with dropout, vmap refuses their in-kernel random draws on a batched input
(``randomness="same"``); without it, efficient attention's batching rule rejects BERT's broadcast mask
("attn_bias: wrong shape"). So inside the bundle's forwards ``_Batchable`` computes attention as
SDPA's math path does (scores, mask, softmax, ``F.dropout``, values), which vmap batches on every device
(``F.dropout``'s ``native_dropout`` batches). On CPU that is the path the separate trial runs in
training, so its masks are the bundle's. On a GPU the separate trial's fused kernel draws its attention
masks inside the kernel: a bundled GPU trial has the same hidden-state masks and other attention masks
(the same training, not the same numbers; GPU kernels are not bit-reproducible either).

Linear layers under vmap and autocast: vmap's rule for ``F.linear`` with a bias adds the bias after the
matmul, outside autocast, so a bf16 product plus the fp32 bias came out fp32 (torch 2.13; found in session
38): every activation of a "bf16" bundle was fp32, where the trial alone has autocast's bf16 linear outputs,
so its elementwise work and memory traffic doubled and a cast came before every matmul. ``_Batchable`` takes
``F.linear`` too while autocast is on: the product without the bias (which autocast casts), then the bias
cast to the product's dtype (autocast's linear casts its bias too, and adds it before rounding).

It computes what the separate trials compute: the same batches, masks, losses, gradients (each trial's
loss depends only on its own row of weights), per-trial gradient clipping, per-trial AdamW (PyTorch's
update, with a skipped step for a trial whose gradients are not finite), and the same linear schedule
(a common factor of every trial's learning rate). ``tests/test_bundle.py`` compares every record with
the separate trials' records: the same predictions, scores and losses, up to float rounding (the
batched matrix products sum in another order: losses agree to ~1e-6).

Several models in one bundle (``sweep.bundle_models``): trials of models with the same architecture and
the same tokenizer (``model_family``: seed 000's conventional arm and its untrained floor) read the same
tokenised batches, and with the same seed their heads start the same and they draw the same dropout
masks; only the encoders' starting weights differ. So the trials of such models that differ only in
their model and learning rate train as one computation too, each row of the stack starting from its
own model's weights. The bundle checks what that needs at its start: every model built from its seed
leaves the random stream where the others do (a checkpoint lacking weights draws them: then the
trials train alone, as any bundle that fails before its first epoch), and the models' untrained
tensors (buffers) agree. Only full fine-tuning bundles models: adapter trials freeze a base that
differs between models.

Several seeds in one bundle (``sweep.bundle_seeds``, off by default): a setting's trials of every seed
train as one computation too. Each row keeps what its seed gives its trial alone: its data order (the
seeds' batches are stacked on a first axis, each padded to the widest, which the attention mask hides),
its head's initial weights and the same schedule. One thing differs: dropout. Alone, a trial draws its
masks from its seed's random stream; in a bundle of several seeds every row draws its own masks from
the bundle's one stream (``randomness="different"``; vmap cannot give each row a generator of its own).
So such a trial is the same training as alone, with other dropout draws: not the same numbers (as a GPU's
trial is not a CPU's). Without dropout it is the same, up to float rounding (``tests/test_bundle.py``).
Its record's ``bundle`` lists the ``seeds``. A bundle of several seeds that fails before its first epoch
ends trains as one bundle per seed instead.

Not bundled, trained alone as before: fp16 trials (the loss scale is per trial) and a group of one.
Early stopping is bundled: each trial keeps its own best epoch and stops recording when it is done;
the bundle trains until its last trial is done (the others' extra epochs are discarded).

A bundle's setup, training and evaluation time is shared out equally among its trials' records
(``counts`` and ``seconds``), so sums over records stay the sweep's compute time; ``bundle`` in each
record names the bundle's size and trials.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.func import functional_call, vmap
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from orchestrator.finetune.loop import (
    BestDev,
    Prepared,
    TrialLog,
    _batches,
    _dir_state,
    _stacked_batches,
    build_model,
    predict_with,
    prepare,
    run_trial,
)
from orchestrator.finetune.metrics import METRICS
from orchestrator.finetune.model import TaskModel
from orchestrator.finetune.optim import ADAM_BETAS, ADAM_EPS, decays, linear_schedule
from orchestrator.finetune.spec import TaskSpec
from orchestrator.finetune.trial import TrialSpec, bundle_key, model_family
from orchestrator.modeling.precision import autocast_context

log = logging.getLogger(__name__)

GRAD_CLIP = 1.0  # as run_trial


class StackedWeights:
    """The trained weights of T copies of one model in one [T, N] buffer, with their gradients, AdamW's
    moments and a learning rate per row: one optimizer step is a norm per row and, per row, PyTorch's
    fused AdamW kernel on its two segments.

    A row holds first the weights with decoupled weight decay, then the rest (biases and LayerNorm; every
    weight under Adam), so each segment is one fused update with one decay. ``names`` is that order.
    ``params`` are views of the buffer shaped as the model's parameters with a leading T axis, each a leaf
    whose ``.grad`` is a view of the gradient buffer (autograd adds each backward's gradients into it).
    ``rows``: the model each row starts from (models of one architecture), default ``model`` for every row."""

    def __init__(self, model: torch.nn.Module, learning_rates: Sequence[float], weight_decay: float,
                 decoupled: bool, rows: Sequence[torch.nn.Module] | None = None):
        trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        # decoupled weight decay where make_optimizer puts it (weights; not biases, LayerNorm); Adam: none at all
        decayed = [(n, p) for n, p in trained if decoupled and decays(n)]
        rest = [(n, p) for n, p in trained if not (decoupled and decays(n))]
        self.names = [n for n, _ in decayed + rest]
        self.shapes = [p.shape for _, p in decayed + rest]
        t = len(learning_rates)
        rows = list(rows) if rows is not None else [model] * t
        if len(rows) != t:
            raise ValueError(f"{len(rows)} row models for {t} learning rates")
        with torch.no_grad():
            flats = {id(m): _flat_trained(m, model, self.names) for m in rows}
            self.flat = torch.cat([flats[id(m)] for m in rows], dim=0)
        self.grad = torch.zeros_like(self.flat)
        self.exp_avg, self.exp_avg_sq = torch.zeros_like(self.flat), torch.zeros_like(self.flat)
        device = self.flat.device
        self.lr = torch.tensor(list(learning_rates), dtype=torch.float64, device=device)
        self.steps = torch.zeros(t, dtype=torch.float32, device=device)  # each row's AdamW steps taken
        split = sum(p.numel() for _, p in decayed)
        #: (start, end, weight decay) of a row's segments, each one fused AdamW update
        self.segments = [(a, b, wd) for a, b, wd in ((0, split, weight_decay), (split, self.flat.size(1), 0.0))
                         if b > a]
        # what each row's segment update reads, as views made once (the step only launches): its weights,
        # gradients and moments, its step count, and its learning rate, gradient divisor and skip flag,
        # which the step fills in place
        self._lr_now = torch.zeros(t, dtype=torch.float32, device=device)
        self._divisor, self._skip = torch.ones_like(self._lr_now), torch.zeros_like(self._lr_now)
        self._updates = [
            (([self.flat[r, a:b]], [self.grad[r, a:b]], [self.exp_avg[r, a:b]], [self.exp_avg_sq[r, a:b]], [],
              [self.steps[r]]),
             dict(lr=self._lr_now[r], weight_decay=wd, grad_scale=self._divisor[r], found_inf=self._skip[r]))
            for r in range(t) for a, b, wd in self.segments]
        self.params: dict[str, torch.Tensor] = {}
        offset = 0
        for name, shape in zip(self.names, self.shapes):
            size = shape.numel()
            view = self.flat[:, offset:offset + size].view(t, *shape).requires_grad_(True)
            view.grad = self.grad[:, offset:offset + size].view(t, *shape)
            self.params[name] = view
            offset += size
        # the frozen weights (adapter fine-tuning) and buffers: one copy, shared by every row
        self.shared = {**{n: p for n, p in model.named_parameters() if not p.requires_grad},
                       **dict(model.named_buffers())}

    @torch.no_grad()
    def step(self, factor: float, grad_clip: float) -> None:
        """Clip each row's gradients to ``grad_clip`` (its own norm, as ``clip_grad_norm_``), then take
        PyTorch's AdamW step at learning rate ``lr x factor`` on each row whose gradients are finite (a row
        with an inf/nan gradient is left as it was, its moments and step count too); zero the gradients.

        Each segment's update is ``torch._fused_adamw_``, the kernel of ``AdamW(fused=True)``: it reads the
        weights, gradients and moments once and writes them once, where the same update as [T, N] tensor
        operations passed over the buffers about 30 times (``benchmarks/bundle_step.py``). The clipping enters
        as its ``grad_scale`` (the gradients divided by max(1, norm / grad_clip)), the skip as its
        ``found_inf`` (a row whose norm is not finite is not touched), so nothing is read back to the host."""
        norm = torch.linalg.vector_norm(self.grad, dim=1)
        ok = torch.isfinite(norm)
        self.steps += ok
        self._lr_now.copy_(self.lr * factor)
        if grad_clip > 0:
            self._divisor.copy_(((norm + 1e-6) / grad_clip).clamp_(min=1.0))
        else:
            self._divisor.fill_(1.0)
        self._skip.copy_(~ok)
        beta1, beta2 = ADAM_BETAS
        for tensors, row in self._updates:
            torch._fused_adamw_(*tensors, beta1=beta1, beta2=beta2, eps=ADAM_EPS, amsgrad=False, maximize=False,
                                **row)
        self.grad.zero_()

    def row(self, t: int) -> torch.Tensor:
        """Trial ``t``'s trained weights, a CPU copy (early stopping's best epoch)."""
        return self.flat[t].detach().to("cpu", copy=True)

    @torch.no_grad()
    def load_row(self, t: int, weights: torch.Tensor) -> None:
        self.flat[t].copy_(weights)


def _flat_trained(row: torch.nn.Module, model: torch.nn.Module, names: Sequence[str]) -> torch.Tensor:
    """``row``'s trained weights as one [1, N] row, in the order of ``names`` (``model``'s trained ones);
    refused (RuntimeError: the bundle's trials then train alone) unless ``row`` has ``model``'s trained
    parameters and equal other tensors."""
    params, ours = dict(row.named_parameters()), dict(model.named_parameters())
    trained = [n for n, p in ours.items() if p.requires_grad]
    if row is not model:
        if {n for n, p in params.items() if p.requires_grad} != set(trained) or any(
                params[n].shape != ours[n].shape for n in trained):
            raise RuntimeError("the bundle's models have other trained parameters")
        fixed = {**{n: p for n, p in ours.items() if not p.requires_grad}, **dict(model.named_buffers())}
        theirs = {**{n: p for n, p in params.items() if not p.requires_grad}, **dict(row.named_buffers())}
        if fixed.keys() != theirs.keys() or not all(torch.equal(fixed[n], theirs[n]) for n in fixed):
            raise RuntimeError("the bundle's models differ in tensors they do not train (buffers, frozen weights)")
    return torch.cat([params[n].detach().reshape(1, -1) for n in names], dim=1)


def run_bundle(trials: Sequence[TrialSpec], report: Callable[[dict], None] | None = None,
               task_spec: TaskSpec | None = None) -> list[dict]:
    """Train ``trials`` (the same but for their learning rates, models of one family and seeds: ``bundle_key``)
    as one computation; their records, as ``run_trial`` gives them, in their order. ``report`` gets each
    epoch's rows as ``{"epoch": e, "rows": [one row per trial still recording]}``. One trial, or fp16:
    ``run_trial``.

    A bundle that fails before its first epoch has ended (a device whose vmap lacks a batching rule the
    bundle needs, memory for T copies) trains its trials one at a time instead (a bundle of several seeds:
    one bundle per seed), with a warning; their records say so (``bundle_failed``: the bundle's trials and
    the error). A failure after that is raised."""
    trials = list(trials)

    def alone(trial: TrialSpec) -> dict:
        return run_trial(trial, report=(lambda row: report({"epoch": row["epoch"], "rows": [row]}))
                         if report else None, task_spec=task_spec)

    if len(trials) == 1 or bundle_key(trials[0]) is None:
        if len(trials) > 1:
            raise ValueError(f"{trials[0].precision} trials train alone, not in a bundle of {len(trials)}")
        return [alone(trials[0])]
    families = {d: model_family(d) for d in {t.model_dir for t in trials}}
    seeds = _seeds(trials)
    # (a model without a family counts by its directory)
    if len({bundle_key(t, families[t.model_dir], len(seeds) > 1) for t in trials}) > 1:
        raise ValueError(f"trials {[t.trial_id for t in trials]} differ in more than their learning rates, "
                         "seeds and models of one family")
    if trials[0].optimizer not in ("adamw", "adam"):
        raise ValueError(f"trial {trials[0].trial_id}: optimizer {trials[0].optimizer!r} is not adamw or adam")
    epochs_ended = 0

    def counted(epoch: dict) -> None:
        nonlocal epochs_ended
        epochs_ended += 1
        if report is not None:
            report(epoch)

    try:
        return _train_together(trials, counted, task_spec)
    except (RuntimeError, NotImplementedError, torch.cuda.OutOfMemoryError) as err:
        if epochs_ended:
            raise
        ids = [t.trial_id for t in trials]
        error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        log.warning("the bundle of %s failed before its first epoch ended (%s); training them %s", ", ".join(ids),
                    error, "one seed at a time" if len(seeds) > 1 else "one at a time")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if len(seeds) > 1:  # a bundle per seed (T / seeds rows each: a tenth of the memory for 10 seeds)
            by_seed = [run_bundle([t for t in trials if t.seed == seed], report, task_spec) for seed in seeds]
            records = {r["trial_id"]: r for group in by_seed for r in group}
            return [{**records[t.trial_id], "bundle_failed": {"trial_ids": ids, "error": error}} for t in trials]
        return [{**alone(t), "bundle_failed": {"trial_ids": ids, "error": error}} for t in trials]


def _seeds(trials: Sequence[TrialSpec]) -> list[int]:
    """The trials' seeds, each once, in the trials' order."""
    return list(dict.fromkeys(t.seed for t in trials))


def _train_together(trials: list[TrialSpec], report: Callable[[dict], None],
                    task_spec: TaskSpec | None) -> list[dict]:
    """``run_bundle``'s batched computation (its checks done)."""
    setup_tick = time.perf_counter()
    first = trials[0]
    prep = prepare(first, task_spec)
    model, rows = _models(trials, prep)
    stack = StackedWeights(model, [t.learning_rate for t in trials], first.weight_decay,
                           decoupled=first.optimizer == "adamw", rows=rows)
    del rows
    schedule = linear_schedule([{"lr": 1.0}], first, len(prep.splits["train"]))  # its rate: every trial's factor
    logs = [TrialLog(t, prep) for t in trials]
    n = len(trials)
    train_seconds = eval_seconds = 0.0
    higher = METRICS.get(prep.spec.metric).higher_is_better
    stoppers = [BestDev(first.patience, higher) for _ in trials] if first.patience else None
    best_rows: dict[int, torch.Tensor] = {}
    active = list(range(n))  # trials still recording epochs (early stopping: not done yet)
    seeds = _seeds(trials)
    rngs = [np.random.default_rng(seed) for seed in seeds]  # each seed's data order, as its trials alone draw it
    # several seeds: row t reads its seed's batch (of the stacked ones); one seed: every row the one batch
    row_seed = torch.tensor([seeds.index(t.seed) for t in trials], device=prep.device) if len(seeds) > 1 else None
    batched_loss = _batched_loss(model, stack, row_seed)

    def evaluate(name: str) -> list[list[Any]]:
        nonlocal eval_seconds
        tick = time.perf_counter()
        preds = _predict(model, stack, prep, name, first.batch_size)
        eval_seconds += time.perf_counter() - tick
        return preds

    setup_seconds = time.perf_counter() - setup_tick
    started = time.perf_counter()  # durations on a clock the wall clock's steps do not move
    with warnings.catch_warnings():
        _quiet()
        for epoch in range(1, first.max_epochs + 1):
            tick = time.perf_counter()
            model.train()
            loss_sum, n_batches = torch.zeros(n, device=prep.device), 0
            orders = [rng.permutation(len(prep.splits["train"])).tolist() for rng in rngs]
            batches = (_batches(prep.enc["train"], orders[0], first.batch_size, prep.pad_id, prep.device)
                       if row_seed is None else _stacked_batches(prep.enc["train"], orders, first.batch_size,
                                                                prep.pad_id, prep.device))
            for _, batch, labels in batches:
                with autocast_context(first.precision, prep.device):
                    losses = batched_loss(batch, labels)
                losses.sum().backward()
                stack.step(schedule.get_last_lr()[0], GRAD_CLIP)
                schedule.step()
                loss_sum += losses.detach().float()
                n_batches += 1
            train_seconds += time.perf_counter() - tick
            mean_loss = (loss_sum / max(n_batches, 1)).tolist()
            rows = {t: {"epoch": epoch, "train_loss": mean_loss[t]} for t in active}
            names = ("dev",) if stoppers else ("dev", "test") if epoch in first.eval_epochs else ()
            for name in names:
                preds = evaluate(name)
                for t in active:
                    logs[t].scored(rows[t], name, preds[t])
            for t in active:
                logs[t].epochs.append(rows[t])
                logs[t].counts["train_examples"] += len(prep.splits["train"])
                log.info("%s epoch %d: %s", trials[t].trial_id, epoch, {k: round(v, 4) for k, v in rows[t].items()})
            report({"epoch": epoch, "rows": [dict(rows[t], trial_id=trials[t].trial_id) for t in active]})
            if stoppers:
                for t in active:
                    if stoppers[t].update(epoch, rows[t]["dev"]):
                        best_rows[t] = stack.row(t)
                active = [t for t in active if not stoppers[t].done(epoch)]
                if not active:
                    break
        if stoppers:  # test once, each trial at its best dev epoch's weights
            for t in range(n):
                stack.load_row(t, best_rows[t])
            preds = evaluate("test")
            for t in range(n):
                logs[t].scored(logs[t].epochs[stoppers[t].best_epoch - 1], "test", preds[t])
                logs[t].stopped(stoppers[t])
    seconds = time.perf_counter() - started
    records = []
    for out in logs:
        out.counts.update(train_seconds=train_seconds / n, eval_seconds=eval_seconds / n,
                          setup_seconds=setup_seconds / n)
        records.append({**out.record(seconds / n),
                        "bundle": {"size": n, "trial_ids": [x.trial_id for x in trials], "seconds": round(seconds, 3),
                                   **({"seeds": seeds} if len(seeds) > 1 else {})}})
    return records


def _models(trials: list[TrialSpec], prep: Prepared) -> tuple[TaskModel, list[TaskModel]]:
    """The first trial's model, and the model each trial's row starts from: its own model directory's,
    built from its seed as its trial alone builds it (the splits are the first trial's: one tokenizer).
    The first's is built last, so the random stream is left as its trial leaves it. With one seed every
    build must leave it there (dropout draws one mask for all rows), else RuntimeError; with several, each
    row draws its own masks, so the streams need not agree."""
    first = trials[0]
    built: dict[tuple[str, int], TaskModel] = {}
    states = []
    others = {(t.model_dir, t.seed): t for t in trials if (t.model_dir, t.seed) != (first.model_dir, first.seed)}
    for key, trial in [*others.items(), ((first.model_dir, first.seed), first)]:
        built[key] = build_model(trial, dataclasses.replace(prep, model_state=_dir_state(trial.model_dir)))
        states.append(_rng_states())
    if len(_seeds(trials)) == 1 and any(not all(torch.equal(a, b) for a, b in zip(state, states[-1]))
                                        for state in states):
        raise RuntimeError("building the bundle's models drew different random numbers (a checkpoint lacking "
                           "weights?): their dropout masks would differ")
    return built[(first.model_dir, first.seed)], [built[(t.model_dir, t.seed)] for t in trials]


def _rng_states() -> list[torch.Tensor]:
    """torch's random states: the CPU's and every CUDA device's."""
    return [torch.get_rng_state(), *(torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [])]


def _quiet() -> None:
    """Leave out the warnings a bundle's training raises on purpose."""
    # the gradients are views of rows of one buffer, as meant (autograd adds into them in place)
    warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout contract")


def _attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
               dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
               enable_gqa: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` as its math path computes it (scores, mask, softmax,
    ``F.dropout``, values)."""
    if enable_gqa and key.size(-3) != query.size(-3):
        key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)
    root = math.sqrt(1 / math.sqrt(query.size(-1)) if scale is None else scale)  # split as the math path does
    scores = (query * root) @ (key.transpose(-2, -1) * root)
    if is_causal:
        keep = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
    return F.dropout(scores.softmax(-1), dropout_p) @ value


def _linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` as autocast computes it, in a form whose result vmap leaves in autocast's dtype: the
    product (autocast casts it), then the bias in the product's dtype."""
    out = F.linear(input, weight)
    return out if bias is None else out + bias.to(out.dtype)


class _Batchable(TorchFunctionMode):
    """Inside a bundle's vmapped forwards: attention through ``_attention``, and under autocast linear
    layers through ``_linear`` (see the module's docstring); every other call as it is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return _attention(*args, **kwargs)
        if func is F.linear and torch.is_autocast_enabled((args[0] if args else kwargs["input"]).device.type):
            return _linear(*args, **kwargs)
        return func(*args, **kwargs)


def _batched_loss(model: TaskModel, stack: StackedWeights, row_seed: torch.Tensor | None = None
                  ) -> Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor]:
    """``(batch, labels) -> losses``: each row of ``stack`` run through ``model``, one loss per row. One seed
    (``row_seed`` None): every row on the same batch, dropout's masks the same for every row (drawn once, as
    one trial draws them). Several: ``batch`` and ``labels`` hold one batch per seed on a first axis, row t
    reads ``row_seed[t]``'s, and each row draws its own masks (``randomness="different"``)."""
    def one(params: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        with _Batchable():
            logits = functional_call(model, (params, stack.shared), kwargs=batch)
        return model.loss(logits.float(), labels)

    if row_seed is None:
        same = vmap(one, in_dims=(0, None, None), randomness="same")
        return lambda batch, labels: same(stack.params, batch, labels)
    if getattr(model.encoder.config, "_attn_implementation", "sdpa") != "sdpa":
        raise RuntimeError("a bundle of several seeds needs the encoder's sdpa attention (its 4-D boolean mask)")
    different = vmap(one, in_dims=(0, 0, 0), randomness="different")

    def per_row(batch: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        rows = {k: v.index_select(0, row_seed) for k, v in batch.items()}
        # each row's padding mask, as the 4-D boolean mask transformers builds for sdpa from it (True: attend),
        # broadcast over the queries: given a 2-D mask, transformers branches on its values (to skip a mask
        # without padding), which vmap refuses on a batched input; a 4-D mask it takes as it is. A batch
        # without padding has none (loop._groups).
        if "attention_mask" in rows:
            rows["attention_mask"] = rows["attention_mask"].bool()[:, :, None, None, :]
        return different(stack.params, rows, labels.index_select(0, row_seed))
    return per_row


def _predict(model: TaskModel, stack: StackedWeights, prep: Prepared, name: str, batch_size: int) -> list[list[Any]]:
    """Every row's predictions on split ``name`` (as ``loop.predict``: eval mode, no autocast)."""
    model.eval()
    def one(params: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with _Batchable():
            return functional_call(model, (params, stack.shared), kwargs=batch)

    logits = vmap(one, in_dims=(0, None), randomness="same")
    params = {k: v.detach() for k, v in stack.params.items()}
    return predict_with(lambda batch: logits(params, batch), len(stack.lr), prep.spec, prep.enc[name], batch_size,
                        prep.pad_id, prep.device)
