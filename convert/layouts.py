"""Input layouts: how the stored tensors of a checkpoint become logical weights.

A layout is chosen from config.json's `quantization_config` (none: plain
float). It groups the stored tensors into `SourceTensor`s, one per logical HF
weight name (e.g. `x.qweight` + `x.qzeros` + `x.scales` + `x.g_idx` ->
`SourceTensor("x.weight")`), each with

- `load(rows=None)`: the weight as float (F32, or F16 for F16 checkpoints),
  dequantized the way llama.cpp's converter computes it: the "source" that
  every output is measured against;
- `native` (quantized layouts): a `Native`, the layout's own encoding.

Adding a layout (one module per format, registered in input_layouts(), before
the float layout): `matches(quant_config, stored)` claims a checkpoint by its
quantization_config or by its stored tensors (names, dtypes: e.g. per-layer
format markers), `logical_tensors(stored, quant_config)` returns the SourceTensors (raising ConversionError that names the
tensor or key for anything it cannot read). Tensors the layout does not
quantize (ignore lists, norms) stay float via `float_source`.

The `Native` protocol (what the writer asks of a quantized source):

- `auto_type()`: the ggml type `--outtype auto` writes: the lossless one
  where one exists (a pyqwen-only type is fine: register its block size in
  encode.TYPE_SIZES);
- `describe()`: a short text for the per-tensor report ("int4 sym g128 ...");
- `encode(qtype, rows, permute)` -> `(data, ref)`: `ref` is the float weight
  of those rows (what `load(rows)` returns) after `permute`, the
  architecture's value-free rearrangement (row/column permutations and
  selections, applied alike to codes and scales of the same shape); `data`
  is its GGUF bytes in `qtype` when the native form can produce that type
  (exactly, or block by block falling back to quantizing `ref`), else None
  and the writer quantizes `ref` with ggml;
- optionally `extensions(gguf_name, qtype)` -> `(features, keys)` for an
  output only pyqwen can run (ComfyUI's weights kept in the Hadamard basis,
  comfy.py): the pyqwen features it needs (GGUF `pyqwen.requires`) and the
  GGUF keys `(key, GGUFValueType, value)` that describe it.

The writer dequantizes whatever it wrote and reports, per tensor, the
max/RMS error against `ref` (0 = bit-exact), on stderr and in the GGUF
metadata (core.REPORT_KEYS).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol

import numpy as np

from .errors import ConversionError
from .safetensors_reader import FLOAT_DTYPES, TensorRef, read_float

Rows = tuple[int, int] | None
Permute = Callable[[np.ndarray], np.ndarray]


class Native(Protocol):
    def auto_type(self) -> int: ...

    def describe(self) -> str: ...

    def encode(self, qtype: int, rows: Rows, permute: Permute) -> tuple[np.ndarray | None, np.ndarray]: ...


@dataclass(frozen=True)
class SourceTensor:
    """One logical HF weight, as stored names map to it."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # stored dtype of the values ("F32", "BF16", ...; the packed dtype for quantized ones)
    refs: tuple[TensorRef, ...]
    load: Callable[..., np.ndarray] = field(repr=False)  # load(rows=None)
    row_slicable: bool = True  # load(rows=(r0, r1)) gives those rows only
    native: Native | None = None

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.refs)

    @property
    def files(self) -> str:
        return ", ".join(sorted({r.file.name for r in self.refs}))

    def describe(self) -> str:
        return self.native.describe() if self.native is not None else self.dtype


def float_source(name: str, ref: TensorRef, what: str = "a float checkpoint") -> SourceTensor:
    if ref.dtype not in FLOAT_DTYPES:
        raise ConversionError(
            f"tensor {name!r} in {ref.file.name} has dtype {ref.dtype}; {what} needs "
            f"{'/'.join(FLOAT_DTYPES)} here (quantized checkpoints need a supported quantization_config)")
    return SourceTensor(name, ref.shape, ref.dtype, (ref,), load=lambda rows=None, ref=ref: read_float(ref, rows))


def native_source(name: str, shape: tuple[int, ...], refs: tuple[TensorRef, ...], native, *,
                  row_slicable: bool = True) -> SourceTensor:
    """A quantized weight whose float form is native.dequantize(rows)."""
    return SourceTensor(name, shape, refs[0].dtype, refs, load=native.dequantize, row_slicable=row_slicable,
                        native=native)


# --- virtual sources (the architecture's regrouping of stored weights) -----------------

