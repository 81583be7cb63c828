"""What a sweep cost: each trial's own cost in its record; the sweep's, the sum over the trials it reports.

A trial record's ``cost`` is what its trial held: the time its Ray trial held a slot, on the driver's clock
(from Tune's start of the Ray trial to its result: the worker's start-up included), that slot's CPUs or GPUs,
and the device time they make; a bundle (several trials in one Ray trial) shares both out by the trials' own
times (``seconds``):

    "cost": {"wall_s": 41.2, "device": "GPU", "units": 0.5, "device_h": 0.005722}

The sweep's manifest ``cost`` (``orchestrator.core.cost``) sums the recorded costs of the trials it reports,
those trained now and those reused, plus the slot time no trial held (``idle_device_h``: Ray's start-up, a slot
idle while the last trials end): this run's (its slots x its wall, less its trials'), and an earlier run's in the
share of its trials reused. A record kept before trials were costed is of unknown cost: counted and said, in no
sum. A run that trains nothing over the very trials the manifest recorded keeps that record (what it cost then),
as it does a manifest recorded before trials were costed that counts as many trials as it reports, none costed.
"""
from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from pathlib import Path

from orchestrator.core.config import is_number
from orchestrator.core.cost import COST_FIELD, measured, read_record, this_process
from orchestrator.core.errors import InputError
from orchestrator.core.manifest import read_manifest


def trial_cost(wall_s: float, resources: dict[str, float], share: float = 1.0) -> dict:
    """A trial record's ``cost``: ``share`` of a Ray trial that held ``resources`` (cpu, gpu) for ``wall_s``."""
    held = measured("trial", wall_s, resources["cpu"] * share, resources["gpu"] * share)
    return {"wall_s": round(wall_s, 3), "device": held.device, "units": round(held.units, 6),
            "device_h": round(held.device_h, 6)}


def shares(records: list[dict]) -> list[float]:
    """Each of a Ray trial's records' share of it (a bundle: several), by the trials' own times."""
    seconds = [max(float(rec.get("seconds") or 0.0), 0.0) for rec in records]
    total = sum(seconds)
    return [s / total if total > 0 else 1.0 / len(records) for s in seconds]


def recorded(rec: dict) -> dict | None:
    """A trial record's cost; None for a record kept before trials were costed (or a cost not readable)."""
    cost = rec.get(COST_FIELD)
    ok = isinstance(cost, dict) and is_number(cost.get("device_h")) and isinstance(cost.get("device"), str)
    return cost if ok else None


def trials_key(trial_ids: Iterable[str]) -> str:
    """Which trials a sweep's cost sums (its manifest's, to tell a later run of the same trials)."""
    return hashlib.sha256("\n".join(sorted(trial_ids)).encode()).hexdigest()[:16]


def slots_held(resources: dict[str, float], ray_trials: int, max_concurrent: int = 0) -> tuple[float, float]:
    """(CPUs, GPUs) a sweep's Ray trials held: as many slots as ran at once (the Ray trials, at most
    ``max_concurrent``, at most what the Ray cluster fits), each with a trial's ``resources``."""
    import ray  # heavy: ray

    cluster = ray.cluster_resources()
    fits = [cluster.get("CPU", 0.0) / resources["cpu"]] if resources["cpu"] > 0 else []
    fits += [cluster.get("GPU", 0.0) / resources["gpu"]] if resources["gpu"] > 0 else []
    slots = min(ray_trials, max_concurrent or ray_trials, max(1, int(min(fits))) if fits else 1)
    return slots * resources["cpu"], slots * resources["gpu"]


