"""Peak dense tensor throughput per GPU model, keyed by the exact name CUDA reports, for MFU.

``torch.cuda.get_device_name()`` tells apart cards that share a family name but not a peak: an
"NVIDIA H100 80GB HBM3" (SXM5) does 989 bf16 TFLOPS, an "NVIDIA H100 PCIe" 756, an "NVIDIA H100 NVL"
835. A substring match ("H100") would divide the PCIe card's rate by the SXM peak. So the lookup is
exact, and a name the table does not hold gives None (MFU reported as unknown, never a guessed peak).

fp32 work runs on TF32 tensor cores when ``torch.backends.cuda.matmul.allow_tf32`` is on (the engine
turns it on for CUDA, ``modeling.precision.allow_tf32``): its peak is then the TF32 one, otherwise the
plain fp32 one, so an MFU can never exceed 1 because of the precision it is divided by.

Figures: NVIDIA's data sheets halved where they quote 2:4 sparsity (dense), FLOP/s per GPU.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    bf16: float
    fp16: float
    tf32: float
    fp32: float


_H100_SXM = Peak(bf16=989e12, fp16=989e12, tf32=494.5e12, fp32=67e12)
_H100_PCIE = Peak(bf16=756.5e12, fp16=756.5e12, tf32=378e12, fp32=51e12)
_H100_NVL = Peak(bf16=835.5e12, fp16=835.5e12, tf32=417.5e12, fp32=60.0e12)  # per GPU of the pair
_A100 = Peak(bf16=312e12, fp16=312e12, tf32=156e12, fp32=19.5e12)  # SXM4 and PCIe have the same peaks

#: ``torch.cuda.get_device_name()`` -> its peaks.
PEAKS: dict[str, Peak] = {
    "NVIDIA H100 80GB HBM3": _H100_SXM,
    "NVIDIA H100 PCIe": _H100_PCIE,
    "NVIDIA H100 NVL": _H100_NVL,
    "NVIDIA H200": _H100_SXM,  # the same compute as the H100 SXM5, more and faster memory
    "NVIDIA H200 NVL": _H100_NVL,
    "NVIDIA GH200 480GB": _H100_SXM,
    "NVIDIA A100-SXM4-40GB": _A100,
    "NVIDIA A100-SXM4-80GB": _A100,
    "NVIDIA A100-PCIE-40GB": _A100,
    "NVIDIA A100 80GB PCIe": _A100,
}


def peak_flops(device_name: str, precision: str, tf32: bool) -> float | None:
    """The peak FLOP/s of ``device_name`` for ``precision`` (fp32, bf16, fp16); for fp32, the TF32
    peak when ``tf32`` (TF32 matmuls allowed) else the fp32 one. None for a device not in PEAKS."""
    peak = PEAKS.get(device_name.strip())
    if peak is None:
        return None
    if precision == "fp32":
        return peak.tf32 if tf32 else peak.fp32
    if precision not in ("bf16", "fp16"):
        raise ValueError(f"precision must be fp32, bf16 or fp16, got {precision!r}")
    return getattr(peak, precision)