@dataclass(frozen=True)
class _Stacked:
    """Native of stacked quantized parts; rows of the stack are whole parts, and `permute`
    acts on each part (the architecture stacks only weights it does not rearrange)."""

    parts: tuple[SourceTensor, ...]

    def auto_type(self) -> int:
        return self.parts[0].native.auto_type()

    def describe(self) -> str:
        return f"{self.parts[0].describe()} x{len(self.parts)}"

    def encode(self, qtype, rows, permute):
        r0, r1 = rows or (0, len(self.parts))
        out = [p.native.encode(qtype, None, permute) for p in self.parts[r0:r1]]
        refs = np.stack([ref for _, ref in out])
        if any(d is None for d, _ in out):
            return None, refs
        return np.stack([d for d, _ in out]), refs


def stack_sources(name: str, parts: list[SourceTensor]) -> SourceTensor:
    """[n, *part.shape] from equally shaped parts (per-expert weights -> one 3-D tensor);
    rows of the result are whole parts."""
    shapes = {p.shape for p in parts}
    if len(shapes) != 1:
        raise ConversionError(f"cannot stack {parts[0].name} ... {parts[-1].name}: shapes differ "
                              f"({', '.join(str(list(s)) for s in sorted(shapes))})")

    def load(rows=None):
        r0, r1 = rows or (0, len(parts))
        return np.stack([p.load() for p in parts[r0:r1]])

    formats = {p.describe() for p in parts}
    if len(formats) != 1:
        raise ConversionError(f"cannot stack {parts[0].name} ... {parts[-1].name}: they are stored in different "
                              f"formats ({', '.join(sorted(formats))})")
    native = _Stacked(tuple(parts)) if parts[0].native is not None else None
    return SourceTensor(name, (len(parts), *parts[0].shape), parts[0].dtype,
                        tuple(r for p in parts for r in p.refs), load=load, native=native)


@dataclass(frozen=True)
class _Selected:
    base: Native
    select: Permute

    def auto_type(self) -> int:
        return self.base.auto_type()

    def describe(self) -> str:
        return self.base.describe()

    def encode(self, qtype, rows, permute):
        return self.base.encode(qtype, rows, lambda a: permute(self.select(a)))


def select_source(src: SourceTensor, name: str, shape: tuple[int, ...], select: Permute, *,
                  row_local: bool) -> SourceTensor:
    """A rearranged part of `src` (`select` is value-free: slicing, gathering);
    `row_local`: selecting rows (r0, r1) of src and then `select` gives rows (r0, r1)
    of the result (true when `select` leaves axis 0 alone)."""
    native = _Selected(src.native, select) if src.native is not None else None
    return replace(src, name=name, shape=shape, load=lambda rows=None: select(src.load(rows)),
                   row_slicable=row_local and src.row_slicable, native=native)


# --- registry ------------------------------------------------------------------------

class InputLayout(Protocol):
    name: str

    def matches(self, quant_config: dict[str, Any] | None, stored: dict[str, TensorRef]) -> bool: ...

    def logical_tensors(self, stored: dict[str, TensorRef], quant_config: dict[str, Any] | None,
                        ) -> dict[str, SourceTensor]: ...


class FloatLayout:
    """Unquantized checkpoints: every stored F32/F16/BF16/F64 tensor is a weight."""

    name = "float"

    def matches(self, quant_config: dict[str, Any] | None, stored: dict[str, TensorRef]) -> bool:
        return quant_config is None

    def logical_tensors(self, stored: dict[str, TensorRef], quant_config=None) -> dict[str, SourceTensor]:
        return {name: float_source(name, ref) for name, ref in stored.items()}


def input_layouts() -> list[InputLayout]:
    from .awq import AWQLayout
    from .comfy import ComfyLayout
    from .compressed_tensors import CompressedTensorsLayout
    from .fp8 import FP8Layout
    from .gptq import GPTQLayout

    return [CompressedTensorsLayout(), GPTQLayout(), AWQLayout(), FP8Layout(), ComfyLayout(), FloatLayout()]


def quantization_config(config: dict[str, Any]) -> dict[str, Any] | None:
    q = config.get("quantization_config")
    if q is None and isinstance(config.get("text_config"), dict):
        q = config["text_config"].get("quantization_config")
    if q is not None and not isinstance(q, dict):
        raise ConversionError(f"quantization_config must be an object, got {type(q).__name__}")
    return q or None


def select_layout(config: dict[str, Any], stored: dict[str, TensorRef],
                  has_hf_quant_config: bool = False) -> InputLayout:
    q = quantization_config(config)
    if q is None and has_hf_quant_config:
        raise ConversionError("unsupported quantization: hf_quant_config.json (ModelOpt) checkpoints are not supported")
    layouts = input_layouts()
    for layout in layouts:
        if layout.matches(q, stored):
            return layout
    assert q is not None
    desc = ", ".join(f"{k}={q[k]!r}" for k in ("quant_method", "format", "bits", "version", "quant_algo") if k in q)
    raise ConversionError(f"unsupported quantization_config ({desc or q!r}); supported: "
                          + ", ".join(lay.name for lay in layouts))
