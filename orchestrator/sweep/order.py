"""The order a sweep's Ray trials start in: the longest first (``sweep.order``).

Ray Tune starts a grid's trials in the grid's order as slots free up. The grid's order is the
sweep's (model, task, learning rate, seed): a sweep whose last task is its largest, or whose
bundles of several models come after the single-model ones (seed 000's GPU ablation), starts its
longest trials last, and their tail runs on a few slots while the others idle. Starting the
longest first (LPT, Graham 1969) bounds that tail by the shortest trials instead: the makespan of
list scheduling in that order is at most 4/3 of the best possible.

A trial's length is estimated on the driver from its task's splits as the trial reads them (the
same caps, folds and re-splits: ``finetune.loop.load_splits``), in word positions: the training
examples' words x epochs x 3 (a forward and a backward), plus the dev and test examples' words x
evaluations. Each example's words count up to the trial's ``max_seq_length``. A bundle's estimate
is its trials' sum. The order changes no trial's result, only when each starts. The same estimate
gives the sweep's progress line its time left (the trials' work done, not their number).
"""
from __future__ import annotations

import dataclasses
import heapq
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.finetune.trial import TrialSpec

log = logging.getLogger(__name__)

TRAIN_COST = 3  # a training example's forward, its backward (about twice a forward) against an evaluation's forward


def example_words(example: Any, cap: int) -> int:
    """An example's words (an NER example's tokens; a pair's two texts), at most ``cap``."""
    words = len(example.text_a) if isinstance(example.text_a, list | tuple) else len(str(example.text_a).split())
    if example.text_b:
        words += len(str(example.text_b).split())
    return min(max(1, words), cap)


def trial_work(trial: TrialSpec, splits: dict[str, Sequence[Any]]) -> float:
    """``trial``'s estimated work in word positions, from the ``splits`` it trains and evaluates on."""
    def words(name: str) -> int:
        return sum(example_words(e, trial.max_seq_length) for e in splits.get(name, ()))

    if trial.patience:  # early stopping: dev after every epoch (at most max_epochs), test once
        evaluations = trial.max_epochs * words("dev") + words("test")
    else:
        evaluations = len(trial.eval_epochs) * (words("dev") + words("test"))
    return TRAIN_COST * trial.max_epochs * words("train") + evaluations


def split_reader() -> Callable[[TrialSpec], dict[str, Sequence[Any]]]:
    """``trial -> its splits`` as its worker reads them (``load_splits``), each (task, data, fold, caps) read once."""
    from orchestrator.finetune.loop import load_splits  # heavy: torch
    from orchestrator.finetune.spec import load_task

    cache: dict[tuple, dict[str, Sequence[Any]]] = {}

    def read(trial: TrialSpec) -> dict[str, Sequence[Any]]:
        key = (trial.task, trial.data_dir, trial.fold, trial.max_train_examples, trial.max_eval_examples)
        if key not in cache:
            cache[key] = load_splits(dataclasses.replace(load_task(trial.task), dir=""), trial)
        return cache[key]

    return read


def estimated_work(trials: Sequence[TrialSpec],
                   splits: Callable[[TrialSpec], dict[str, Sequence[Any]]]) -> dict[str, float]:
    """Each trial's ``trial_work`` by trial id. A trial whose data directory the driver does not see (a path
    on the workers only) gets inf; a split the driver reads as bad input raises here, as the trial would
    (``InputError``: file, line, what was expected), before any trial starts."""
    work: dict[str, float] = {}
    unseen: set[str] = set()
    for trial in trials:
        if not Path(trial.data_dir).is_dir():
            unseen.add(trial.data_dir)
            work[trial.trial_id] = math.inf
        else:
            work[trial.trial_id] = trial_work(trial, splits(trial))
    if unseen:
        log.info("sweep: the driver does not see %s; their trials count as the longest (sweep.order) and the "
                 "time left is counted in trials", ", ".join(sorted(unseen)))
    return work


def group_work(group: Sequence[TrialSpec], work: Mapping[str, float]) -> float:
    """A Ray trial's work: its trials' (one trial, or a bundle's rows)."""
    return sum(work[t.trial_id] for t in group)


def longest_first(groups: list[list[TrialSpec]], work: Mapping[str, float]) -> list[list[TrialSpec]]:
    """``groups`` (Ray trials: a trial or a bundle) sorted by their trials' summed ``work`` (by trial id),
    the longest first (inf: first); equal sums keep their grid order."""
    sums = [group_work(group, work) for group in groups]
    ranked = sorted(range(len(groups)), key=lambda i: -sums[i])  # sorted() is stable: ties keep the grid's order
    return [groups[i] for i in ranked]


def list_schedule_end(works: Sequence[float], slots: int) -> float:
    """When the last of ``works`` (in start order) ends, each started on the first slot that frees (as Tune
    starts trials), in the units of ``works``: what ``longest_first``'s order is estimated to save."""
    free = [0.0] * max(1, slots)
    for work in works:
        heapq.heappush(free, heapq.heappop(free) + work)
    return max(free)


def estimated_ends(groups: list[list[TrialSpec]], work: Mapping[str, float], slots: int) -> dict[str, float]:
    """When the last Ray trial ends on ``slots`` slots (``list_schedule_end``) in the grid's order and longest
    first, and the lower bound (the larger of the total work over the slots and the longest Ray trial)."""
    grid = [group_work(g, work) for g in groups]
    return {"grid": list_schedule_end(grid, slots),
            "longest_first": list_schedule_end([group_work(g, work) for g in longest_first(groups, work)], slots),
            "bound": max(sum(grid) / max(1, slots), max(grid, default=0.0))}
