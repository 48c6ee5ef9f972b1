"""Input layouts: how the stored tensors of a checkpoint become logical
float weights.

A layout is chosen from config.json's `quantization_config` (none: plain
float). It groups the stored tensors into `SourceTensor`s, one per logical HF
weight name, each with a loader that returns the weight as llama.cpp's
converter would compute with it (F32, or F16 for F16 checkpoints).

Only the float layout exists so far. A quantized layout (FP8 with block
scales, GPTQ/AWQ int4, compressed-tensors W4A8, ...) registers here: it
`matches` its quantization_config, folds e.g. `x.weight_packed` +
`x.weight_scale` into one `SourceTensor("x.weight")` whose loader
dequantizes, and may set `native` to hand an already-ggml-shaped encoding
to the per-tensor output decision instead of a float round trip.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

from .errors import ConversionError
from .safetensors_reader import FLOAT_DTYPES, TensorRef, read_float


@dataclass(frozen=True)
class SourceTensor:
    """One logical HF weight, as stored names map to it."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # logical dtype of the stored values ("F32", "BF16", ...)
    refs: tuple[TensorRef, ...]
    load: Callable[..., np.ndarray] = field(repr=False)  # load(rows=None)
    row_slicable: bool = True  # load(rows=(r0, r1)) gives those rows only
    native: Any = None  # reserved: pre-encoded ggml data from a quantized layout

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.refs)

    @property
    def files(self) -> str:
        return ", ".join(sorted({r.file.name for r in self.refs}))


class InputLayout(Protocol):
    name: str

    def matches(self, quant_config: dict[str, Any] | None) -> bool: ...

    def logical_tensors(self, stored: dict[str, TensorRef]) -> dict[str, SourceTensor]: ...


class FloatLayout:
    """Unquantized checkpoints: every stored F32/F16/BF16/F64 tensor is a weight."""

    name = "float"

    def matches(self, quant_config: dict[str, Any] | None) -> bool:
        return quant_config is None

    def logical_tensors(self, stored: dict[str, TensorRef]) -> dict[str, SourceTensor]:
        out: dict[str, SourceTensor] = {}
        for name, ref in stored.items():
            if ref.dtype not in FLOAT_DTYPES:
                raise ConversionError(
                    f"tensor {name!r} in {ref.file.name} has dtype {ref.dtype}; a float checkpoint needs "
                    f"{'/'.join(FLOAT_DTYPES)} (quantized checkpoints need a supported quantization_config)")
            out[name] = SourceTensor(name, ref.shape, ref.dtype, (ref,),
                                     load=lambda rows=None, ref=ref: read_float(ref, rows))
        return out


INPUT_LAYOUTS: list[InputLayout] = [FloatLayout()]


def quantization_config(config: dict[str, Any]) -> dict[str, Any] | None:
    q = config.get("quantization_config")
    if q is None and isinstance(config.get("text_config"), dict):
        q = config["text_config"].get("quantization_config")
    if q is not None and not isinstance(q, dict):
        raise ConversionError(f"quantization_config must be an object, got {type(q).__name__}")
    return q or None


def select_layout(config: dict[str, Any], has_hf_quant_config: bool = False) -> InputLayout:
    q = quantization_config(config)
    if q is None and has_hf_quant_config:
        raise ConversionError("unsupported quantization: hf_quant_config.json (ModelOpt) checkpoints are not supported")
    for layout in INPUT_LAYOUTS:
        if layout.matches(q):
            return layout
    assert q is not None
    desc = ", ".join(f"{k}={q[k]!r}" for k in ("quant_method", "format", "bits", "quant_algo") if k in q) or repr(q)
    raise ConversionError(f"unsupported quantization_config ({desc}); only float (F32/F16/BF16) "
                          "checkpoints are supported so far")
