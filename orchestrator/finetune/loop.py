"""One fine-tuning trial: (model, task, learning rate, seed), with epoch sharing.

A trial trains once to the largest epoch count of its grid and evaluates dev and test only
after the epochs the grid asks about, so every epoch value is answered without training it
again. Ray-free: the Tune trainable in ``orchestrator.sweep.runner`` passes ``report``.

Deviation to know about: the linear learning-rate schedule spans the trial's largest epoch
count, so "epoch 5 of a 10-epoch trial" has not decayed to zero as a separate 5-epoch run
would; ``benchmarks/sweep_epoch_sharing.py`` measures whether the selection changes.

Early stopping (``trial.patience`` > 0) replaces the epoch grid: dev is scored after every epoch,
the weights of the best dev epoch so far are kept (a CPU copy, taken only when dev improves), the
trial stops ``patience`` epochs after its best (or at ``max_epochs``, which the schedule spans),
and test is scored once, on the best dev epoch's weights, into that epoch's row.

What a trial pays besides its arithmetic (a GPU trial's steps are milliseconds): a Tune worker runs
many trials (``reuse_actors``), so each process keeps, per model and task, the tokenizer, the
tokenised splits and the loaded encoder weights (``_process_cached``, keyed by the files' sizes and
times) and copies the weights for each trial; each split is padded once into tensors on the trial's
device and every batch is a slice of them, so no batch is built from Python lists or copied from
the host. The results are those of loading everything afresh (``tests/test_sweep.py``).
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from orchestrator.core.manifest import library_versions
from orchestrator.core.runtime import choose_device, seed_everything
from orchestrator.finetune.encoding import Encoded, encode_cached
from orchestrator.finetune.metrics import METRICS, ner_per_tag
from orchestrator.finetune.model import TaskModel
from orchestrator.finetune.optim import linear_schedule, make_optimizer
from orchestrator.finetune.readers import (
    CV_SPLIT_SEED,
    Example,
    document_split,
    fixed_subset,
    read_split,
    stratified_folds,
)
from orchestrator.finetune.spec import TaskSpec, load_task
from orchestrator.finetune.tokenizer import load_tokenizer
from orchestrator.finetune.trial import TrialSpec
from orchestrator.modeling.precision import (
    allow_tf32,
    autocast_context,
    make_scaler,
    optimizer_update,
)

log = logging.getLogger(__name__)


CV_DEV_SHARE = 0.1  # share of the training folds held out as dev for selecting lr / epochs


_PROCESS_CACHE: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
# entries kept per kind (key[0]): tokenised splits of a few tasks x models; encoder weights of two
# models (a BERT-base's are 440 MB in each worker process)
_PROCESS_CACHE_SIZE = {"tokenizer": 8, "splits": 16, "encoder": 2}


def _process_cached(key: tuple, make: Callable[[], Any]) -> Any:
    """``make()`` once per ``key`` in this process (the least recently used of its kind dropped)."""
    if key in _PROCESS_CACHE:
        _PROCESS_CACHE.move_to_end(key)
        return _PROCESS_CACHE[key]
    value = _PROCESS_CACHE[key] = make()
    same = [k for k in _PROCESS_CACHE if k[0] == key[0]]  # oldest first
    for old in same[:max(0, len(same) - _PROCESS_CACHE_SIZE.get(key[0], 8))]:
        del _PROCESS_CACHE[old]
    return value


def _dir_state(path: str | Path) -> tuple:
    """The files directly in ``path`` with their sizes and modification times: a cache key that
    changes when a model is re-pretrained or a task file rewritten in place."""
    try:
        with os.scandir(path) as entries:
            return tuple(sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in entries if e.is_file()))
    except OSError:
        return ()


def load_splits(spec: TaskSpec, trial: TrialSpec, read: dict[str, int] | None = None) -> dict[str, list[Example]]:
    """train / dev / test examples of one trial. Fixed splits are read from their files (capped);
    a cross-validated task reads its one file, holds out fold ``trial.fold`` as test and carves a
    stratified dev share from the remaining folds (seed 000's DocClsJp: 5-fold stratified CV), its
    splits capped as fixed ones are (``max_eval_examples`` was once ignored there). A task scored per
    document has its dev and test capped by whole documents (``fixed_subset``). ``read`` is given each
    split's size before the cap (a split the cap sampled is smaller: what the report says of its scores)."""
    by_document = METRICS.get(spec.metric).per_document

    def cap(split: str, examples: list[Example]) -> list[Example]:
        if read is not None:
            read[split] = len(examples)
        if split == "train":
            return fixed_subset(examples, trial.max_train_examples)
        return fixed_subset(examples, trial.max_eval_examples, by_document)

    if spec.resplit:
        splits = document_split(read_split(spec, trial.data_dir, "all"), spec.resplit, spec.group_separator,
                                CV_SPLIT_SEED)
        return {split: cap(split, splits[split]) for split in ("train", "dev", "test")}
    if not spec.cv_folds:
        return {split: cap(split, read_split(spec, trial.data_dir, split)) for split in spec.file_splits}
    from sklearn.model_selection import train_test_split  # heavy: sklearn

    examples = read_split(spec, trial.data_dir, "all")
    folds = stratified_folds(examples, spec.cv_folds, CV_SPLIT_SEED)
    if not 0 <= trial.fold < len(folds):
        raise ValueError(f"trial {trial.trial_id}: fold {trial.fold} outside 0..{len(folds) - 1}")
    rest, test = folds[trial.fold]
    labels = [examples[i].label for i in rest]
    stratify = labels if min(collections.Counter(labels).values()) >= 2 else None  # a singleton class cannot be split
    train, dev = train_test_split(rest, test_size=CV_DEV_SHARE, random_state=CV_SPLIT_SEED, stratify=stratify)
    pick = lambda idx: [examples[i] for i in sorted(idx)]  # noqa: E731
    return {"train": cap("train", pick(train)), "dev": cap("dev", pick(dev)), "test": cap("test", pick(test))}


def _on_device(enc: Encoded, pad_id: int, device: torch.device) -> tuple[dict[str, torch.Tensor], torch.Tensor,
                                                                          list[int]]:
    """The split padded to its longest example, as tensors on ``device`` (built once per split and
    device): inputs by key, labels (NER: per token, padded with the ignore index), and lengths."""
    key = f"{device}:{pad_id}"
    if key not in enc.tensors:
        lengths = [len(f["input_ids"]) for f in enc.features]
        width = max(lengths, default=1)
        inputs = {name: torch.tensor([f[name] + [pad_id if name == "input_ids" else 0] * (width - len(f[name]))
                                      for f in enc.features]).to(device)
                  for name in (enc.features[0] if enc.features else ())}
        if enc.word_index is not None:
            labels = torch.tensor([t + [-100] * (width - len(t)) for t in enc.targets])
        else:
            labels = torch.tensor(enc.targets)
        enc.tensors[key] = (inputs, labels.to(device), lengths)
    return enc.tensors[key]


def _batches(enc: Encoded, order: list[int], batch_size: int, pad_id: int, device: torch.device) -> Any:
    """(example indices, inputs, labels) on ``device``, ``batch_size`` examples of ``order`` at a time,
    padded to the batch's longest example: slices of the split's device tensors (``_on_device``)."""
    return _groups(enc, [order[start:start + batch_size] for start in range(0, len(order), batch_size)], pad_id,
                   device)


def _groups(enc: Encoded, groups: list[list[int]], pad_id: int, device: torch.device) -> Any:
    """``_batches`` for batches given as lists of example indices. A batch without padding comes without its
    attention mask: the encoder then runs as it does for an all-ones mask, without reading one back from a GPU
    to find that out (``modeling.bert.sdpa_padding_mask``)."""
    inputs, labels, lengths = _on_device(enc, pad_id, device)
    where = torch.as_tensor([i for idx in groups for i in idx], dtype=torch.long).to(device)
    start = 0
    for idx in groups:
        width = max(lengths[i] for i in idx)
        padded = min(lengths[i] for i in idx) < width
        rows = where[start:start + len(idx)]
        start += len(idx)
        batch = {k: v.index_select(0, rows)[:, :width].contiguous() for k, v in inputs.items()
                 if padded or k != "attention_mask"}
        picked = labels.index_select(0, rows)
        if enc.word_index is not None:
            picked = picked[:, :width].contiguous()
        yield idx, batch, picked


def _stacked_batches(enc: Encoded, orders: list[list[int]], batch_size: int, pad_id: int, device: torch.device
                     ) -> Any:
    """``_batches`` of several orders of one split at once: at each step, the step's batch of every order
    stacked on a first axis ([orders, batch, width]; labels [orders, batch(, width)]), all padded to the
    widest of them (the attention mask hides the extra positions; NER's labels there are the ignore index)."""
    count = len(orders)
    steps = [[order[start:start + batch_size] for order in orders] for start in range(0, len(orders[0]), batch_size)]
    together = _groups(enc, [[i for rows in step for i in rows] for step in steps], pad_id, device)
    for idx, (_, batch, labels) in zip(steps, together):
        yield idx, {k: v.view(count, -1, *v.shape[1:]) for k, v in batch.items()}, labels.view(count, -1,
                                                                                               *labels.shape[1:])


def eval_groups(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Evaluation's batches: the examples longest first, each batch as many as fit in the tokens of
    ``2 x batch_size`` examples of the split's longest (its largest batch when evaluation took ``2 x
    batch_size`` examples in their order, so no batch needs more memory than then). Sorted, a batch
    pads little, and short examples fill few batches: on a GPU, fewer and fuller launches."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    budget = 2 * batch_size * max(lengths, default=1)
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def predict(model: TaskModel, spec: TaskSpec, enc: Encoded, batch_size: int, pad_id: int,
            device: torch.device) -> list[Any]:
    """Predictions in the task's label space (floats, label names, tag lists, label-index tuples)."""
    model.eval()
    return predict_with(lambda batch: model(**batch)[None], 1, spec, enc, batch_size, pad_id, device)[0]


def predict_with(forward: Callable[[dict[str, torch.Tensor]], torch.Tensor], n: int, spec: TaskSpec, enc: Encoded,
                 batch_size: int, pad_id: int, device: torch.device) -> list[list[Any]]:
    """The predictions of ``n`` models at once: ``forward(batch)`` gives their logits stacked on a first
    axis of size ``n`` (a bundle's trials, ``orchestrator.finetune.bundle``); one list per model. The
    batches are ``eval_groups``; each batch's logits are decoded on the device (argmax, threshold) and
    read back once."""
    out: list[list[Any]] = [[None] * len(enc.examples) for _ in range(n)]
    lengths = _on_device(enc, pad_id, device)[2]
    with torch.no_grad():
        for idx, batch, _ in _groups(enc, eval_groups(lengths, batch_size), pad_id, device):
            decoded = _decoded(spec, forward(batch).float())
            for t in range(n):
                for row, i in enumerate(idx):
                    out[t][i] = _prediction(spec, decoded[t][row], enc, i)
    return out


def _decoded(spec: TaskSpec, logits: torch.Tensor) -> list:
    """A batch's logits ``[models, rows, ...]`` as nested lists: the score (sts), the labels over the
    threshold (multilabel), or the arg-max label index (per position for ner)."""
    if spec.family == "sts":
        return logits.reshape(logits.shape[0], logits.shape[1]).tolist()
    if spec.family == "multilabel":
        return (logits > 0).tolist()
    return logits.argmax(-1).tolist()


def _prediction(spec: TaskSpec, decoded: Any, enc: Encoded, i: int) -> Any:
    """Example ``i``'s prediction in the task's label space from its row of ``_decoded``."""
    if spec.family == "sts":
        return decoded
    if spec.family == "multilabel":
        return tuple(j for j, over in enumerate(decoded) if over)
    if spec.family == "ner":
        n_words = len(enc.examples[i].text_a)
        tags = [spec.labels[decoded[pos]] if pos >= 0 else "O" for pos in enc.word_index[i]]
        return tags + ["O"] * (n_words - len(tags))  # words cut off by max_seq_length
    return spec.labels[decoded]


def score(spec: TaskSpec, examples: list[Example], preds: list[Any]) -> float:
    metric = METRICS.get(spec.metric)
    gold = [ex.label for ex in examples]
    return metric(gold, preds, labels=spec.labels, negative_labels=spec.negative_labels,
                  docs=[ex.doc for ex in examples])


@dataclasses.dataclass
class BestDev:
    """Early stopping's bookkeeping: the best dev score so far and its epoch. A tie is no
    improvement (the earlier, shorter-trained epoch stays best)."""

    patience: int
    higher_is_better: bool
    best_epoch: int = 0
    best_dev: float = math.nan

    def update(self, epoch: int, dev: float) -> bool:
        """Take ``epoch``'s dev score; True when it is the best so far (the first one always is)."""
        if self.best_epoch and not (dev > self.best_dev if self.higher_is_better else dev < self.best_dev):
            return False
        self.best_epoch, self.best_dev = epoch, dev
        return True

    def done(self, epoch: int) -> bool:
        """``patience`` epochs have ended since the best one."""
        return epoch - self.best_epoch >= self.patience


@dataclasses.dataclass
class Prepared:
    """What a trial reads before it trains: the task, the device, the tokenised splits (padded onto the
    device), kept per process for the next trial of the same model and task (``_process_cached``)."""

    spec: TaskSpec
    device: torch.device
    pad_id: int
    splits: dict[str, list[Example]]
    enc: dict[str, Encoded]
    model_state: tuple
    read: dict[str, int] = dataclasses.field(default_factory=dict)  # each split's size before the caps


def prepare(trial: TrialSpec, task_spec: TaskSpec | None = None) -> Prepared:
    """``trial``'s task, device, tokenizer and tokenised splits (the tokenizer: the sweep driver's copy, else
    transformers' ``AutoTokenizer``, ``finetune.tokenizer.load_tokenizer``)."""
    # trial.data_dir already is the task's own directory (see orchestrator.sweep.space.task_data_dir)
    spec = dataclasses.replace(task_spec or load_task(trial.task), dir="")
    torch.set_num_threads(max(1, trial.num_threads))
    device = choose_device(trial.device)
    allow_tf32(device)
    model_state = _dir_state(trial.model_dir)
    tokenizer = _process_cached(("tokenizer", trial.model_dir, model_state),
                                lambda: load_tokenizer(trial.model_dir, trial.cache_dir))
    pad_id = tokenizer.pad_token_id or 0
    data_key = ("splits", json.dumps(dataclasses.asdict(spec), sort_keys=True, default=str), trial.data_dir,
                _dir_state(trial.data_dir), trial.fold, trial.max_train_examples, trial.max_eval_examples,
                trial.max_seq_length, trial.model_dir, model_state, trial.cache_dir)

    def read_and_encode() -> tuple[dict[str, list[Example]], dict[str, Encoded], dict[str, int]]:
        read: dict[str, int] = {}
        splits = load_splits(spec, trial, read)
        enc = {name: encode_cached(spec, trial, name, exs, tokenizer) for name, exs in splits.items()}
        if any(e.cut for e in enc.values()):  # said once a process and model: the words past the cut go unread
            log.warning("%s: inputs longer than max_seq_length %d word pieces of %s are cut to it: %s", spec.name,
                        trial.max_seq_length, trial.model_name, ", ".join(
                            f"{name} {e.cut:,} of {len(e.examples):,}" for name, e in enc.items()))
        return splits, enc, read

    splits, enc, read = _process_cached(data_key, read_and_encode)
    for split in enc.values():  # padded onto the device once (kept with the cached split for later trials)
        _on_device(split, pad_id, device)
    return Prepared(spec, device, pad_id, splits, enc, model_state, read)


def build_model(trial: TrialSpec, prep: Prepared) -> TaskModel:
    """The trial's model on its device, seeded by ``trial.seed`` (the head's initial weights, fresh
    adapters): the same model for every trial of that seed."""
    seed_everything(trial.seed)
    model = TaskModel(trial.model_dir, prep.spec, encoder=_encoder_copy(trial.model_dir, prep.model_state))
    if trial.reinit_layers:
        model.reinit_top_layers(trial.reinit_layers)
    if prep.spec.head_bias_init == "prior":
        model.init_bias_to_prior(prep.enc["train"].targets)
    if trial.tune == "adapters":
        model.tune_adapters_only(trial.adapter_reduction_factor)
    return model.to(device=prep.device)


class TrialLog:
    """One trial's record as it trains: its epoch rows, test predictions, NER per-tag scores and counts."""

    def __init__(self, trial: TrialSpec, prep: Prepared):
        self.trial, self.spec, self.splits = trial, prep.spec, prep.splits
        self.cut = {f"{name}_cut": enc.cut for name, enc in prep.enc.items()}  # inputs cut to max_seq_length
        self.read = {f"{name}_read": n for name, n in prep.read.items()}  # a split's size before the caps
        self.epochs: list[dict] = []
        self.predictions: dict[str, dict[str, list]] = {}
        self.per_tag: dict[str, dict[str, dict[str, float]]] = {}  # NER: epoch -> entity type -> P/R/F1/support
        self.counts = {"train_examples": 0, "eval_examples": 0, "train_seconds": 0.0, "eval_seconds": 0.0}
        self.stopping: dict = {}

    def scored(self, row: dict[str, Any], name: str, pred: list[Any]) -> None:
        """``pred`` (the model's predictions on split ``name``) scored into ``row`` (test: kept too)."""
        row[name] = score(self.spec, self.splits[name], pred)
        self.counts["eval_examples"] += len(self.splits[name])
        if name == "test":
            self.predictions[str(row["epoch"])] = {"test": _jsonable(pred)}
            if self.spec.family == "ner":
                self.per_tag[str(row["epoch"])] = ner_per_tag([ex.label for ex in self.splits["test"]], pred)

    def stopped(self, stopper: BestDev) -> None:
        """Early stopping's summary, once test is scored at the best dev epoch."""
        self.stopping = {"early_stopping": {"patience": self.trial.patience, "max_epochs": self.trial.max_epochs,
                                            "best_epoch": stopper.best_epoch, "stopped_epoch": len(self.epochs)}}
        log.info("%s: best dev %.4f at epoch %d, stopped after epoch %d", self.trial.trial_id, stopper.best_dev,
                 stopper.best_epoch, len(self.epochs))

    def record(self, seconds: float) -> dict:
        split_sizes = {f"{name}_size": len(self.splits[name]) for name in ("train", "dev", "test")}
        return {"trial_id": self.trial.trial_id, "trial": dataclasses.asdict(self.trial), "task": self.spec.name,
                "metric": self.spec.metric, "epochs": self.epochs, "predictions": self.predictions,
                "test_ids": [ex.id for ex in self.splits["test"]],  # what each prediction is of, in their order
                "per_tag": self.per_tag, **self.stopping,
                "counts": {**self.counts, **split_sizes, **self.cut, **self.read},
                "seconds": round(seconds, 3),
                "versions": library_versions()}  # what it trained under: a sweep reusing it says an upgrade since


def run_trial(trial: TrialSpec, report: Callable[[dict], None] | None = None,
              task_spec: TaskSpec | None = None, keep: Callable[[TaskModel], None] | None = None,
              stop_after: int = 0) -> dict:
    """Fine-tune, evaluating at ``trial.eval_epochs`` (or, with ``trial.patience``, with early
    stopping on dev); returns the trial record (JSON-safe). ``report`` gets each epoch's row as it
    ends; ``keep`` gets the fine-tuned model at the end (early stopping: at its best dev epoch).
    ``stop_after`` > 0 ends the trial after that epoch, its learning-rate schedule still spanning
    ``trial.max_epochs``: the model of one epoch of a shared-epoch trial, exactly as the trial had it."""
    setup_tick = time.perf_counter()  # setup: imports (a worker's first trial), tokenizer, data, model
    prep = prepare(trial, task_spec)
    spec, device, pad_id, enc = prep.spec, prep.device, prep.pad_id, prep.enc
    train = prep.splits["train"]
    model = build_model(trial, prep)
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    optim = make_optimizer(trained, trial)
    params = [p for _, p in trained]
    scaler = make_scaler(trial.precision, device, init_scale=2.0 ** 16)
    skipped_steps = 0  # fp16: steps whose scaled gradients overflowed (the scale halves, the weights stay)
    sched = linear_schedule(optim.param_groups, trial, len(train))
    rng = np.random.default_rng(trial.seed)
    stopper = BestDev(trial.patience, METRICS.get(spec.metric).higher_is_better) if trial.patience else None
    best_weights: dict[str, torch.Tensor] = {}
    out = TrialLog(trial, prep)
    counts = out.counts

    def evaluate(row: dict[str, Any], names: tuple[str, ...]) -> None:
        """Score the model as it is now on the splits ``names`` into ``row`` (test: its predictions too)."""
        tick = time.perf_counter()
        for name in names:
            out.scored(row, name, predict(model, spec, enc[name], trial.batch_size, pad_id, device))
        counts["eval_seconds"] += time.perf_counter() - tick

    counts["setup_seconds"] = time.perf_counter() - setup_tick
    started = time.perf_counter()  # durations on a clock the wall clock's steps do not move
    for epoch in range(1, trial.max_epochs + 1):
        tick = time.perf_counter()
        model.train()
        loss_sum, n_batches = torch.zeros((), device=device), 0  # summed on the device: no host sync a step
        order = rng.permutation(len(train)).tolist()
        for _, batch, labels in _batches(enc["train"], order, trial.batch_size, pad_id, device):
            with autocast_context(trial.precision, device):
                logits = model(**batch)
                loss = model.loss(logits.float(), labels)
            scaler.scale(loss).backward()
            _, skipped = optimizer_update(params, optim, sched, scaler, grad_clip=1.0, read=False)
            if scaler.is_enabled():  # fp16's rows count them (elsewhere the skip stays on the device, unread)
                skipped_steps += skipped
            loss_sum += loss.detach().float()
            n_batches += 1
        counts["train_examples"] += len(train)
        counts["train_seconds"] += time.perf_counter() - tick
        row: dict[str, Any] = {"epoch": epoch, "train_loss": float(loss_sum / max(n_batches, 1))}
        if trial.precision == "fp16":
            row["loss_scale"], row["skipped_steps"] = float(scaler.get_scale()), skipped_steps
        if stopper is not None:
            evaluate(row, ("dev",))
            if stopper.update(epoch, row["dev"]):  # a CPU copy of the weights that train (frozen ones stay as loaded)
                best_weights = {name: p.detach().to("cpu", copy=True) for name, p in trained}
        elif epoch in trial.eval_epochs:
            evaluate(row, ("dev", "test"))
        out.epochs.append(row)
        log.info("%s epoch %d: %s", trial.trial_id, epoch, {k: round(v, 4) for k, v in row.items()})
        if report is not None:
            report(dict(row))
        if stopper is not None and stopper.done(epoch):
            break
        if stop_after and epoch >= stop_after:
            break
    if stopper is not None:
        with torch.no_grad():
            for name, p in trained:
                p.copy_(best_weights[name])
        evaluate(out.epochs[stopper.best_epoch - 1], ("test",))
        out.stopped(stopper)
    if keep is not None:
        keep(model)
    return out.record(time.perf_counter() - started)


def _encoder_copy(model_dir: str, model_state: tuple) -> torch.nn.Module | None:
    """A fresh copy of ``model_dir``'s encoder, loaded once per process; None (TaskModel loads it) when
    loading it draws random numbers (weights the checkpoint lacks), so the copy could differ from a load.
    The trial load runs on a forked generator: the trial's seeded stream is the same whether this process
    loads the model now or found it cached (a first trial drew twice, a later one once)."""
    from orchestrator.modeling.encoder import load_encoder  # heavy: torch

    def load() -> torch.nn.Module | None:
        with torch.random.fork_rng(devices=[]):  # loaded on the CPU
            before = torch.get_rng_state()
            encoder = load_encoder(model_dir)
            drew = not torch.equal(before, torch.get_rng_state())
        return None if drew else encoder

    cached = _process_cached(("encoder", model_dir, model_state), load)
    return None if cached is None else copy.deepcopy(cached)


def _jsonable(preds: list[Any]) -> list[Any]:
    return [list(p) if isinstance(p, tuple) else p for p in preds]
