"""ggml encodings: float -> GGUF bytes, GGUF bytes -> float, and the exact
Q4_0 / Q8_0 blocks of integer-quantized weights.

F32/F16/BF16 are converted by gguf-py (as llama.cpp's converter does); block types go through ggml's own quantizer and dequantizer in
pyqwen's native module (pq_quantize / pq_dequantize), so a K-quant written
here is the one llama-quantize would write (without an importance matrix).

`TYPE_SIZES` maps every ggml type the converter can write to (block size,
bytes per block); a pyqwen-only type registers itself there, and its bytes
are decoded for the error report by its ggml type traits (pq_dequantize).
"""

from __future__ import annotations

import math

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT
from gguf import GGUFReader, quants

from .errors import ConversionError

TYPE_SIZES: dict[int, tuple[int, int]] = {int(t): s for t, s in GGML_QUANT_SIZES.items()}
TYPE_NAMES: dict[int, str] = {}  # pyqwen-only types (gguf-py does not know them)
FLOAT_TYPES = (int(QT.F32), int(QT.F16), int(QT.BF16))


class FieldsReader(GGUFReader):
    """A GGUFReader of the key-value fields only: gguf-py cannot describe pyqwen-only types."""

    def _build_tensors(self, start_offs, fields):
        self.tensors = []


def type_name(qtype: int) -> str:
    if qtype in TYPE_NAMES:
        return TYPE_NAMES[qtype]
    try:
        return QT(qtype).name
    except ValueError:
        return f"type{qtype}"


def block_size(qtype: int) -> int:
    return TYPE_SIZES[int(qtype)][0]


def tensor_nbytes(shape: tuple[int, ...], qtype: int) -> int:
    block, size = TYPE_SIZES[int(qtype)]
    return math.prod(shape[:-1]) * (shape[-1] // block) * size


def _native():
    try:
        from pyqwen._cffi import ffi, lib
    except ImportError as e:
        raise ConversionError(f"block quantization needs pyqwen's native module ({e}); reinstall pyqwen") from None
    return ffi, lib


def _native_error(what: str) -> ConversionError:
    ffi, lib = _native()
    return ConversionError(f"{what}: {ffi.string(lib.pq_last_error()).decode('utf-8', 'replace')}")


def quantize(a: np.ndarray, qtype: int) -> np.ndarray:
    """Float tensor -> its GGUF data in `qtype` (F32/F16/BF16 keep the element
    shape; block types give uint8 rows)."""
    if qtype in FLOAT_TYPES:
        return np.ascontiguousarray(quants.quantize(a, QT(qtype)))
    a = np.ascontiguousarray(a, dtype=np.float32)
    ffi, lib = _native()
    per_row = a.shape[-1]
    rows = a.size // per_row
    row_size = lib.pq_type_row_size(int(qtype), per_row)
    if row_size < 0:
        raise _native_error(f"cannot quantize to {type_name(qtype)}")
    out = np.empty((*a.shape[:-1], row_size), dtype=np.uint8)
    if lib.pq_quantize(int(qtype), ffi.from_buffer("float[]", a), ffi.from_buffer(out), rows, per_row) != out.nbytes:
        raise _native_error(f"cannot quantize to {type_name(qtype)}")
    return out


def dequantize(data: np.ndarray, qtype: int, shape: tuple[int, ...]) -> np.ndarray:
    """GGUF data in `qtype` -> float32 values of `shape`."""
    if qtype in FLOAT_TYPES:
        return quants.dequantize(data, QT(qtype)).reshape(shape)
    ffi, lib = _native()
    out = np.empty(shape, dtype=np.float32)
    src = np.ascontiguousarray(data)
    if lib.pq_dequantize(int(qtype), ffi.from_buffer(src), ffi.from_buffer("float[]", out), out.size) != 0:
        raise _native_error(f"cannot decode {type_name(qtype)}")
    return out


# --- exact blocks of integer weights ------------------------------------------------

# type -> inclusive range of the integer codes one block can hold with d = the group scale
EXACT_CODE_RANGE: dict[int, tuple[int, int]] = {int(QT.Q4_0): (-8, 7), int(QT.Q8_0): (-128, 127)}


def int_blocks(q: np.ndarray, scale: np.ndarray, ref: np.ndarray, qtype: int) -> np.ndarray:
    """Q4_0 or Q8_0 data for W = q * scale (elementwise; `ref` is W in float32).

    A 32-value block is stored exactly (d = its scale, codes = q) when its
    scale is one fp16-exact value and its codes fit the type; every other
    block is quantized from `ref` by ggml, as a float tensor would be."""
    lo, hi = EXACT_CODE_RANGE[int(qtype)]
    per_row = q.shape[-1]
    qb = q.reshape(-1, per_row // 32, 32)
    sb = scale.reshape(qb.shape)
    d = sb[..., 0]
    d16 = d.astype(np.float16)
    exact = ((sb == d[..., None]).all(axis=-1) & (d16.astype(np.float32) == d)
             & (qb >= lo).all(axis=-1) & (qb <= hi).all(axis=-1))
    bsize = TYPE_SIZES[int(qtype)][1]
    out = np.empty((*qb.shape[:2], bsize), dtype=np.uint8)
    out[..., :2] = d16.view(np.uint8).reshape(*qb.shape[:2], 2)
    if qtype == QT.Q8_0:
        out[..., 2:] = qb.astype(np.int8).view(np.uint8)
    else:  # Q4_0: byte j holds value j (low nibble) and value j + 16 (high nibble), offset by 8
        u = (qb + 8).astype(np.uint8) & 0x0F
        out[..., 2:] = u[..., :16] | (u[..., 16:] << 4)
    if not exact.all():
        fallback = quantize(ref, qtype).reshape(out.shape)
        out = np.where(exact[..., None], out, fallback)
    return out.reshape(*q.shape[:-1], (per_row // 32) * bsize)
