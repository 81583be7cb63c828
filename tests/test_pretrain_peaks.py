"""The MFU peak table (issue 18, item 11): looked up by the exact CUDA device name, never guessed, and
fp32 divided by the TF32 peak only when TF32 matmuls are on (fast: no training, no GPU)."""
from __future__ import annotations

import pytest
import torch

from orchestrator.pretrain.peaks import PEAKS, peak_flops


@pytest.mark.parametrize("name, bf16", [
    ("NVIDIA H100 80GB HBM3", 989e12),  # SXM5
    ("NVIDIA H100 PCIe", 756.5e12),
    ("NVIDIA H100 NVL", 835.5e12),
    ("NVIDIA H200", 989e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A100-PCIE-40GB", 312e12),
])
def test_each_card_has_its_own_peak_by_its_exact_name(name, bf16):
    assert peak_flops(name, "bf16", tf32=True) == bf16
    assert peak_flops(name, "fp16", tf32=False) == bf16  # the tf32 switch does not touch half precision


@pytest.mark.parametrize("name", ["NVIDIA H100", "H100", "NVIDIA H100 80GB", "NVIDIA A10G", "Tesla V100-SXM2-16GB",
                                  "cpu", ""])
def test_a_name_not_in_the_table_has_no_peak(name):
    assert peak_flops(name, "bf16", tf32=True) is None


def test_fp32_is_divided_by_the_tf32_peak_only_when_tf32_is_on():
    assert peak_flops("NVIDIA H100 80GB HBM3", "fp32", tf32=True) == 494.5e12
    assert peak_flops("NVIDIA H100 80GB HBM3", "fp32", tf32=False) == 67e12
    assert peak_flops("NVIDIA A100-SXM4-40GB", "fp32", tf32=True) == 156e12
    assert peak_flops("NVIDIA A100-SXM4-40GB", "fp32", tf32=False) == 19.5e12
    for peak in PEAKS.values():  # the orders the hardware has: half >= tf32 >= fp32
        assert peak.bf16 == peak.fp16 >= peak.tf32 >= peak.fp32
    with pytest.raises(ValueError, match="precision must be"):
        peak_flops("NVIDIA H200", "int8", tf32=True)


def test_the_loops_mfu_uses_the_table_and_the_tf32_setting(monkeypatch):
    """An fp32 run with TF32 on at the TF32 peak's rate is 100 % busy, not 7x over (the fp32 peak)."""
    from orchestrator.pretrain.loop import estimate_mfu

    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    assert estimate_mfu(1e6, 494.5e6, 1, "NVIDIA H100 80GB HBM3", "fp32") == pytest.approx(1.0)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    assert estimate_mfu(1e6, 67e6, 1, "NVIDIA H100 80GB HBM3", "fp32") == pytest.approx(1.0)
    assert estimate_mfu(1e6, 756.5e6, 1, "NVIDIA H100 PCIe", "bf16") == pytest.approx(1.0)
    assert estimate_mfu(1e6, 1e6, 1, "NVIDIA H100", "bf16") is None
