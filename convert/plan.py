"""Per-tensor output decisions (GGUF name, shape, ggml type), the streaming
producer of each tensor's bytes, and the per-tensor report of what it cost.

Type rules follow llama.cpp's converter (ModelBase.prepare_tensors):
1-D tensors, `*_norm.weight`, ssm_conv1d, the MoE routers and anything not
named `.weight` stay F32; other tensors take the --outtype. `auto` keeps
each tensor's own precision: a float tensor its stored float type, a
quantized one its layout's lossless target (Native.auto_type). q4_0 / q4_k
follow llama-quantize for the output head (output.weight, or token_embd
when it doubles as the head): Q6_K. A row length the type cannot split
falls back as llama-quantize does (Q4_K -> Q5_0, Q6_K -> Q8_0), then F16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
from gguf import GGMLQuantizationType as QT, LlamaFileType as FT

from . import encode
from .errors import ConversionError
from .layouts import SourceTensor

# --outtype -> ggml type of the 2-D weights (None: per tensor)
OUTTYPES: dict[str, QT | None] = {
    "auto": None,
    "f32": QT.F32,
    "f16": QT.F16,
    "bf16": QT.BF16,
    "q8_0": QT.Q8_0,
    "q4_0": QT.Q4_0,
    "q4_k": QT.Q4_K,
    "q6_k": QT.Q6_K,
}
# general.file_type of a file whose weights are mostly of this type
FILE_TYPES: dict[int, FT] = {
    QT.F32: FT.ALL_F32, QT.F16: FT.MOSTLY_F16, QT.BF16: FT.MOSTLY_BF16, QT.Q8_0: FT.MOSTLY_Q8_0,
    QT.Q4_0: FT.MOSTLY_Q4_0, QT.Q4_K: FT.MOSTLY_Q4_K_S, QT.Q6_K: FT.MOSTLY_Q6_K, QT.Q5_0: FT.MOSTLY_Q5_0,
}
_FLOAT_AUTO = {"F32": QT.F32, "F16": QT.F16, "BF16": QT.BF16, "F64": QT.F32}
_HEAD_TYPE = {"q4_0": QT.Q6_K, "q4_k": QT.Q6_K}
_ROW_FALLBACK = {QT.Q4_K: QT.Q5_0, QT.Q6_K: QT.Q8_0}
_F32_SUFFIXES = ("_norm.weight", ".ffn_gate_inp.weight", ".ffn_gate_inp_shexp.weight")

# row chunk for tensors streamed in pieces (bytes of F32 compute data)
CHUNK_BYTES = 64 << 20


def decide_type(gguf_name: str, shape: tuple[int, ...], outtype: str, src: SourceTensor, *,
                head_is_token_embd: bool) -> tuple[int, str | None]:
    """ggml type for one output tensor, plus a note when it is not the obvious one."""
    if len(shape) <= 1 or gguf_name.endswith(_F32_SUFFIXES) or ".ssm_conv1d." in gguf_name \
            or not gguf_name.endswith(".weight"):
        return int(QT.F32), None
    note = None
    if outtype == "auto":
        if src.native is not None:
            qtype = src.native.auto_type()
        elif src.dtype in _FLOAT_AUTO:
            qtype = _FLOAT_AUTO[src.dtype]
        else:
            raise ConversionError(f"tensor {src.name!r}: no output type for stored dtype {src.dtype}")
    else:
        qtype = OUTTYPES[outtype]
        if outtype in _HEAD_TYPE and (gguf_name == "output.weight"
                                      or (head_is_token_embd and gguf_name == "token_embd.weight")):
            qtype = _HEAD_TYPE[outtype]
    wanted = qtype
    while shape[-1] % encode.block_size(qtype):
        qtype = _ROW_FALLBACK.get(qtype, QT.F16)
    if qtype != wanted:
        note = (f"{gguf_name}: row length {shape[-1]} is not a multiple of {encode.block_size(wanted)} "
                f"({encode.type_name(wanted)}), falling back to {encode.type_name(qtype)}")
    return int(qtype), note


def file_type(outtype: str, plans: list["TensorPlan"]) -> int:
    """general.file_type: the --outtype's, or for auto the type holding most weights."""
    if OUTTYPES[outtype] is not None:
        return int(FILE_TYPES[OUTTYPES[outtype]])
    count: dict[int, int] = {}
    for t in plans:
        if len(t.shape) >= 2 and t.qtype in FILE_TYPES:
            count[t.qtype] = count.get(t.qtype, 0) + t.n_params
    return int(FILE_TYPES[max(count, key=count.get)]) if count else int(FT.ALL_F32)


