"""Stop only the Ray processes of one head: those whose command line names its private --temp-dir.

    python scripts/cluster_local/stop_ray_head.py /tmp/rayXYZ

Why: `ray stop` (which `ray down` always runs) kills every Ray process on the machine, including
other users' and other tests' clusters. The local-provider test routes `ray stop` here instead
(scripts/cluster_local/ray_wrapper.sh), so tearing down its cluster leaves everything else running.
"""
from __future__ import annotations

import argparse
import os
import sys

import psutil


def head_processes(temp_dir: str) -> list[psutil.Process]:
    """The head's processes: those whose argv mentions ``temp_dir`` (GCS, raylet, dashboard,
    monitors) and all their descendants (workers and agents rename themselves ``ray::...``)."""
    mine = {os.getpid(), os.getppid()}
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.info["pid"] not in mine and any(temp_dir in arg for arg in cmdline):
            found[proc.pid] = proc
            try:
                found.update((child.pid, child) for child in proc.children(recursive=True))
            except psutil.NoSuchProcess:
                pass
    return [p for pid, p in found.items() if pid not in mine]


def stop(temp_dir: str, grace_s: float = 5.0) -> int:
    """SIGTERM, then SIGKILL whatever is left after ``grace_s``; returns how many were stopped."""
    temp_dir = os.path.realpath(temp_dir)
    if len(temp_dir) < 8 or temp_dir in ("/tmp", "/tmp/ray"):
        raise SystemExit(f"refusing to match processes on a shared path: {temp_dir}")
    procs = head_processes(temp_dir)
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    print(f"stopped {len(procs)} Ray processes of {temp_dir}")
    return len(procs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("temp_dir", help="the head's private --temp-dir")
    parser.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    args = parser.parse_args(argv)
    stop(args.temp_dir, args.grace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
