"""What a stage cost: its wall time and its device time (the CPUs or GPUs it held x that time).

A stage records its cost in its manifest (``manifest.json``'s ``cost``) when it is made, so a
later run that reuses the output still reports what it cost then (``reused``):

    {"wall_s": 252.1, "device": "CPU", "units": 1.0, "device_h": 0.07, "made": "2026-11-25T19:02:11Z",
     "by": "host:4242:1764097331"}

``by`` is the process that made it (host, pid and the process's start): an output another job made while
this one waited for it (two jobs at once on shared stages) is reused by this one too, though made after
this one started.

``units`` is what the stage held: a pretraining run its Train workers' CPUs (or GPUs); a data
stage (corpus, vocabulary, instances, which spread over Ray Data tasks) the CPUs of the Ray
cluster it ran on, an upper bound of what it used. A sweep records each trial's cost in its trial
record, and its ``device_h`` is the sum over the trials it reports, trained now or reused, plus the
slot time no trial held (``orchestrator.sweep.cost``); its ``trials`` say how many were reused and
how many of unknown cost (records kept before trials were costed), which the summary says.
"""
from __future__ import annotations

import calendar
import dataclasses
import functools
import json
import os
import socket
import time
from pathlib import Path

import psutil

from orchestrator.core.manifest import MANIFEST
from orchestrator.core.runtime import available_cpus

COST_FIELD = "cost"


