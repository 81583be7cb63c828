"""cluster.yaml against Ray's own autoscaler schema (offline: no AWS call, no credentials)."""
from __future__ import annotations

import copy
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster() -> dict:
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


def test_cluster_yaml_passes_ray_schema(cluster):
    validate_config(prepare_config(copy.deepcopy(cluster)))


def test_schema_check_is_real(cluster):
    """The same validation rejects a key Ray does not know (so the test above can fail)."""
    broken = copy.deepcopy(cluster)
    broken["available_node_types"]["gpu_worker"]["ssh_port"] = 2222
    with pytest.raises((jsonschema.ValidationError, ValueError)):
        validate_config(prepare_config(broken))


def test_cpu_head_and_autoscaling_gpu_workers(cluster):
    types = cluster["available_node_types"]
    head = types[cluster["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0 and head["resources"]["CPU"] > 0
    gpu = [t for name, t in types.items() if name != cluster["head_node_type"]]
    assert gpu and all(t["min_workers"] == 0 and t["resources"]["GPU"] >= 1 for t in gpu)
    assert all("resources" in t for t in types.values())  # explicit, or the local schema check fails


def test_installs_project_and_keeps_secrets_out(cluster):
    text = (ROOT / "cluster.yaml").read_text()
    assert any("scripts/setup.sh" in c for c in cluster["setup_commands"])
    assert cluster["file_mounts"]["~/bioptorch"] == "."
    assert ".venv" in cluster["rsync_exclude"]
    assert not re.search(r"(AKIA[0-9A-Z]{16}|aws_secret|password\s*[:=]|BEGIN [A-Z ]*PRIVATE KEY)", text, re.I)
    assert "ssh_private_key" not in cluster["auth"]
    # The dashboard / Jobs API is never exposed on a public interface.
    assert not any("0.0.0.0" in c for c in cluster["head_start_ray_commands"])


@pytest.mark.parametrize("name", ["cluster.yaml", "real_data.yaml"])
def test_a_shipped_scale_config_takes_nothing_from_the_laptop_preset_under_it(name):
    """Docs probe D1: configs/cluster.yaml ("seed 000's recipe") left mixer.units and vocab.target_paths to the
    laptop preset a --config file goes over: its SimPT corpus was capped at the preset's 20 units."""
    import importlib.util

    from orchestrator.core.cli import build_parser, resolve_config

    spec = importlib.util.spec_from_file_location("blue_sweep_job", ROOT / "jobs" / "blue_sweep.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    path = str(ROOT / "configs" / name)
    over_preset = resolve_config(job.SPEC, build_parser(job.SPEC).parse_args(["--config", path]))
    alone = resolve_config(job.SPEC, build_parser(job.SPEC).parse_args(["--preset", "none", "--config", path]))
    assert over_preset == alone
