"""compressed-tensors / llm-compressor checkpoints (`quant_method: "compressed-tensors"`).

Per quantized module `P` (formats may differ per config group: "mixed-precision"):
- int-quantized / naive-quantized (W4A8, W6A8, W8A8): `P.weight` I8 [N, K] holding
  q in [-2^(b-1), 2^(b-1)-1], `P.weight_scale` [N, K/G] ([N, 1] per channel),
  `P.weight_zero_point` (asymmetric), `P.weight_g_idx` I32 [K] (actorder=group);
- pack-quantized (W4A16, ...): `P.weight_packed` I32 [N, W] with u = q + 2^(b-1)
  LSB-first, `P.weight_shape` I64 [2], the scale, the zero point packed the same
  way along dim 0, g_idx. Up to 0.17 a word held 32 // b codes (6-bit: five,
  two bits unused, W = ceil(K / 5)); from 0.18 the codes are one dense bit
  stream (W = ceil(6K / 32)). For b = 1, 2, 4, 8 both are the same; otherwise
  the width tells them apart;
- float-quantized (FP8): `P.weight` F8_E4M3 and `P.weight_scale`.
W = (q - zero) * scale[n, g(k)]. Activation parameters (input_scale, k/v
scales) are dropped: ggml quantizes activations itself.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .errors import ConversionError
from .fp8 import fp8_source
from .intquant import IntWeight, expand_scale, unpack_dense, unpack_per_word
from .layouts import SourceTensor, float_source, native_source
from .safetensors_reader import TensorRef, read_float, read_raw

INT_FORMATS = ("int-quantized", "naive-quantized")
SUPPORTED_FORMATS = (*INT_FORMATS, "pack-quantized", "float-quantized")
# stored per-module tensors that are activation / cache parameters, not weights
_DROPPED = (".input_scale", ".input_zero_point", ".input_global_scale", ".output_scale", ".output_zero_point",
            ".k_scale", ".v_scale")
_PARTS = ("weight_packed", "weight_shape", "weight_scale", "weight_zero_point", "weight_g_idx")


def _targets_match(targets: list[str], module: str) -> int:
    """0: no match; 3: by exact name, 2: by regex, 1: by class (`Linear`); the most
    specific matching group wins, as in compressed-tensors."""
    best = 0
    for t in targets or []:
        if t == module:
            best = max(best, 3)
        elif t.startswith("re:") and re.match(t[3:], module):
            best = max(best, 2)
        elif t == "Linear":
            best = max(best, 1)
    return best


class CompressedTensorsLayout:
    name = "compressed-tensors (int-quantized, pack-quantized, float-quantized)"

    def matches(self, q: dict[str, Any] | None, stored: dict[str, TensorRef]) -> bool:
        return bool(q) and q.get("quant_method") == "compressed-tensors"

    def _group(self, q: dict[str, Any], module: str) -> dict[str, Any]:
        groups = q.get("config_groups")
        if not isinstance(groups, dict) or not groups:
            raise ConversionError("quantization_config.config_groups is missing or empty")
        ranked = sorted(((_targets_match(g.get("targets"), module), name) for name, g in groups.items()
                         if isinstance(g, dict)), reverse=True)
        if not ranked or ranked[0][0] == 0:
            raise ConversionError(f"module {module!r} is quantized but no quantization_config.config_groups "
                                  "entry targets it")
        name = ranked[0][1]
        g = groups[name]
        fmt = g.get("format") or q.get("format")
        if fmt not in SUPPORTED_FORMATS:
            raise ConversionError(f"quantization_config.config_groups.{name}: format {fmt!r} is not supported "
                                  f"(supported: {', '.join(SUPPORTED_FORMATS)})")
        w = g.get("weights")
        if not isinstance(w, dict):
            raise ConversionError(f"quantization_config.config_groups.{name}.weights is missing")
        wtype = w.get("type", "int")
        if (fmt == "float-quantized") != (wtype == "float"):
            raise ConversionError(f"quantization_config.config_groups.{name}: format {fmt!r} with weights of "
                                  f"type {wtype!r} is not supported")
        bits = w.get("num_bits")
        if not isinstance(bits, int) or not 1 < bits <= 8:
            raise ConversionError(f"quantization_config.config_groups.{name}.weights.num_bits={bits!r}: "
                                  "2 to 8 bits are supported")
        if w.get("strategy") not in (None, "tensor", "channel", "group", "block"):
            raise ConversionError(f"quantization_config.config_groups.{name}.weights.strategy="
                                  f"{w.get('strategy')!r} is not supported")
        return {"name": name, "format": fmt, **w}

    def logical_tensors(self, stored: dict[str, TensorRef], q: dict[str, Any]) -> dict[str, SourceTensor]:
        out: dict[str, SourceTensor] = {}
        used: set[str] = set()
        for name in stored:
            if name.endswith(".weight_scale"):
                module = name[: -len(".weight_scale")]
                refs = {p: stored.get(f"{module}.{p}") for p in _PARTS}
                refs["weight"] = stored.get(f"{module}.weight")
                used.update(r.name for r in refs.values() if r is not None)
                out[f"{module}.weight"] = self._module(module, refs, self._group(q, module))
        for name, ref in stored.items():
            if name not in used and not name.endswith(_DROPPED):
                out[name] = float_source(name, ref, "a tensor outside the quantized modules")
        return out

    def _module(self, module: str, refs: dict[str, TensorRef | None], g: dict[str, Any]) -> SourceTensor:
        scale = refs["weight_scale"]
        if g["format"] == "float-quantized":
            if refs["weight"] is None:
                raise ConversionError(f"missing tensor '{module}.weight' (FP8 module with a weight_scale)")
            return fp8_source(f"{module}.weight", refs["weight"], scale, f"compressed-tensors {g['strategy']}")
        bits, sym = g["num_bits"], g.get("symmetric", True)
        zp = refs["weight_zero_point"]
        if not sym and zp is None:
            raise ConversionError(f"missing tensor '{module}.weight_zero_point' (config group {g['name']} is asymmetric)")
        if g["format"] == "pack-quantized":
            packed, shape_ref = refs["weight_packed"], refs["weight_shape"]
            if packed is None or shape_ref is None:
                raise ConversionError(f"missing tensor '{module}.weight_packed' or '{module}.weight_shape' "
                                      f"(config group {g['name']} is pack-quantized)")
            if packed.dtype != "I32":
                raise ConversionError(f"tensor {packed.name!r} has dtype {packed.dtype}, expected I32")
            shape = tuple(int(d) for d in read_raw(shape_ref).reshape(-1))
            if len(shape) != len(packed.shape) or shape[:-1] != packed.shape[:-1]:
                raise ConversionError(f"tensor {shape_ref.name!r} says {list(shape)}, which does not fit "
                                      f"{packed.name!r} {list(packed.shape)}")
            dense = _packing(packed, bits, shape[-1])
            weight_ref = packed
        else:
            weight_ref = refs["weight"]
            if weight_ref is None:
                raise ConversionError(f"missing tensor '{module}.weight' (config group {g['name']} is {g['format']})")
            if weight_ref.dtype != "I8":
                raise ConversionError(f"tensor {weight_ref.name!r} has dtype {weight_ref.dtype}; "
                                      f"{g['format']} weights are I8")
            shape, dense = weight_ref.shape, None
        k = shape[-1]
        _check_scale_shape(scale, shape, g)
        if zp is not None and g["format"] != "pack-quantized" and zp.shape != scale.shape:
            raise ConversionError(f"tensor {zp.name!r} has shape {list(zp.shape)}, expected {list(scale.shape)} "
                                  f"like {scale.name!r}")
        g_idx = None
        if refs["weight_g_idx"] is not None:
            g_idx = read_raw(refs["weight_g_idx"]).astype(np.int64).reshape(-1)
            n_groups = scale.shape[-1] if len(scale.shape) >= 2 else 1
            if g_idx.shape != (k,) or g_idx.min() < 0 or g_idx.max() >= n_groups:
                raise ConversionError(f"tensor {refs['weight_g_idx'].name!r} is not a group index for {k} columns "
                                      f"and {n_groups} groups")
        group = k // scale.shape[-1] if len(scale.shape) >= 2 else k
        act_order = g_idx is not None and not np.array_equal(g_idx, np.arange(k) // group)
        offset = 1 << (bits - 1)

        def zeros() -> np.ndarray | int:
            """Zero points in the code domain (u for packed, q for int8 codes), per group."""
            if zp is None:
                return offset if dense is not None else 0
            z = read_raw(zp)
            if dense is None:
                return z.astype(np.int16)
            rows_n = scale.shape[-2]
            zt = np.swapaxes(z, -1, -2)  # packed along dim 0 (rows): unpack the columns of the transpose
            zu = unpack_dense(zt, bits, rows_n) if dense else unpack_per_word(zt, bits, rows_n)
            return np.swapaxes(zu, -1, -2).astype(np.int16)

        def codes(rows=None):
            raw = read_raw(weight_ref, rows)
            if dense is None:
                c = raw.astype(np.int16)
            else:
                c = (unpack_dense(raw, bits, k) if dense else unpack_per_word(raw, bits, k)).astype(np.int16)
            z = zeros()
            q = c - (expand_scale(z, shape, rows, g_idx) if isinstance(z, np.ndarray) else np.int16(z))
            s = expand_scale(read_float(scale).astype(np.float32), shape, rows, g_idx)
            return q.astype(np.int16, copy=False), np.ascontiguousarray(s)

        fmt = g["format"] if dense is None else f"pack-quantized, {'dense' if dense else 'word'} packing"
        native = IntWeight(bits, zp is None, group, act_order, f"compressed-tensors {fmt}", codes)
        extra = tuple(r for r in (scale, zp, refs["weight_g_idx"]) if r is not None)
        return native_source(f"{module}.weight", shape, (weight_ref, *extra), native)


def _packing(packed: TensorRef, bits: int, k: int) -> bool:
    """True: dense bit stream (>= 0.18), False: whole codes per word (<= 0.17)."""
    width = packed.shape[-1]
    dense_w, word_w = -(-k * bits // 32), -(-k // (32 // bits))
    if width == dense_w:
        if width == word_w and 32 % bits:
            raise ConversionError(f"tensor {packed.name!r}: width {width} fits both the dense and the per-word "
                                  f"{bits}-bit packing of {k} columns; cannot tell them apart")
        return True
    if width == word_w:
        return False
    raise ConversionError(f"tensor {packed.name!r} has width {width}; {k} {bits}-bit codes need {dense_w} words "
                          f"(dense packing) or {word_w} (per-word packing)")


def _check_scale_shape(scale: TensorRef, shape: tuple[int, ...], g: dict[str, Any]) -> None:
    s = scale.shape
    n, k = shape[-2:]
    ok = len(s) <= 1 and int(np.prod(s)) in (1, n) if len(s) <= 1 else (
        len(s) == len(shape) and s[:-2] == shape[:-2] and n % s[-2] == 0 and k % s[-1] == 0)
    if ok and g.get("strategy") == "group" and len(s) >= 2:
        ok = g.get("group_size") in (None, k // s[-1])
    if not ok:
        raise ConversionError(f"tensor {scale.name!r} has shape {list(s)}, which is not a "
                              f"{g.get('strategy') or 'group'} scale of a {list(shape)} weight"
                              + (f" with group_size {g.get('group_size')}" if g.get("group_size") else ""))
