"""A tiny Ray job for the cluster tests: runs tasks on the cluster it is attached to, prints JSON.

    RAY_ADDRESS=127.0.0.1:6379 python scripts/cluster_local/tiny_job.py --tasks 4

The last line is JSON: the task results, the node that ran them and the cluster's resources, so
a test can tell the job really ran on that cluster (not on an embedded local Ray).
"""
from __future__ import annotations

import argparse
import json
import sys


def square(x: int) -> tuple[int, str]:
    import ray

    return x * x, ray.get_runtime_context().get_node_id()


def main(argv: list[str] | None = None) -> int:
    import ray

    from orchestrator.core.runtime import init_ray

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=4, help="how many remote tasks to run")
    args = parser.parse_args(argv)
    info = init_ray()
    remote = ray.remote(num_cpus=0.5)(square)
    results = ray.get([remote.remote(i) for i in range(args.tasks)])
    out = {"mode": info["mode"], "squares": [r[0] for r in results], "nodes": sorted({r[1] for r in results}),
           "cpus": ray.cluster_resources().get("CPU"), "gcs": ray.get_runtime_context().gcs_address}
    ray.shutdown()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
