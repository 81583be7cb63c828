"""benchmarks/gpu_experiment.sh, the instrument of the GPU sessions' one device call, runs its own steps on
CPU: it packs the data the GPU experiment reads, and `run --dry-run` extracts it beside a copy of the
checkout, dry-runs the experiment there and brings back its files (with a stand-in nvidia-smi, the
device's description and its load too). A defect here costs a GPU session's scarce device time."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile

import pytest

from conftest import ROOT, SHARED_DATA, copy_checkout

#: Stands in for nvidia-smi: a query prints a device, `dmon` prints a load line a second until killed.
FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *dmon*) while true; do echo "# gpu    sm"; echo "    0    42"; sleep 1; done ;;
  *) echo "name, memory.total [MiB], driver_version"; echo "Stand-in GPU, 1024 MiB, 0.0" ;;
esac
"""


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"real data not available at {SHARED_DATA}")
@pytest.mark.skipif(shutil.which("xz") is None, reason="the script packs with tar's xz (xz-utils)")
def test_pack_then_a_dry_run_brings_back_the_log_and_the_device_files(tmp_path):
    repo = copy_checkout(tmp_path / "repo")
    (tmp_path / "shared").symlink_to(ROOT.parent / "shared")  # the script reads ../shared from the checkout
    script = ["bash", "benchmarks/gpu_experiment.sh"]
    packed = subprocess.run([*script, "pack"], cwd=repo, capture_output=True, text=True, timeout=300)
    assert packed.returncode == 0, packed.stderr[-2000:]
    with tarfile.open(repo / ".gpu" / "data.tar.xz") as archive:
        names = archive.getnames()
    assert "data/pubmed_sample/PubMedAbstract_1MB.txt" in names and any(n.startswith("data/hoc") for n in names)

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    ran = subprocess.run([*script, "run", "--dry-run"], cwd=repo, env=env, capture_output=True, text=True,
                         timeout=600)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    assert ran.stdout.strip().splitlines()[-1].startswith("experiment: exit 0, wall ")
    log = (out / "experiment.txt").read_text()
    assert "dry run: config and inputs are valid" in log and "cryptography" not in log
    # the run lived in .gpu/experiment: the data beside a copy of the checkout, as on the GPU host
    assert (repo / ".gpu" / "experiment" / "shared" / "data" / "hoc").is_dir()
    assert (repo / ".gpu" / "experiment" / "repo" / "experiments" / "oubiobert_ablation_gpu.yaml").is_file()
    gpu = (out / "gpu.txt").read_text()
    assert "Stand-in GPU, 1024 MiB" in gpu and "torch " in gpu and "cpus " in gpu
    assert "    0    42" in (out / "dmon.txt").read_text()
