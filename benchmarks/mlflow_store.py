"""Seconds to make a new run directory's MLflow store: MLflow's own (tables, then every schema
migration) vs the copy of the kept empty store (``orchestrator.track.local_store``), same run.

    python benchmarks/mlflow_store.py --repeats 5

Each repeat makes one store each way in a fresh directory, in turn, and opens it with an
``MlflowClient`` (``search_experiments``), so both are timed to a usable store. The kept empty store
is made before the clock (once per MLflow version on a machine). Last line printed: JSON with
``speedup`` (median MLflow seconds / median copy seconds).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="stores made each way")
    args = parser.parse_args()
    import mlflow

    from orchestrator.track.local_store import start_local_store

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")
        warm = Path(tmp) / "warm"
        warm.mkdir()
        start_local_store(f"sqlite:///{warm / 'mlflow.db'}")  # the kept empty store, outside the clock
        timings: dict[str, list[float]] = {"mlflow": [], "copy": []}
        for i in range(args.repeats):
            for way in timings:
                run_dir = Path(tmp) / f"{way}{i}"
                run_dir.mkdir()
                uri = f"sqlite:///{run_dir / 'mlflow.db'}"
                started = time.perf_counter()
                if way == "copy":
                    start_local_store(uri)
                mlflow.MlflowClient(uri).search_experiments()
                timings[way].append(time.perf_counter() - started)
                print(f"{i + 1}/{args.repeats} {way}: {timings[way][-1]:.3f} s", flush=True)
    median = {way: statistics.median(values) for way, values in timings.items()}
    print(json.dumps({"mlflow_s": round(median["mlflow"], 3), "copy_s": round(median["copy"], 4),
                      "speedup": round(median["mlflow"] / median["copy"], 1), "repeats": args.repeats,
                      "mlflow_version": mlflow.__version__}))


if __name__ == "__main__":
    main()
