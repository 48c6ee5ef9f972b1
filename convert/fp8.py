"""FP8 checkpoints (Qwen's official -FP8 releases, DeepSeek-V3 style):
`quant_method: "fp8"`, weights F8_E4M3 with `weight_scale_inv` per
`weight_block_size` block (128x128), multiplied despite the name:
W = fp8(w) * scale_inv[n // 128, k // 128].

No ggml type holds FP8 values with a per-block scale exactly, so `auto`
writes Q8_0 (like llama.cpp's --fp8-as-q8) and reports the error; the FP8
decoding is shared with compressed-tensors' float-quantized format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from gguf import GGMLQuantizationType as QT

from .errors import ConversionError
from .intquant import expand_scale
from .layouts import SourceTensor, float_source, native_source
from .safetensors_reader import TensorRef, read_float, read_raw


def _e4m3fn_table() -> np.ndarray:
    """float32 value of each F8_E4M3 (fn: no infinities, 0x7F/0xFF are NaN) byte."""
    b = np.arange(256)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = b & 0x7
    val = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    val = np.where((b & 0x7F) == 0x7F, np.nan, val)
    return (sign * val).astype(np.float32)


E4M3FN = _e4m3fn_table()


@dataclass(frozen=True)
class FP8Weight:
    """SourceTensor.native of an FP8 weight (see layouts.Native)."""

    scheme: str
    weight: TensorRef
    scale: Callable[[], np.ndarray]  # the whole stored scale, float32

    def auto_type(self) -> int:
        return int(QT.Q8_0)

    def describe(self) -> str:
        return f"fp8 e4m3 ({self.scheme})"

    def dequantize(self, rows=None) -> np.ndarray:
        w = E4M3FN[read_raw(self.weight, rows)]
        if np.isnan(w).any():
            raise ConversionError(f"FP8 tensor {self.weight.name!r} in {self.weight.file.name} holds NaN codes")
        return w * expand_scale(self.scale(), self.weight.shape, rows)

    def encode(self, qtype, rows, permute):
        return None, permute(self.dequantize(rows))


def fp8_source(name: str, weight: TensorRef, scale: TensorRef, scheme: str) -> SourceTensor:
    if weight.dtype != "F8_E4M3":
        raise ConversionError(f"tensor {weight.name!r} in {weight.file.name} has dtype {weight.dtype}; "
                              "FP8 weights must be F8_E4M3")
    if len(weight.shape) < 2 or len(scale.shape) > len(weight.shape) \
            or any(s > w for s, w in zip(scale.shape[::-1], weight.shape[::-1])):
        raise ConversionError(f"tensor {scale.name!r} has shape {list(scale.shape)}, not a block scale of "
                              f"{weight.name!r} {list(weight.shape)}")
    native = FP8Weight(scheme, weight, lambda: read_float(scale).astype(np.float32))
    return native_source(name, weight.shape, (weight, scale), native)


class FP8Layout:
    name = "fp8 (block-scaled F8_E4M3)"

    def matches(self, q: dict[str, Any] | None, stored: dict[str, TensorRef]) -> bool:
        return bool(q) and q.get("quant_method") == "fp8"

    def logical_tensors(self, stored: dict[str, TensorRef], q: dict[str, Any]) -> dict[str, SourceTensor]:
        fmt = q.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise ConversionError(f"quantization_config.fmt={fmt!r}: only e4m3 FP8 is supported")
        block = q.get("weight_block_size")
        scheme = f"block {block[0]}x{block[1]}" if isinstance(block, list) and len(block) == 2 else "per-tensor"
        out: dict[str, SourceTensor] = {}
        for name, ref in stored.items():
            if name.endswith(("_scale_inv", ".activation_scale", ".input_scale")):
                continue
            scale = stored.get(name + "_scale_inv")
            if scale is not None:
                out[name] = fp8_source(name, ref, scale, scheme)
            elif ref.dtype.startswith("F8_"):
                raise ConversionError(f"FP8 tensor {name!r} in {ref.file.name} has no {name}_scale_inv")
            else:
                out[name] = float_source(name, ref, "an unquantized tensor of an FP8 checkpoint")
        return out