def sweep_cost(records: list[dict], trained: set[str], wall_s: float, held: tuple[float, float],
               out_dir: str | Path) -> dict:
    """The sweep manifest's ``cost`` over ``records`` (the trials it reports), ``trained`` the ids of those this
    call trained in ``wall_s`` holding ``held`` (CPUs, GPUs: its slots) the while. ``by_model`` shares the
    device time out by each model's trials' recorded device time; ``trials`` and ``trials_by_model`` count
    them (reused, of unknown cost); ``elsewhere``, the device time of trials on another device, in no sum."""
    earlier = read_record(out_dir) or {}
    key = trials_key(rec["trial_id"] for rec in records)
    if not trained and (earlier.get("trials") or {}).get("key") == key:
        return earlier  # the very trials it recorded: what they cost then
    costs = {rec["trial_id"]: recorded(rec) for rec in records}
    if not trained and earlier and "trials" not in earlier and not any(costs.values()) \
            and _trial_count(out_dir) == len(records):
        return earlier  # a sweep recorded before its trials were costed, its trials as many: what it cost then
    known = [c for c in costs.values() if c is not None]
    by_device: dict[str, float] = {}
    for c in known:
        by_device[c["device"]] = by_device.get(c["device"], 0.0) + float(c["device_h"])
    now = measured("sweep", wall_s, *held) if trained else None
    device = now.device if now else max(by_device, key=by_device.get) if by_device else earlier.get("device", "CPU")
    main = {i: c for i, c in costs.items() if c is not None and c["device"] == device}
    count, models, model_h, seconds = _counts(records, trained, costs, main)
    trials_h = sum(float(c["device_h"]) for c in main.values())
    carried_idle, carried_wall = _carried(earlier, device, count["reused_device_h"])
    idle_now = max(0.0, now.device_h - sum(float(c["device_h"]) for i, c in main.items() if i in trained)) \
        if now else 0.0
    record = {"wall_s": round(wall_s + carried_wall, 3) if now else round(carried_wall, 3) if carried_wall else -1.0,
              "device": device, "units": now.units if now else float(earlier.get("units", 0.0)),
              "device_h": round(trials_h + carried_idle + idle_now, 6),
              "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "by": this_process()}
    if not now:  # made by the runs that trained its trials: reused
        record.update(made=earlier.get("made", record["made"]), by=earlier.get("by", "earlier runs"))
    if count["reused"] and now:  # the part earlier runs spent, which this call's summary and log line tell apart
        record.update(earlier_wall_s=round(carried_wall, 3),
                      earlier_device_h=round(count["reused_device_h"] + carried_idle, 6))
    count["reused_device_h"] = round(count["reused_device_h"], 6)
    record["trials"] = {**count, "device_h": round(trials_h, 6), "key": key}
    record["idle_device_h"] = round(carried_idle + idle_now, 6)
    elsewhere = {d: round(h, 6) for d, h in by_device.items() if d != device}
    if elsewhere:  # trials of another device (a sweep run on CPUs, then more of its trials on GPUs): said, not summed
        record["elsewhere"] = elsewhere
    weights, whole = (model_h, trials_h) if trials_h > 0 else (seconds, sum(seconds.values()))
    record["by_model"] = {m: round(record["device_h"] * w / (whole or 1.0), 6) for m, w in weights.items()}
    record["trials_by_model"] = {m: {**c, "reused_device_h": round(c["reused_device_h"], 6)}
                                 for m, c in models.items()}
    return record


def _counts(records: list[dict], trained: set[str], costs: dict[str, dict | None],
            main: dict[str, dict]) -> tuple[dict, dict[str, dict], dict[str, float], dict[str, float]]:
    """Over ``records``: the trials counted (``count``, and per model), reused (not in ``trained``), of unknown
    cost (``costs`` None) and the reused ones' device time; each model's device time on the sweep's device
    (``main``) and its trials' seconds (the shares' weights when no trial's device time is known)."""
    count = {"count": 0, "reused": 0, "unknown": 0, "reused_device_h": 0.0}
    models: dict[str, dict] = {}
    model_h: dict[str, float] = {}
    seconds: dict[str, float] = {}
    for rec in records:
        model = rec.get("trial", {}).get("model_name", "?")
        reused = rec["trial_id"] not in trained
        h = float(main[rec["trial_id"]]["device_h"]) if rec["trial_id"] in main else 0.0
        for c in (count, models.setdefault(model, {"count": 0, "reused": 0, "unknown": 0, "reused_device_h": 0.0})):
            c["count"] += 1
            c["reused"] += reused
            c["unknown"] += costs[rec["trial_id"]] is None
            c["reused_device_h"] += h if reused else 0.0
        model_h[model] = model_h.get(model, 0.0) + h
        seconds[model] = seconds.get(model, 0.0) + float(rec.get("seconds") or 0.0)
    return count, models, model_h, seconds


def _carried(earlier: dict, device: str, reused_h: float) -> tuple[float, float]:
    """An earlier run's slot time no trial held, and its wall, carried in the share of its trials' device time
    reused now (``reused_h``); none from a run on another device or of no known trial time."""
    before = earlier.get("trials") or {}
    share = (min(1.0, reused_h / float(before["device_h"]))
             if earlier.get("device") == device and is_number(before.get("device_h")) and before["device_h"] > 0
             else 0.0)
    return float(earlier.get("idle_device_h", 0.0)) * share, max(float(earlier.get("wall_s", 0.0)), 0.0) * share


def _trial_count(out_dir: str | Path) -> int | None:
    """How many trials the sweep's manifest counts (None without one)."""
    try:
        return int(read_manifest(out_dir).get("counts", {}).get("trials", -1))
    except (FileNotFoundError, InputError, AttributeError, TypeError, ValueError):
        return None
