"""FP8 matmuls for the encoder's linear layers (issue 30, ``pretrain.speed.fp8``).

What MLPerf's H100 BERT runs (Transformer Engine) and torchao's float8 training do, in its simplest
recipe, "tensorwise" dynamic scaling: each matmul's two operands are scaled by one factor per tensor
so that their largest magnitude meets the format's largest value, cast to 8 bits and multiplied by
``torch._scaled_mm`` (FP8 tensor cores on CUDA devices of compute capability 8.9 and up: H100, L4,
Ada; float32 accumulation), the factors undone in its output:

- forward, ``y = x W^T``: x and W in e4m3 (3 mantissa bits, largest 448);
- backward, ``dx = g W`` and ``dW = g^T x``: the output gradient g in e5m2 (2 mantissa bits, largest
  57,344: gradients need range more than precision), W and x as the forward cast them.

The casts and amax reductions are memory-bound passes of their own: ``pretrain.speed.compile`` fuses
them into the kernels around the matmul, and without it the FP8 step is expected to be slower than
bf16. Only the encoder layers' six linear layers use it (queries, keys, values, the attention's output
projection, the feed-forward block's two): the embeddings, the pooler, the MLM head and its vocabulary
projection stay in bf16, as torchao recommends for the first and last layers.

This changes the arithmetic (the operands are rounded to 8 bits), so unlike the other speed switches
it is part of a run's key (``PretrainConfig.training_fields``). The weights stay float32 masters in the
model's own ``torch.nn.Linear`` modules (``Float8Linear`` only replaces their ``forward``): the state
dict, the checkpoints and ``from_pretrained`` are unchanged. tests/test_pretrain_speed.py checks each
product against the same quantised operands multiplied in float32, and the loss and gradients of an
FP8 model against bf16 within FP8's error.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from orchestrator.core.errors import ConfigError

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
#: ``torch._scaled_mm`` on CUDA needs every dimension a multiple of 16: the rows are padded to it
ROW_MULTIPLE = 16
#: the smallest amax a scale is computed from (a smaller one would overflow float32: 448 / 1e-38 = inf)
AMAX_FLOOR = 1e-12
#: the modules of a ``BertLayer`` (by attribute path) that ``use_float8`` switches
LAYER_LINEARS = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
                 "intermediate.dense", "output.dense")


def fp8_refusal(device: torch.device) -> str | None:
    """Why ``device`` cannot run FP8 matmuls, or None. CPU runs them (slowly: for the tests)."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        return (f"{torch.cuda.get_device_name(device)} has compute capability {major}.{minor}; FP8 matmuls need "
                "8.9 or later (H100, H200, L4, L40, RTX 40xx)")
    if device.type not in ("cuda", "cpu"):
        return f"FP8 matmuls run on CUDA (and, for tests, CPU), not {device.type}"
    return None


def quantize(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``t`` scaled to ``dtype``'s range and cast: (the 8-bit tensor, the float32 factor that undoes the
    scaling). The amax is floored at ``AMAX_FLOOR`` (as torchao does): an all-zero tensor gets a finite
    scale, not 0 x inf. Not differentiable (rounding): call it under ``no_grad`` or in a backward."""
    largest = torch.finfo(dtype).max
    amax = t.abs().amax().float().clamp(min=AMAX_FLOOR)
    scale = largest / amax
    return (t.float() * scale).clamp(-largest, largest).to(dtype), scale.reciprocal()


def _column_major(t: torch.Tensor) -> torch.Tensor:
    """The same matrix laid out column by column (``_scaled_mm``'s second operand on CUDA)."""
    return t.t().contiguous().t()


class _Float8Matmul(torch.autograd.Function):
    """``x @ weight.T`` ([rows, in] x [out, in]; rows a multiple of ``ROW_MULTIPLE``) from the operands
    ``quantize`` made of them (outside the Function, so that torch.compile fuses the casts with the kernels
    around them); the gradients of ``x`` and ``weight`` from the output gradient in e5m2."""

    @staticmethod
    def forward(ctx, x, weight, xq, x_inv, wq, w_inv, out_dtype):
        ctx.save_for_backward(xq, x_inv, wq, w_inv)  # 8-bit activations kept: a quarter of float32's memory
        ctx.dtypes = (x.dtype, weight.dtype)
        return torch._scaled_mm(xq, wq.t(), scale_a=x_inv, scale_b=w_inv, out_dtype=out_dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        xq, x_inv, wq, w_inv = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        gq, g_inv = quantize(grad.contiguous(), E5M2)  # row-major: _scaled_mm's first operand on CUDA
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = torch._scaled_mm(gq, _column_major(wq), scale_a=g_inv, scale_b=w_inv, out_dtype=x_dtype)
        if ctx.needs_input_grad[1]:  # not for a frozen weight (adapters)
            grad_w = torch._scaled_mm(gq.t().contiguous(), _column_major(xq), scale_a=g_inv, scale_b=x_inv,
                                      out_dtype=torch.float32).to(w_dtype)
        return grad_x, grad_w, None, None, None, None, None


def float8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with FP8 operands; the output in autocast's dtype when autocast is on
    (as ``F.linear`` gives it), else in ``x``'s."""
    out_dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
    rows = x.numel() // x.shape[-1]
    # padded (by 0 rows when they are a multiple already) without an `if`: under torch.compile with dynamic
    # shapes a branch on the row count would guard on it, and compile again when it changes
    flat = F.pad(x.reshape(rows, x.shape[-1]), (0, 0, 0, -rows % ROW_MULTIPLE))
    with torch.no_grad():
        (xq, x_inv), (wq, w_inv) = quantize(flat, E4M3), quantize(weight, E4M3)
    y = _Float8Matmul.apply(flat, weight, xq, x_inv, wq, w_inv, out_dtype)[:rows]
    if bias is not None:
        y = y + bias.to(out_dtype)
    return y.reshape(*x.shape[:-1], weight.shape[0])


class Float8Linear(torch.nn.Linear):
    """A ``torch.nn.Linear`` whose forward multiplies in FP8 (``use_float8`` swaps the class of existing
    modules: their parameters, names and hooks stay)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return float8_linear(x, self.weight, self.bias)


def check_fp8(device: torch.device) -> None:
    """A ``ConfigError`` where ``pretrain.speed.fp8`` cannot run (``fp8_refusal``)."""
    if reason := fp8_refusal(device):
        raise ConfigError(f"pretrain.speed.fp8: {reason}; set it to false")


def use_float8(bert) -> int:
    """Switch the linear layers of every layer of ``bert`` (a ``BertModel``) to FP8 (before adapters wrap
    the layers' outputs); returns how many."""
    switched = 0
    for layer in bert.encoder.layer:
        for path in LAYER_LINEARS:
            module = layer.get_submodule(path)
            if type(module) is torch.nn.Linear:
                module.__class__ = Float8Linear
                switched += 1
            elif not isinstance(module, Float8Linear):
                raise TypeError(f"{path} of a BERT layer is a {type(module).__name__}, not a torch.nn.Linear")
    return switched
