"""ComfyUI `comfy_quant` checkpoints (comfy-kitchen's layouts) as an input layout.

Markers: each quantized layer L has `L.comfy_quant`, a uint8 tensor holding the UTF-8 JSON
`{"format": ...}`; older files list the layers in the safetensors header instead
(`__metadata__["_quantization_metadata"]` = `{"format_version", "layers": {L: {"format", ...}}}`).
There is no quantization_config: the layout claims a checkpoint by its markers.

Formats, W[N, K] (N outputs, K inputs):
- `asym_w4a8_int8`: `L.weight` int8 [N, K/2] holds 4-bit codes (column 2j in the low nibble of
  byte j, 2j+1 in the high one); `L.weight_s_rel` [N, K/G] e4m3fn (or its bytes as uint8, or
  f32); `L.weight_s_channel` f32 [N]; `L.weight_codebook` f32 [16] (else the code means code - 8);
  `L.weight_correction` [K/G, N] for the asymmetric variant. Decoding is done in float32 as
  comfy-kitchen does: L = clamp(round(v * s_rel), -127, 127), W_rot = L * s_channel
  (+ correction), and W = W_rot · H per `convrot_groupsize` columns (H: `hadamard`).
- `int8_tensorwise`: `L.weight` int8 [N, K] times `L.weight_scale` (scalar or per row);
  `convrot: true` means the weight is stored rotated (W·H).
- `float8_e4m3fn`: `L.weight` F8_E4M3 [N, K] times the scalar `L.weight_scale` (fp8.py's weight).

Outputs (`auto_type` / `encode`, see layouts.Native):
- W4A8, `auto`: GGML_TYPE_PQ_W4A8, the stored codes, scales and codebook (a pyqwen-only type;
  needs G a multiple of 16 and fp8 scales), else the Q8_0 below.
- W4A8, `auto` or `q8_0`: Q8_0 of W_rot with qs = L and d = fp16(s_channel): exact but for the
  fp16 rounding of each row's scale (the report measures it).
- int8_tensorwise, `auto` or `q8_0`: Q8_0 with qs = the stored int8 and d = fp16(scale).
- any other type (and the asymmetric W4A8, whose correction no ggml type holds): the
  dequantized W, requantized; `auto` writes F16 for those.
Rotated outputs are marked `pyqwen.hadamard.<tensor>` = the rotation length (`extensions`) and
pyqwen rotates the activations of those weights (GGML_OP_PYQWEN_HADAMARD); their report compares
against W_rot, the weight in the rotated basis. They keep the checkpoint's column order, because a
column permutation does not commute with H: llama.cpp's V-head reordering of ssm_out's columns is
left out and pyqwen regroups that weight's input instead. The token embedding (a row lookup) is
never written rotated. Files with rotated or pq_w4a8 tensors need pyqwen: they list the features
in `pyqwen.requires` and carry the tensor core.RequiresMarker, which upstream llama.cpp refuses.

ComfyUI's own tensor names (`model.lm_head.weight` for the head) are mapped to Hugging Face's;
`model.language_model.*`, `mtp.*` and the vision tower are the architecture's names.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

from . import encode
from .encode import int_blocks
from .errors import ConversionError
from .fp8 import E4M3FN, fp8_source
from .layouts import Permute, Rows, SourceTensor, float_source, native_source
from .safetensors_reader import FLOAT_DTYPES, TensorRef, read_float, read_metadata, read_raw

PQ_W4A8 = 100  # GGML_TYPE_PQ_W4A8 (ggml-patches/0003, include/ggml-pyqwen.h)
PQ_W4A8_BLOCK = np.dtype([("d", "<f4"), ("cb", "<u4"), ("sr", "u1", (16,)), ("qs", "u1", (128,))])
encode.TYPE_SIZES[PQ_W4A8] = (256, PQ_W4A8_BLOCK.itemsize)
encode.TYPE_NAMES[PQ_W4A8] = "PQ_W4A8"

MARKER = "comfy_quant"
HEADER_KEY = "_quantization_metadata"

# stored parts of a quantized layer, after "L.": (required, optional)
_PARTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "asym_w4a8_int8": (("weight", "weight_s_rel", "weight_s_channel"),
                       ("weight_codebook", "weight_correction", "input_scale")),
    "int8_tensorwise": (("weight", "weight_scale"), ("input_scale",)),
    "float8_e4m3fn": (("weight", "weight_scale"), ("input_scale",)),
}
_PART_NAMES = {p for req, opt in _PARTS.values() for p in req + opt if p != "weight"}


def is_comfy_checkpoint(stored: dict[str, TensorRef]) -> bool:
    if any(n.endswith("." + MARKER) for n in stored):
        return True
    return any(HEADER_KEY in read_metadata(f) for f in {r.file for r in stored.values()})


@cache
def hadamard(n: int) -> np.ndarray:
    """ComfyUI's ConvRot matrix: the Kronecker power of the regular H4, over sqrt(n)."""
    h4 = np.array([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=np.float64)
    h = h4
    while h.shape[0] < n:
        h = np.kron(h, h4)
    return h / math.sqrt(n)


def rotate(w: np.ndarray, n: int) -> np.ndarray:
    """w · H on each run of n columns, as float32 (computed in float64; H is its own inverse)."""
    r, k = w.shape
    return (w.astype(np.float64).reshape(r, k // n, n) @ hadamard(n)).reshape(r, k).astype(np.float32)


def _rotation_length(name: str, cfg: dict[str, Any], k: int) -> int:
    n = cfg.get("convrot_groupsize", 256)
    if not (isinstance(n, int) and n >= 4 and n & (n - 1) == 0 and n & 0x55555555):
        raise ConversionError(f"ComfyUI layer {name!r}: convrot_groupsize {n!r} is not a power of 4")
    if k % n:
        raise ConversionError(f"ComfyUI layer {name!r}: {k} input columns are not a multiple of convrot_groupsize {n}")
    return n


def _floats(ref: TensorRef) -> np.ndarray:
    if ref.dtype not in FLOAT_DTYPES:
        raise ConversionError(f"tensor {ref.name!r} in {ref.file.name} has dtype {ref.dtype}, expected a float type")
    a = read_float(ref).astype(np.float32)
    if not np.isfinite(a).all():
        raise ConversionError(f"tensor {ref.name!r} in {ref.file.name} holds NaN or infinite values")
    return a


def _q8_0(q: np.ndarray, d: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Q8_0 keeping the integer values q and one scale per row rounded to fp16 (never
    requantized: the report measures the scale rounding against ref)."""
    d16 = d.astype(np.float16).astype(np.float32)
    return int_blocks(q, np.broadcast_to(d16[:, None], q.shape), ref, QT.Q8_0)


class _Rotated:
    """A stored weight W·H (H per `rot` columns; rot 0: not rotated) that keeps its rotation in
    `rotated_types`, where the written rows are W·H's and the report compares against them."""

    name: str
    rot: int
    rotated_types: tuple[int, ...] = ()

    def stored(self, rows: Rows) -> np.ndarray:  # the weight as stored (W·H when rotated), float32
        raise NotImplementedError

    def dequantize(self, rows: Rows = None) -> np.ndarray:
        w = self.stored(rows)
        return rotate(w, self.rot) if self.rot else w

    def keeps_rotation(self, qtype: int) -> bool:
        return bool(self.rot) and int(qtype) in self.rotated_types

    def row_order(self, permute: Permute, n: int) -> np.ndarray:
        """Where the architecture's rearrangement takes each of n rows, found by applying it to
        the row numbers; one that reorders columns instead (it fails on a single column) must then
        work on a single row, i.e. leave the rows in place."""
        try:
            return permute(np.arange(n, dtype=np.float32)[:, None])[:, 0].astype(np.intp)
        except ValueError:
            try:
                permute(np.zeros((1, self.k), np.float32))
            except ValueError:
                raise ConversionError(f"{self.name}: the architecture rearranges both rows and columns of this "
                                      "weight, which cannot stay in the Hadamard basis") from None
            return np.arange(n)

    def extensions(self, gguf_name: str, qtype: int) -> tuple[tuple[str, ...], list[tuple[str, Any, Any]]]:
        """The pyqwen features (pyqwen.requires) and GGUF keys the written tensor needs."""
        if not self.keeps_rotation(qtype):
            return (), []
        return ("hadamard",), [(f"pyqwen.hadamard.{gguf_name}", VT.UINT32, self.rot)]


@dataclass
class W4A8Weight(_Rotated):
    """asym_w4a8_int8: 4-bit codes into a per-tensor codebook, fp8 group scales, channel scales."""

    name: str
    cfg: dict[str, Any]
    parts: dict[str, TensorRef]
    keep: bool  # may be written rotated

    def __post_init__(self):
        w, s_rel, s_ch = self.parts["weight"], self.parts["weight_s_rel"], self.parts["weight_s_channel"]
        if w.dtype not in ("I8", "U8") or len(w.shape) != 2:
            raise self.bad(f"{w.name} is {w.dtype} {list(w.shape)}, expected int8 [N, K/2]")
        self.n, self.k = w.shape[0], 2 * w.shape[1]
        g = self.cfg.get("group_size", 16)
        if not (isinstance(g, int) and g >= 4 and (16 % g == 0 or g % 16 == 0)):
            raise self.bad(f"group_size {g!r} must be >= 4 and divide 16 or be a multiple of 16")
        self.g = g
        if len(s_rel.shape) == 2 and s_rel.shape[0] == self.n and 6 * s_rel.shape[1] * g == 8 * w.shape[1]:
            raise self.bad("6-bit (W6A8) storage is not supported")  # rows of 3K/4 bytes
        if len(s_rel.shape) != 2 or s_rel.shape[0] != self.n or s_rel.shape[1] * g != self.k:
            raise self.bad(f"{s_rel.name} has shape {list(s_rel.shape)}, expected [{self.n}, {self.k // g}]")
        if s_rel.dtype not in ("F8_E4M3", "U8", "F32"):
            raise self.bad(f"{s_rel.name} has dtype {s_rel.dtype}, expected F8_E4M3 (or its bytes as U8) or F32")
        if tuple(s_ch.shape) != (self.n,):
            raise self.bad(f"{s_ch.name} has shape {list(s_ch.shape)}, expected [{self.n}]")
        cb = self.parts.get("weight_codebook")
        if cb is not None and tuple(cb.shape) != (16,):
            raise self.bad(f"{cb.name} has shape {list(cb.shape)}, expected [16]")
        self.codebook = _floats(cb) if cb is not None else None
        corr = self.parts.get("weight_correction")
        if corr is not None and tuple(corr.shape) != (self.k // g, self.n):
            raise self.bad(f"{corr.name} has shape {list(corr.shape)}, expected [{self.k // g}, {self.n}]")
        self.rot = _rotation_length(self.name, self.cfg, self.k)
        if self.k % 16:
            raise self.bad(f"{self.k} input columns are not a multiple of 16")
        exact = self.keep and corr is None  # no ggml type holds the correction
        pq = exact and g % 16 == 0 and s_rel.dtype != "F32"  # one fp8 scale byte per 16 columns
        self.rotated_types = ((PQ_W4A8,) if pq else ()) + ((int(QT.Q8_0),) if exact else ())

    def bad(self, why: str) -> ConversionError:
        return ConversionError(f"ComfyUI layer {self.name!r} (asym_w4a8_int8): {why}")

    def auto_type(self) -> int:
        return self.rotated_types[0] if self.rotated_types else int(QT.F16)

    def describe(self) -> str:
        kind = "codebook" if self.codebook is not None else "asym" if "weight_correction" in self.parts else "uniform"
        return f"comfy asym_w4a8_int8 {kind} g{self.g}, stored ·H{self.rot}"

    def _s_rel(self, rows: Rows) -> np.ndarray:
        ref = self.parts["weight_s_rel"]
        s = read_float(ref, rows) if ref.dtype == "F32" else E4M3FN[read_raw(ref, rows).view(np.uint8)]
        if not np.isfinite(s).all():
            raise self.bad(f"{ref.name} has NaN or infinite scales")
        return s

    def _s_channel(self, rows: Rows) -> np.ndarray:
        s = _floats(self.parts["weight_s_channel"])
        return s if rows is None else s[rows[0]:rows[1]]

    def grid(self, rows: Rows) -> np.ndarray:
        """The int8 grid values L [rows, K], in float32 like comfy-kitchen."""
        packed = read_raw(self.parts["weight"], rows).view(np.uint8)
        codes = np.empty((packed.shape[0], self.k), dtype=np.uint8)
        codes[:, 0::2] = packed & 0xF
        codes[:, 1::2] = packed >> 4
        levels = self.codebook if self.codebook is not None else np.arange(-8, 8, dtype=np.float32)
        v = levels[codes].reshape(len(codes), self.k // self.g, self.g) * self._s_rel(rows)[:, :, None]
        return np.clip(np.round(v), -127, 127).astype(np.int8).reshape(len(codes), self.k)

    def stored(self, rows: Rows) -> np.ndarray:
        """W_rot = L * s_channel (+ correction), float32."""
        w = self.grid(rows).astype(np.float32) * self._s_channel(rows)[:, None]
        if "weight_correction" in self.parts:
            c = _floats(self.parts["weight_correction"]).T  # [N, K/G]
            c = c if rows is None else c[rows[0]:rows[1]]
            w = (w.reshape(len(w), -1, self.g) + c[:, :, None]).reshape(w.shape)
        return w

    def encode(self, qtype: int, rows: Rows, permute: Permute) -> tuple[np.ndarray | None, np.ndarray]:
        if not self.keeps_rotation(qtype):
            return None, permute(self.dequantize(rows))
        n = self.n if rows is None else rows[1] - rows[0]
        order = self.row_order(permute, n)
        grid, s_ch = self.grid(rows), self._s_channel(rows)
        ref = (grid.astype(np.float32) * s_ch[:, None])[order]  # W_rot (no correction in rotated_types)
        if int(qtype) == QT.Q8_0:
            return _q8_0(grid[order], s_ch[order], ref), ref
        nb = self.k // 256
        out = np.zeros((n, nb), dtype=PQ_W4A8_BLOCK)
        out["d"] = s_ch[:, None]
        sr = read_raw(self.parts["weight_s_rel"], rows).view(np.uint8)
        out["sr"] = np.repeat(sr, self.g // 16, axis=1).reshape(n, nb, 16)
        out["qs"] = read_raw(self.parts["weight"], rows).view(np.uint8).reshape(n, nb, 128)
        # the codebook id of this process, so that the report can decode the blocks (in a file the
        # field is meaningless: pyqwen's loader sets it from the pyqwen.w4a8.codebook key)
        set_codebook(out, self.codebook)
        return out[order].view(np.uint8).reshape(n, nb * PQ_W4A8_BLOCK.itemsize), ref

    def extensions(self, gguf_name: str, qtype: int):
        requires, keys = super().extensions(gguf_name, qtype)
        if int(qtype) == PQ_W4A8:
            requires += ("pq_w4a8",)
            if self.codebook is not None:
                keys.append((f"pyqwen.w4a8.codebook.{gguf_name}", VT.FLOAT32, [float(x) for x in self.codebook]))
        return requires, keys


def set_codebook(blocks: np.ndarray, codebook: np.ndarray | None) -> None:
    ffi, lib = encode._native()
    cb = ffi.NULL if codebook is None else ffi.from_buffer("float[]", np.ascontiguousarray(codebook, np.float32))
    if lib.pq_w4a8_set_codebook(ffi.from_buffer(blocks), blocks.size, cb) != 0:
        raise encode._native_error("pq_w4a8 codebook")


@dataclass
class Int8Weight(_Rotated):
    """int8_tensorwise: int8 codes times a scalar or per-row scale, W·H with convrot."""

    name: str
    cfg: dict[str, Any]
    parts: dict[str, TensorRef]
    keep: bool

    def __post_init__(self):
        w, s = self.parts["weight"], self.parts["weight_scale"]
        if w.dtype != "I8" or len(w.shape) != 2:
            raise ConversionError(f"ComfyUI layer {self.name!r} (int8_tensorwise): {w.name} is {w.dtype} "
                                  f"{list(w.shape)}, expected int8 [N, K]")
        self.n, self.k = w.shape
        if math.prod(s.shape) not in (1, self.n):
            raise ConversionError(f"ComfyUI layer {self.name!r} (int8_tensorwise): {s.name} has shape "
                                  f"{list(s.shape)}, expected a scalar or one scale per row ({self.n})")
        self.rot = _rotation_length(self.name, self.cfg, self.k) if self.cfg.get("convrot") else 0
        self.rotated_types = (int(QT.Q8_0),) if self.keep else ()

    def auto_type(self) -> int:
        return int(QT.Q8_0) if self.keep or not self.rot else int(QT.F16)

    def describe(self) -> str:
        return f"comfy int8_tensorwise{f', stored ·H{self.rot}' if self.rot else ''}"

    def scales(self, rows: Rows) -> np.ndarray:
        s = np.broadcast_to(_floats(self.parts["weight_scale"]).reshape(-1), (self.n,))
        return s if rows is None else s[rows[0]:rows[1]]

    def stored(self, rows: Rows) -> np.ndarray:
        return read_raw(self.parts["weight"], rows).astype(np.float32) * self.scales(rows)[:, None]

    def encode(self, qtype: int, rows: Rows, permute: Permute) -> tuple[np.ndarray | None, np.ndarray]:
        if int(qtype) != QT.Q8_0 or (self.rot and not self.keep):
            return None, permute(self.dequantize(rows))
        q, ref = read_raw(self.parts["weight"], rows), self.stored(rows)
        order = self.row_order(permute, len(q))
        if self.rot:  # rows only: a rotated weight keeps its columns
            q, ref = q[order], ref[order]
        else:
            q, ref = permute(q.astype(np.float32)).astype(np.int8), permute(ref)
        return _q8_0(q, self.scales(rows)[order], ref), ref


# --- the layout ----------------------------------------------------------------

def _layer_configs(stored: dict[str, TensorRef]) -> dict[str, dict[str, Any]]:
    """Layer name -> comfy_quant config, from marker tensors and header metadata."""
    cfgs: dict[str, dict[str, Any]] = {}
    for f in sorted({r.file for r in stored.values()}):
        raw = read_metadata(f).get(HEADER_KEY)
        if raw is None:
            continue
        try:
            layers = json.loads(raw)["layers"]
            assert isinstance(layers, dict) and all(isinstance(v, dict) for v in layers.values())
        except (ValueError, KeyError, TypeError, AssertionError):
            raise ConversionError(f"{f.name}: header key {HEADER_KEY} is not "
                                  '{"layers": {name: {"format": ...}}} JSON') from None
        cfgs.update(layers)
    for name, ref in stored.items():
        if not name.endswith("." + MARKER):
            continue
        layer = name[: -len(MARKER) - 1]
        try:
            cfg = json.loads(read_raw(ref).view(np.uint8).tobytes().decode("utf-8"))
            assert isinstance(cfg, dict)
        except (ValueError, AssertionError):
            raise ConversionError(f"tensor {name!r} in {ref.file.name} is not UTF-8 JSON of an object") from None
        if layer in cfgs and cfgs[layer].get("format") != cfg.get("format"):
            raise ConversionError(f"ComfyUI layer {layer!r}: {name} says format {cfg.get('format')!r}, "
                                  f"the header says {cfgs[layer].get('format')!r}")
        cfgs[layer] = cfg
    return cfgs


def hf_name(name: str) -> str:
    """ComfyUI's Qwen3.5 names -> Hugging Face's (the rest is the architecture's business)."""
    return "lm_head." + name[len("model.lm_head."):] if name.startswith("model.lm_head.") else name


def _layer_source(layer: str, cfg: dict[str, Any], parts: dict[str, TensorRef]) -> SourceTensor:
    name = hf_name(f"{layer}.weight")
    keep = not name.endswith("embed_tokens.weight")  # a row lookup: never written rotated
    fmt = cfg["format"]
    if fmt == "float8_e4m3fn":
        w, s = parts["weight"], parts["weight_scale"]
        if math.prod(s.shape) != 1:
            raise ConversionError(f"ComfyUI layer {layer!r} (float8_e4m3fn): {s.name} has shape {list(s.shape)}, "
                                  "expected a scalar")
        return fp8_source(name, w, s, "comfy float8_e4m3fn, per tensor")
    native = (W4A8Weight if fmt == "asym_w4a8_int8" else Int8Weight)(name, cfg, parts, keep)
    return native_source(name, (native.n, native.k), tuple(parts.values()), native)


class ComfyLayout:
    name = "comfy_quant"

    def matches(self, quant_config: dict[str, Any] | None, stored: dict[str, TensorRef]) -> bool:
        return quant_config is None and is_comfy_checkpoint(stored)

    def logical_tensors(self, stored: dict[str, TensorRef], quant_config=None) -> dict[str, SourceTensor]:
        cfgs = _layer_configs(stored)
        present = {n.rsplit(".", 1)[0] for n in stored}
        claimed: set[str] = set()
        out: dict[str, SourceTensor] = {}
        for layer, cfg in cfgs.items():
            if layer not in present:  # a layer the architecture skips (the vision tower)
                continue
            fmt = cfg.get("format")
            if fmt not in _PARTS:
                raise ConversionError(f"ComfyUI layer {layer!r} has format {fmt!r}; supported: {', '.join(_PARTS)}")
            required, optional = _PARTS[fmt]
            parts = {p: stored[f"{layer}.{p}"] for p in required + optional if f"{layer}.{p}" in stored}
            missing = [p for p in required if p not in parts]
            if missing:
                raise ConversionError(f"ComfyUI layer {layer!r} ({fmt}) has no tensor {layer}.{missing[0]}")
            src = _layer_source(layer, cfg, parts)
            out[src.name] = src
            claimed.update(r.name for r in parts.values())
            claimed.add(f"{layer}.{MARKER}")
        rest = {n: r for n, r in stored.items() if n not in claimed}
        for name in rest:
            if name.endswith("." + MARKER):
                raise ConversionError(f"tensor {name!r} marks a layer with no {name[:-len(MARKER)]}weight")
            if name.rsplit(".", 1)[-1] in _PART_NAMES:
                raise ConversionError(f"tensor {name!r} belongs to a quantized layer that has no comfy_quant marker")
        for name, ref in rest.items():
            out[hf_name(name)] = float_source(hf_name(name), ref, "an unquantized tensor of a ComfyUI checkpoint")
        return out