@dataclasses.dataclass(frozen=True)
class StageCost:
    stage: str  # the output's name: corpus, vocab, instances/len64, pretrain, random-init, sweep, ...
    wall_s: float
    device: str = "CPU"  # CPU | GPU
    units: float = 1.0  # CPUs or GPUs held
    device_h: float = 0.0
    reused: bool = False  # made by an earlier run, reused by this one
    shared: str = ""  # the other arms this output is shared with (an experiment)
    earlier_wall_s: float = 0.0  # of ``wall_s``, what earlier runs spent on it (a sweep some of whose trials they ran)
    trials: int = 0  # a sweep (or a model's share of it): the trials it sums,
    reused_trials: int = 0  # those trained by earlier runs,
    reused_device_h: float = 0.0  # their part of ``device_h``,
    unknown_trials: int = 0  # and those of unknown cost (records kept before trials were costed): in no sum
    elsewhere: dict[str, float] = dataclasses.field(default_factory=dict)  # trials on another device: {device: h}

    def record(self) -> dict:
        """The manifest's ``cost`` entry."""
        return {"wall_s": round(self.wall_s, 3), "device": self.device, "units": self.units,
                "device_h": round(self.device_h, 6), "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "by": this_process()}


@functools.cache
def this_process() -> str:
    """A cost record's maker: this host, this process's pid and its start time (a pid used again is another)."""
    return f"{socket.gethostname()}:{os.getpid()}:{psutil.Process().create_time():.0f}"


def measured(stage: str, wall_s: float, cpus: float = 1.0, gpus: float = 0.0) -> StageCost:
    """A stage that held ``gpus`` GPUs (if any, its device time is GPU-hours) or ``cpus`` CPUs for ``wall_s``."""
    device, units = ("GPU", gpus) if gpus > 0 else ("CPU", cpus)
    return StageCost(stage, wall_s, device, units, wall_s * units / 3600.0)


def from_record(stage: str, record: dict | None, *, since: float | None = None) -> StageCost | None:
    """A manifest's ``cost`` entry; ``reused`` when it was made before ``since`` (the run's start, epoch s) or,
    since then, by another process (a job this one waited for: it counted that job's builds as its own)."""
    if not record or "wall_s" not in record:
        return None
    made = record.get("made")
    reused = False
    if since is not None and made:
        try:
            reused = calendar.timegm(time.strptime(made, "%Y-%m-%dT%H:%M:%SZ")) < int(since)
        except ValueError:
            reused = False
        reused = reused or record.get("by", this_process()) != this_process()
    return StageCost(stage, float(record["wall_s"]), str(record.get("device", "CPU")), float(record.get("units", 1.0)),
                     float(record.get("device_h", 0.0)), reused,
                     earlier_wall_s=float(record.get("earlier_wall_s", 0.0)), **_trials(record.get("trials")),
                     elsewhere=dict(record.get("elsewhere") or {}))


def _trials(counts: dict | None) -> dict:
    """A sweep cost record's trial counts (``orchestrator.sweep.cost``) as StageCost fields; none in other records."""
    counts = counts if isinstance(counts, dict) else {}
    return {"trials": int(counts.get("count", 0)), "reused_trials": int(counts.get("reused", 0)),
            "reused_device_h": float(counts.get("reused_device_h", 0.0)),
            "unknown_trials": int(counts.get("unknown", 0))}


def read_record(stage_dir: str | Path) -> dict | None:
    """A stage output's manifest ``cost`` entry (None for an output made before costs were recorded)."""
    try:
        return json.loads((Path(stage_dir) / MANIFEST).read_text(encoding="utf-8")).get(COST_FIELD)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return None


def read_cost(stage_dir: str | Path, stage: str, *, since: float | None = None) -> StageCost | None:
    """The cost a stage output's manifest records; ``reused`` when made before ``since``."""
    return from_record(stage, read_record(stage_dir), since=since)


def sweep_share(sweep_dir: str | Path, model: str, *, since: float | None = None) -> StageCost | None:
    """One model's share of a sweep: the device time of its trials (no wall time of its own: ``wall_s``
    is -1, the trials of every model ran together)."""
    record = read_record(sweep_dir)
    whole = from_record("sweep", record, since=since)
    if whole is None or model not in (record or {}).get("by_model", {}):
        return None
    return dataclasses.replace(whole, stage="sweep (its trials)", wall_s=-1.0, earlier_wall_s=0.0, elsewhere={},
                               device_h=float(record["by_model"][model]),
                               **_trials((record.get("trials_by_model") or {}).get(model)))


def cluster_units() -> tuple[float, float]:
    """(CPUs, GPUs) of the connected Ray cluster, or this machine's CPUs without Ray."""
    try:
        import ray  # heavy: ray

        if ray.is_initialized():
            res = ray.cluster_resources()
            return float(res.get("CPU", 1.0)), 0.0
    except ImportError:  # pragma: no cover - ray is a hard dependency
        pass
    return float(available_cpus()), 0.0


def duration(seconds: float, tenths: bool = True) -> str:
    """12.3s, 4m05s, 1h02m; with ``tenths=False`` a short time reads 0m12s, as a progress line's columns do."""
    if seconds < 60 and tenths:
        return f"{seconds:.1f}s"
    minutes = int(seconds // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{int(seconds % 60):02d}s"


def device_text(cost: StageCost) -> str:
    return f"{cost.device_h:.3f} {cost.device}-h"


def cost_note(row: dict) -> str:
    """A cost row's note (``StageCost`` fields, as the summary has them and the experiment page reads them from
    its tags): reused; this run's part of a sweep some of whose trials earlier runs trained; its trials of
    unknown cost or on another device, in no sum; the arms it is shared with."""
    wall, earlier, reused = float(row.get("wall_s", 0.0)), float(row.get("earlier_wall_s", 0.0)), row.get("reused")
    n, done, unknown = (int(row.get(k) or 0) for k in ("trials", "reused_trials", "unknown_trials"))
    device = row.get("device", "CPU")
    notes = ["reused" if reused else "",
             f"{duration(wall - earlier)} this run, the rest an earlier run's" if earlier > 0 and not reused
             and wall >= 0 else "",
             f"{done} of {n} trials reused, {float(row.get('reused_device_h') or 0.0):.3f} {device}-h of it"
             if done and not reused else "",
             f"{unknown} of {n} trials of unknown cost, kept before trials were costed and not in it"
             if unknown else "",
             *(f"{h:.3f} {d}-h of trials on {d}s, not in it" for d, h in (row.get("elsewhere") or {}).items()),
             f"shared with {row['shared']}" if row.get("shared") else ""]
    return ", ".join(n for n in notes if n)


def cost_lines(costs: dict[str, list[StageCost]], total_wall_s: float | None = None) -> list[str]:
    """The summary's block: per arm (or model), each stage's wall and device time, and the arm's total."""
    if not any(costs.values()):
        return []
    lines = ["cost          : wall time, device time (CPUs or GPUs held x wall); reused = made by an earlier run"]
    width = max(len(c.stage) for stages in costs.values() for c in stages)
    for owner, stages in costs.items():
        if not stages:
            continue
        lines.append(f"  {owner}")
        for c in stages:
            wall = "-" if c.wall_s < 0 else duration(c.wall_s)
            note = cost_note(dataclasses.asdict(c))
            lines.append(f"    {c.stage:<{width}}  {wall:>8}  {device_text(c):>14}" + (f"  ({note})" if note else ""))
        by_device: dict[str, float] = {}
        for c in stages:
            by_device[c.device] = by_device.get(c.device, 0.0) + c.device_h
        total = ", ".join(f"{h:.3f} {d}-h" for d, h in by_device.items())
        lines.append(f"    {'total':<{width}}  {'':>8}  {total:>14}")
    if total_wall_s is not None:
        lines.append(f"  this run took {duration(total_wall_s)}")
    return lines
