"""Per-tensor output decisions (GGUF name, shape, ggml type) and the
streaming producer of each tensor's bytes.

Type rules follow llama.cpp's converter (ModelBase.prepare_tensors):
1-D tensors, `*_norm.weight`, ssm_conv1d and anything not named `.weight`
stay F32; other tensors take the --outtype; a row length that the block
type cannot split falls back to F16. --outtype q4_0 (not an upstream
converter type) follows llama-quantize instead for the output head
(output.weight, or token_embd.weight when it doubles as the head): it
would pick Q6_K, which gguf-py cannot write, so it gets Q8_0, the type
llama-quantize itself falls back to for that tensor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT, LlamaFileType as FT
from gguf import quants

from .layouts import SourceTensor

# --outtype -> (general.file_type, ggml type of the 2-D weights)
OUTTYPES: dict[str, tuple[FT, QT]] = {
    "f32": (FT.ALL_F32, QT.F32),
    "f16": (FT.MOSTLY_F16, QT.F16),
    "bf16": (FT.MOSTLY_BF16, QT.BF16),
    "q8_0": (FT.MOSTLY_Q8_0, QT.Q8_0),
    "q4_0": (FT.MOSTLY_Q4_0, QT.Q4_0),
}

# row chunk for tensors streamed in pieces (bytes of F32 compute data)
CHUNK_BYTES = 64 << 20


def tensor_nbytes(shape: tuple[int, ...], qtype: QT) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return math.prod(shape[:-1]) * (shape[-1] // block) * size


def decide_type(gguf_name: str, shape: tuple[int, ...], outtype: str, *, head_is_token_embd: bool,
                ) -> tuple[QT, str | None]:
    """ggml type for one output tensor, plus a note when it is not the obvious one."""
    if len(shape) <= 1 or gguf_name.endswith("_norm.weight") or ".ssm_conv1d." in gguf_name \
            or not gguf_name.endswith(".weight"):
        return QT.F32, None
    qtype = OUTTYPES[outtype][1]
    note = None
    if outtype == "q4_0" and (gguf_name == "output.weight"
                              or (head_is_token_embd and gguf_name == "token_embd.weight")):
        qtype = QT.Q8_0
        note = f"{gguf_name}: Q8_0 (output head; llama-quantize would use Q6_K, which gguf-py cannot write)"
    block = GGML_QUANT_SIZES[qtype][0]
    if shape[-1] % block:
        note = f"{gguf_name}: row length {shape[-1]} is not a multiple of {block}, falling back to F16"
        qtype = QT.F16
    return qtype, note


@dataclass
class TensorPlan:
    gguf_name: str
    src: SourceTensor
    role: str
    shape: tuple[int, ...]  # output shape, numpy order (outermost first)
    qtype: QT
    transform: Callable[[str, np.ndarray], np.ndarray]  # (role, whole tensor) -> tensor

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.shape, self.qtype)

    @property
    def n_params(self) -> int:
        return math.prod(self.shape)

    def chunks(self) -> Iterator[np.ndarray]:
        """The tensor's GGUF bytes as contiguous arrays, a row range at a time
        where the transform allows (row-local roles), else whole."""
        rows = self.shape[0] if self.shape else 1
        row_f32 = 4 * math.prod(self.shape[1:])
        if self.role == "none" and len(self.shape) >= 2 and self.src.row_slicable \
                and rows * row_f32 > CHUNK_BYTES:
            step = max(1, CHUNK_BYTES // row_f32)
            for r0 in range(0, rows, step):
                a = self.src.load(rows=(r0, min(rows, r0 + step)))
                out = _encode(a, self.qtype)
                del a
                yield out
                del out
            return
        a = self.transform(self.role, self.src.load())
        if tuple(a.shape) != self.shape:
            raise AssertionError(f"{self.gguf_name}: transformed shape {a.shape} != planned {self.shape}")
        out = _encode(a, self.qtype)
        del a
        yield out


def _encode(a: np.ndarray, qtype: QT) -> np.ndarray:
    return np.ascontiguousarray(quants.quantize(a, qtype))
