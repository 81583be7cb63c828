"""The runtime module: embedded Ray on loopback, cluster detection, seeding."""
from __future__ import annotations

import random

import numpy as np
import ray
import torch

from orchestrator.core import runtime


def test_cluster_address_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(runtime, "_CLUSTER_MARKER", tmp_path / "absent")
    assert runtime.cluster_address() is None
    assert runtime.cluster_address("10.0.0.1:6379") == "10.0.0.1:6379"
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:7777")
    assert runtime.cluster_address() == "127.0.0.1:7777"
    assert runtime.cluster_address("local") is None
    monkeypatch.delenv("RAY_ADDRESS")
    marker = tmp_path / "ray_current_cluster"
    marker.write_text("127.0.0.1:6379")
    monkeypatch.setattr(runtime, "_CLUSTER_MARKER", marker)
    assert runtime.cluster_address() == "auto"


def test_embedded_ray_binds_loopback(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(runtime, "_CLUSTER_MARKER", tmp_path / "absent")
    if ray.is_initialized():  # left over by another test module's session fixture
        ray.shutdown()
    with runtime.ray_session(num_cpus=1) as info:
        assert info["mode"] == "local"
        assert info["resources"]["CPU"] == 1
        nodes = ray.nodes()
        assert {n["NodeManagerAddress"] for n in nodes} == {"127.0.0.1"}

        @ray.remote(num_cpus=0)
        def where():
            import orchestrator

            return orchestrator.__file__

        assert ray.get(where.remote()).endswith("orchestrator/__init__.py")
    assert not ray.is_initialized()


def test_seed_everything_is_repeatable():
    runtime.seed_everything(123)
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    runtime.seed_everything(123)
    assert a == (random.random(), np.random.rand(), torch.rand(1).item())
    assert runtime.choose_device("auto").type in ("cpu", "cuda")


def test_embedded_ray_can_restart_in_one_process(monkeypatch, tmp_path):
    """A second embedded Ray after a shutdown must not try to reach the first (dead) one."""
    import os

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(runtime, "_CLUSTER_MARKER", tmp_path / "absent")
    if ray.is_initialized():
        ray.shutdown()
    for _ in range(2):
        runtime.init_ray(num_cpus=1)
        assert ray.is_initialized() and "RAY_ADDRESS" not in os.environ
        ray.shutdown()


def test_unreachable_cluster_fails_fast_with_a_clear_error(monkeypatch):
    import socket

    import pytest

    from orchestrator.core.errors import OrchestratorError

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(OrchestratorError, match="not reachable.*unset RAY_ADDRESS"):
        runtime.init_ray()