@dataclass
class Report:
    """How one tensor was mapped: its source, its ggml type, and the error of the
    written values against the (transformed) dequantized source."""

    gguf_name: str
    source: str
    qtype: int
    max_error: float = 0.0
    sum_sq: float = 0.0
    count: int = 0

    @property
    def rms_error(self) -> float:
        return math.sqrt(self.sum_sq / self.count) if self.count else 0.0

    @property
    def exact(self) -> bool:
        return self.max_error == 0.0

    def add(self, ref: np.ndarray, written: np.ndarray) -> None:
        # float32 differences of float32 values are 0 exactly when the values are equal
        diff = (written.astype(np.float32, copy=False) - ref.astype(np.float32, copy=False)).reshape(-1)
        np.abs(diff, out=diff)
        worst = float(diff.max(initial=0.0))
        self.max_error = max(self.max_error, worst)
        if worst > 0:
            self.sum_sq += float(np.einsum("i,i->", diff, diff, dtype=np.float64))
        self.count += diff.size

    def line(self) -> str:
        err = "exact" if self.exact else f"max err {self.max_error:.3g}, rms {self.rms_error:.3g}"
        return f"{self.gguf_name}: {self.source} -> {encode.type_name(self.qtype)}, {err}"


@dataclass
class TensorPlan:
    gguf_name: str
    src: SourceTensor
    role: str
    shape: tuple[int, ...]  # output shape, numpy order (outermost first)
    qtype: int
    transform: Callable[[str, np.ndarray], np.ndarray]  # (role, whole tensor) -> tensor
    row_local: bool  # transform(rows of src) == rows of transform(src)
    permutes: bool  # transform only rearranges values (so it applies to codes and scales alike)
    report: Report = field(init=False)

    def __post_init__(self):
        self.report = Report(self.gguf_name, self.src.describe(), self.qtype)

    @property
    def nbytes(self) -> int:
        return encode.tensor_nbytes(self.shape, self.qtype)

    @property
    def n_params(self) -> int:
        return math.prod(self.shape)

    def _row_ranges(self) -> Iterator[tuple[int, int] | None]:
        rows = self.shape[0] if self.shape else 1
        row_f32 = 4 * math.prod(self.shape[1:])
        if self.row_local and len(self.shape) >= 2 and self.src.row_slicable and rows * row_f32 > CHUNK_BYTES:
            step = max(1, CHUNK_BYTES // row_f32)
            yield from ((r0, min(rows, r0 + step)) for r0 in range(0, rows, step))
        else:
            yield None

    def chunks(self) -> Iterator[np.ndarray]:
        """The tensor's GGUF bytes as contiguous arrays, a row range at a time where
        the transform allows, else whole; each is measured against its source."""
        for rows in self._row_ranges():
            data = None
            if self.src.native is not None and self.permutes:
                data, ref = self.src.native.encode(self.qtype, rows, lambda a: self.transform(self.role, a))
            else:
                ref = self.transform(self.role, self.src.load(rows=rows))
            expect = self.shape if rows is None else (rows[1] - rows[0], *self.shape[1:])
            if tuple(ref.shape) != expect:
                raise AssertionError(f"{self.gguf_name}: transformed shape {ref.shape} != planned {expect}")
            if not np.isfinite(ref).all():
                raise ConversionError(f"tensor {self.src.name!r} in {self.src.files} holds NaN or infinite values")
            if data is None:
                data = encode.quantize(ref, self.qtype)
            data = np.ascontiguousarray(data)
            self.report.add(ref, encode.dequantize(data, self.qtype, ref.shape))
            del ref
            yield data
