"""Integer-quantized weights (compressed-tensors, GPTQ, AWQ): bit unpacking and
the `IntWeight` native encoding they all decode to.

Every integer layout stores W[n, k] = (u[n, k] - zero[n, g(k)]) * scale[n, g(k)]
with b-bit codes u, one scale (and zero point) per group g(k) = k // G, or
g_idx[k] with act-order. A layout only has to produce, for a row range,
q = u - zero (int16) and the scale expanded to every element (float32);
`IntWeight` turns that into the float weight and into exact Q4_0 / Q8_0
blocks (encode.int_blocks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType as QT

from .encode import EXACT_CODE_RANGE, int_blocks


def unpack_dense(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Codes packed LSB-first as one bit stream per row (a code may straddle two
    32-bit words): [..., W] int32 -> [..., count] uint8."""
    if 32 % bits == 0:  # no code straddles a word: the same layout as whole codes per word
        return unpack_per_word(words, bits, count)
    w = np.ascontiguousarray(words).view(np.uint32)
    n_words = -(-count * bits // 32)
    if w.shape[-1] < n_words:
        raise ValueError(f"{w.shape[-1]} words hold fewer than {count} {bits}-bit codes")
    # 32 codes fill exactly `bits` words: decode whole groups, from a 64-bit window
    groups = -(-count // 32)
    pad = groups * bits - w.shape[-1]
    if pad > 0:
        w = np.concatenate([w, np.zeros((*w.shape[:-1], pad), np.uint32)], axis=-1)
    w = w[..., : groups * bits].reshape(*w.shape[:-1], groups, bits).astype(np.uint64)
    w = np.concatenate([w, np.zeros((*w.shape[:-1], 1), np.uint64)], axis=-1)
    start = np.arange(32) * bits
    word, shift = start // 32, (start % 32).astype(np.uint64)
    window = w[..., word] | (w[..., word + 1] << np.uint64(32))
    codes = (window >> shift) & np.uint64((1 << bits) - 1)
    return codes.astype(np.uint8).reshape(*w.shape[:-2], groups * 32)[..., :count]


def unpack_per_word(words: np.ndarray, bits: int, count: int, order: tuple[int, ...] | None = None) -> np.ndarray:
    """Codes packed 32 // bits to a 32-bit word, LSB-first, the rest of the word
    unused: [..., W] int32 -> [..., count] uint8. `order[p]` is the position,
    within its word's run of codes, of the code in bit field p (AWQ's shuffle)."""
    per = 32 // bits
    w = np.ascontiguousarray(words).view(np.uint32)
    fields = (w[..., None] >> (np.arange(per, dtype=np.uint32) * bits)) & np.uint32((1 << bits) - 1)
    if order is not None:
        fields = fields[..., np.argsort(order)]
    codes = fields.astype(np.uint8).reshape(*w.shape[:-1], w.shape[-1] * per)
    if codes.shape[-1] < count:
        raise ValueError(f"{w.shape[-1]} words hold fewer than {count} {bits}-bit codes")
    return codes[..., :count]


def code_range(bits: int, symmetric: bool) -> tuple[int, int]:
    """Range of q = u - zero: [-2^(b-1), 2^(b-1) - 1] symmetric, else +-(2^b - 1)."""
    if symmetric:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return -((1 << bits) - 1), (1 << bits) - 1


@dataclass(frozen=True)
class IntWeight:
    """SourceTensor.native of an integer-quantized weight (see layouts.Native)."""

    bits: int
    symmetric: bool
    group_size: int  # along K; K itself for per-channel scales
    act_order: bool  # g_idx is not k // group_size
    scheme: str  # where it came from, for the report
    codes: Callable[..., tuple[np.ndarray, np.ndarray]]  # codes(rows) -> (q int16, scale float32), both [.., K]

    def auto_type(self) -> int:
        """Q4_0 when every code fits a Q4_0 block and a block never spans two
        groups, Q8_0 otherwise (exact for <= 8-bit codes on 32-aligned groups;
        act-order has no exact target and is requantized)."""
        lo, hi = code_range(self.bits, self.symmetric)
        q4_lo, q4_hi = EXACT_CODE_RANGE[int(QT.Q4_0)]
        if not self.act_order and self.group_size % 32 == 0 and q4_lo <= lo and hi <= q4_hi:
            return int(QT.Q4_0)
        return int(QT.Q8_0)

    def describe(self) -> str:
        kind = "sym" if self.symmetric else "asym"
        return f"int{self.bits} {kind} g{self.group_size}{' act-order' if self.act_order else ''} ({self.scheme})"

    def dequantize(self, rows=None) -> np.ndarray:
        q, s = self.codes(rows)
        return q * s

    def encode(self, qtype: int, rows, permute):
        q, s = self.codes(rows)
        q, s = permute(q), permute(s)
        ref = q * s
        return (int_blocks(q, s, ref, qtype) if int(qtype) in EXACT_CODE_RANGE else None), ref


def expand_scale(scale: np.ndarray, shape: tuple[int, ...], rows=None, g_idx: np.ndarray | None = None) -> np.ndarray:
    """A per-group scale (or zero point) stretched to every element of rows
    `rows` of a weight of `shape` [.., N, K]. Its own shape [.., N / bn, K / G]
    gives the row block bn and the column group G (scalar: per-tensor, 1-D: per
    row); `g_idx` [K] replaces column k's group k // G (act-order)."""
    s = np.asarray(scale)
    if s.size == 1:
        s = s.reshape((1,) * len(shape))
    elif s.ndim == 1:
        s = s[:, None]
    n, k = shape[-2:]
    bn = -(-n // s.shape[-2])
    out_rows = n
    if rows is not None and len(shape) == 2:
        s = s[np.arange(rows[0], rows[1]) // bn if s.shape[0] > 1 else [0] * (rows[1] - rows[0])]
        out_rows = rows[1] - rows[0]
    else:
        if rows is not None and s.shape[0] > 1:
            s = s[rows[0]:rows[1]]
        s = s[..., np.arange(n) // bn if s.shape[-2] > 1 else np.zeros(n, int), :]
    if g_idx is not None:
        s = s[..., g_idx]
    elif s.shape[-1] > 1:
        s = np.repeat(s, -(-k // s.shape[-1]), axis=-1)[..., :k]
    lead = shape[:-2] if rows is None or len(shape) == 2 else (rows[1] - rows[0], *shape[1:-2])
    return np.broadcast_to(s, (*lead, out_rows, k))
