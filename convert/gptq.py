"""GPTQ checkpoints (`quant_method: "gptq"`: AutoGPTQ, GPTQModel, Qwen's -GPTQ-Int4 releases).

Per quantized module `P`: `P.qweight` I32 [K*b/32, N] packed along K (k = 32r/b + i
at bits b*i), `P.qzeros` I32 [K/G, N*b/32] packed along N, `P.scales` F16
[K/G, N], `P.g_idx` I32 [K] (non-monotonic with desc_act).
W[n, k] = scales[g, n] * (u[k, n] - z[g, n]) with g = g_idx[k], z = stored + 1
for checkpoint_format "gptq" (v1), z = stored for "gptq_v2".
GPTQModel's `dynamic` map overrides bits / group_size / sym per module regex;
modules it excludes ("-:") are stored unquantized and stay float.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .errors import ConversionError
from .intquant import IntWeight, expand_scale, unpack_per_word
from .layouts import SourceTensor, float_source, native_source
from .safetensors_reader import TensorRef, read_float, read_raw


def module_config(q: dict[str, Any], module: str) -> dict[str, Any]:
    """bits / group_size / sym / desc_act for `module`, after GPTQModel `dynamic` overrides."""
    cfg = {k: q.get(k) for k in ("bits", "group_size", "sym", "desc_act")}
    for pattern, override in (q.get("dynamic") or {}).items():
        if pattern.startswith("-:"):
            continue
        if re.match(pattern.removeprefix("+:"), module) and isinstance(override, dict):
            cfg.update({k: v for k, v in override.items() if k in cfg})
            break
    return cfg


def packed_int_module(module: str, refs: dict[str, TensorRef], bits: int, sym: bool, zero_offset: int,
                      scheme: str, order: tuple[int, ...] | None, along_k: bool) -> SourceTensor:
    """GPTQ (codes packed along K) and AWQ (along N, shuffled): [K, N]-major storage."""
    qweight, qzeros, scales = refs["qweight"], refs["qzeros"], refs["scales"]
    for r in (qweight, qzeros):
        if r.dtype != "I32":
            raise ConversionError(f"tensor {r.name!r} has dtype {r.dtype}, expected I32")
    per = 32 // bits
    if along_k:
        k, n = qweight.shape[0] * per, qweight.shape[1]
    else:
        k, n = qweight.shape[0], qweight.shape[1] * per
    n_groups = scales.shape[0] if len(scales.shape) == 2 else 0
    if len(scales.shape) != 2 or scales.shape[1] != n or k % n_groups:
        raise ConversionError(f"tensor {scales.name!r} has shape {list(scales.shape)}, expected [K/G, {n}] "
                              f"for {qweight.name!r} {list(qweight.shape)} ({bits}-bit)")
    if qzeros.shape != (n_groups, n // per):
        raise ConversionError(f"tensor {qzeros.name!r} has shape {list(qzeros.shape)}, expected "
                              f"{[n_groups, n // per]}")
    group = k // n_groups
    g_idx = None
    if refs.get("g_idx") is not None:
        g_idx = read_raw(refs["g_idx"]).astype(np.int64).reshape(-1)
        if g_idx.shape != (k,) or g_idx.min() < 0 or g_idx.max() >= n_groups:
            raise ConversionError(f"tensor {refs['g_idx'].name!r} is not a group index for {k} columns and "
                                  f"{n_groups} groups")
        if np.array_equal(g_idx, np.arange(k) // group):
            g_idx = None
    shape = (n, k)

    def codes(rows=None):
        w = read_raw(qweight)
        u = unpack_per_word(w.T, bits, k) if along_k else unpack_per_word(w, bits, n, order).T
        z = unpack_per_word(read_raw(qzeros), bits, n, order).T.astype(np.int16) + zero_offset  # [N, G]
        s = read_float(scales).astype(np.float32).T
        if rows is not None:
            u, z, s = u[rows[0]:rows[1]], z[rows[0]:rows[1]], s[rows[0]:rows[1]]
        q = u.astype(np.int16) - expand_scale(z, (u.shape[0], k), None, g_idx)
        return q, np.ascontiguousarray(expand_scale(s, (u.shape[0], k), None, g_idx))

    native = IntWeight(bits, sym, group, g_idx is not None, scheme, codes)
    parts = tuple(r for r in (qweight, qzeros, scales, refs.get("g_idx")) if r is not None)
    return native_source(f"{module}.weight", shape, parts, native, row_slicable=False)


def packed_int_tensors(stored: dict[str, TensorRef], layout: str, make) -> dict[str, SourceTensor]:
    """Group `P.qweight` + `P.qzeros` + `P.scales` (+ `P.g_idx`) into `P.weight`; `make(module, refs)`
    builds the SourceTensor, everything else must be float."""
    out: dict[str, SourceTensor] = {}
    used: set[str] = set()
    for name in stored:
        if not name.endswith(".qweight"):
            continue
        module = name[: -len(".qweight")]
        refs = {p: stored.get(f"{module}.{p}") for p in ("qweight", "qzeros", "scales", "g_idx")}
        for p in ("qzeros", "scales"):
            if refs[p] is None:
                raise ConversionError(f"missing tensor '{module}.{p}' ({layout} module with a qweight)")
        used.update(r.name for r in refs.values() if r is not None)
        out[f"{module}.weight"] = make(module, refs)
    for name, ref in stored.items():
        if name not in used:
            out[name] = float_source(name, ref, f"a tensor outside the {layout} modules")
    return out


class GPTQLayout:
    name = "gptq (v1/v2, desc_act)"

    def matches(self, q: dict[str, Any] | None, stored: dict[str, TensorRef]) -> bool:
        return bool(q) and q.get("quant_method") == "gptq"

    def logical_tensors(self, stored: dict[str, TensorRef], q: dict[str, Any]) -> dict[str, SourceTensor]:
        fmt = q.get("checkpoint_format", "gptq")
        if fmt not in ("gptq", "gptq_v2"):
            raise ConversionError(f"quantization_config.checkpoint_format={fmt!r}: only gptq and gptq_v2 are supported")

        def make(module, refs):
            cfg = module_config(q, module)
            bits = cfg["bits"]
            if bits not in (2, 4, 8):
                raise ConversionError(f"quantization_config.bits={bits!r} (module {module!r}): GPTQ with 2, 4 or 8 "
                                      "bits is supported")
            return packed_int_module(module, refs, bits, bool(cfg["sym"]), 1 if fmt == "gptq" else 0,
                                     f"gptq {'v1' if fmt == 'gptq' else 'v2'}", None, along_k=True)

        return packed_int_tensors(stored, "GPTQ", make)
