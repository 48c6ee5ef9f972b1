"""Quantized copies of a float checkpoint, in the layouts users hold, for the converter tests.

`quantize_checkpoint(src_dir, dst_dir, spec)` reads the float weights of `src_dir`,
quantizes every linear weight inside the decoder layers and the MTP head with its
own quantizer (written here from the format descriptions, independently of
pyqwen.convert), stores them the way `spec.layout` does, copies the tokenizer and
returns the dequantized weights: what an exact conversion must reproduce.

Layouts: ct-int (compressed-tensors int-quantized: W4A8, W6A8, W8A8),
ct-pack (pack-quantized, dense >= 0.18 or per-word <= 0.17 packing), gptq (v1/v2),
awq (GEMM), fp8 (Qwen official, 128x128 block scales). Options: bits, group, sym,
act-order, a mixed-precision second group for the MLP, the scale dtype.
"""
from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from tiny_models import read_tensors

# every nn.Linear of the layers and the MTP head (the DeltaNet in_proj_qkv/z/a/b included)
QUANTIZED = re.compile(r"^(model\.layers|mtp)\..*(proj|proj_\w+|fc)\.weight$")


@dataclass(frozen=True)
class Spec:
    layout: str  # ct-int | ct-pack | gptq | awq | fp8
    bits: int = 4
    group: int = 128  # 0: per channel
    sym: bool = True
    act_order: bool = False
    dense: bool = True  # ct-pack: >= 0.18 bit stream, else <= 0.17 whole codes per word
    gptq_v2: bool = False
    scale_dtype: torch.dtype = torch.bfloat16
    mlp_bits: int | None = None  # compressed-tensors mixed precision: the MLP in a second group
    ignore: tuple[str, ...] = field(default=())  # modules left float (and listed in `ignore`)
    only: str | None = None  # regex: quantize only the matching linears (e.g. the routed experts)


def _quantize_groups(w: np.ndarray, bits: int, group: int, sym: bool, g_idx: np.ndarray, scale_dtype):
    """Round-to-nearest per group: (q [N, K] in the code range, scale [N, G], zero [N, G] or None);
    W ~ (q - zero) * scale[:, g_idx]."""
    n, k = w.shape
    n_groups = int(g_idx.max()) + 1
    scale = np.zeros((n, n_groups), np.float32)
    zero = None if sym else np.zeros((n, n_groups), np.int32)
    for g in range(n_groups):
        cols = w[:, g_idx == g]
        if sym:
            scale[:, g] = np.abs(cols).max(axis=1) / ((1 << (bits - 1)) - 1)
        else:
            lo, hi = np.minimum(cols.min(axis=1), 0), np.maximum(cols.max(axis=1), 0)
            scale[:, g] = (hi - lo) / ((1 << bits) - 1)
    scale = torch.from_numpy(scale).to(scale_dtype).to(torch.float32).numpy()
    if not sym:
        lo = np.stack([np.minimum(w[:, g_idx == g].min(axis=1), 0) for g in range(n_groups)], axis=1)
        zero = np.clip(np.round(-lo / scale), 0, (1 << bits) - 1).astype(np.int32) - (1 << (bits - 1))
    lo_q, hi_q = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    z_full = zero[:, g_idx] if zero is not None else 0
    q = np.clip(np.round(w / scale[:, g_idx]) + z_full, lo_q, hi_q).astype(np.int32)
    return q, scale, zero


def _pack_bits(u: np.ndarray, bits: int, dense: bool) -> np.ndarray:
    """Rows of unsigned codes -> int32 words, LSB first (dense: one bit stream; else 32 // bits per word)."""
    n, k = u.shape
    if dense:
        stream = ((u[:, :, None] >> np.arange(bits)) & 1).reshape(n, k * bits)
        n_words = -(-k * bits // 32)
    else:
        per = 32 // bits
        n_words = -(-k // per)
        pad = np.zeros((n, n_words * per - k), u.dtype)
        slots = np.concatenate([u, pad], axis=1).reshape(n, n_words, per)
        field_bits = ((slots[:, :, :, None] >> np.arange(bits)) & 1).reshape(n, n_words, per * bits)
        stream = np.concatenate([field_bits, np.zeros((n, n_words, 32 - per * bits), u.dtype)], axis=2)
        stream = stream.reshape(n, n_words * 32)
    stream = np.concatenate([stream, np.zeros((n, n_words * 32 - stream.shape[1]), stream.dtype)], axis=1)
    words = (stream.reshape(n, n_words, 32).astype(np.uint64) << np.arange(32, dtype=np.uint64)).sum(axis=2)
    return words.astype(np.uint32).view(np.int32)


def _g_idx(k: int, group: int, act_order: bool, rng) -> np.ndarray:
    g = np.arange(k) // (group or k)
    return rng.permutation(g) if act_order else g


def _to_t(a: np.ndarray, dtype=None) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.to(dtype) if dtype is not None else t


def _quantize_linear(name: str, w: np.ndarray, spec: Spec, rng) -> tuple[dict[str, torch.Tensor], np.ndarray]:
    module = name[: -len(".weight")]
    n, k = w.shape
    bits = spec.mlp_bits if spec.mlp_bits and ".mlp." in name else spec.bits
    if spec.layout == "fp8":
        bn = 128
        s = np.zeros((-(-n // bn), -(-k // bn)), np.float32)
        for i in range(s.shape[0]):
            for j in range(s.shape[1]):
                s[i, j] = np.abs(w[i * bn:(i + 1) * bn, j * bn:(j + 1) * bn]).max() / 448.0
        s_full = np.repeat(np.repeat(s, bn, 0), bn, 1)[:n, :k]
        f8 = torch.from_numpy(w / s_full).to(torch.float8_e4m3fn)
        deq = f8.to(torch.float32).numpy() * s_full
        return {f"{module}.weight": f8, f"{module}.weight_scale_inv": _to_t(s)}, deq
    g_idx = _g_idx(k, spec.group, spec.act_order, rng)
    scale_dtype = torch.float16 if spec.layout in ("gptq", "awq") else spec.scale_dtype
    q, scale, zero = _quantize_groups(w, bits, spec.group or k, spec.sym, g_idx, scale_dtype)
    zero_full = zero[:, g_idx] if zero is not None else 0
    deq = ((q - zero_full) * scale[:, g_idx]).astype(np.float32)
    off = 1 << (bits - 1)
    if spec.layout == "ct-int":
        out = {f"{module}.weight": _to_t(q.astype(np.int8)), f"{module}.weight_scale": _to_t(scale, spec.scale_dtype)}
        if zero is not None:
            out[f"{module}.weight_zero_point"] = _to_t(zero.astype(np.int8))
    elif spec.layout == "ct-pack":
        out = {f"{module}.weight_packed": _to_t(_pack_bits((q + off).astype(np.uint32), bits, spec.dense)),
               f"{module}.weight_shape": torch.tensor([n, k], dtype=torch.int64),
               f"{module}.weight_scale": _to_t(scale, spec.scale_dtype)}
        if zero is not None:  # packed along dim 0
            out[f"{module}.weight_zero_point"] = _to_t(_pack_bits((zero + off).T.astype(np.uint32), bits, spec.dense).T)
    elif spec.layout in ("gptq", "awq"):
        u = (q + off).astype(np.uint32)  # unsigned codes, z = zero + off (8 when symmetric)
        z = (zero + off if zero is not None else np.full_like(scale, off, dtype=np.int32)).astype(np.uint32)
        if spec.layout == "gptq":
            stored_z = z - (0 if spec.gptq_v2 else 1)
            out = {f"{module}.qweight": _to_t(_pack_bits(u, bits, True).T.copy()),  # packed along K
                   f"{module}.qzeros": _to_t(_pack_bits(stored_z.T, bits, True)),  # packed along N
                   f"{module}.scales": _to_t(scale.T, torch.float16),
                   f"{module}.g_idx": _to_t(g_idx.astype(np.int32))}
        else:
            order = np.array([0, 2, 4, 6, 1, 3, 5, 7])
            # nibble p of word c holds column 8c + order[p]
            shuffled_u = u.T.reshape(k, n // 8, 8)[:, :, order].reshape(k, n)
            shuffled_z = z.T.reshape(-1, n // 8, 8)[:, :, order].reshape(-1, n)
            out = {f"{module}.qweight": _to_t(_pack_bits(shuffled_u, 4, True)),
                   f"{module}.qzeros": _to_t(_pack_bits(shuffled_z, 4, True)),
                   f"{module}.scales": _to_t(scale.T, torch.float16)}
    else:
        raise ValueError(spec.layout)
    if spec.act_order and spec.layout.startswith("ct"):
        out[f"{module}.weight_g_idx"] = _to_t(g_idx.astype(np.int32))
    return out, deq


def _quant_config(spec: Spec) -> dict:
    if spec.layout == "fp8":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    if spec.layout == "gptq":
        return {"quant_method": "gptq", "bits": spec.bits, "group_size": spec.group or -1, "sym": spec.sym,
                "desc_act": spec.act_order, "checkpoint_format": "gptq_v2" if spec.gptq_v2 else "gptq",
                "dynamic": {"-:.*lm_head.*": {}}}
    if spec.layout == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": spec.group, "zero_point": True, "version": "gemm",
                "modules_to_not_convert": ["lm_head"]}

    # every field as llm-compressor's save_pretrained serializes compressed-tensors' QuantizationConfig
    def args(bits):
        return {"actorder": "group" if spec.act_order else None, "block_structure": None, "dynamic": False,
                "group_size": spec.group or None, "num_bits": bits, "observer": "minmax", "observer_kwargs": {},
                "strategy": "group" if spec.group else "channel", "symmetric": spec.sym, "type": "int"}

    fmt = "int-quantized" if spec.layout == "ct-int" else "pack-quantized"
    act = {"actorder": None, "block_structure": None, "dynamic": True, "group_size": None, "num_bits": 8,
           "observer": None, "observer_kwargs": {}, "strategy": "token", "symmetric": True, "type": "int"}
    groups = {"group_0": {"format": fmt, "input_activations": act if fmt == "int-quantized" else None,
                          "output_activations": None, "targets": ["Linear"], "weights": args(spec.bits)}}
    if spec.mlp_bits:
        groups["group_1"] = {**groups["group_0"], "targets": ["re:.*mlp.*"], "weights": args(spec.mlp_bits)}
    return {"config_groups": groups, "format": "mixed-precision" if spec.mlp_bits else fmt,
            "global_compression_ratio": None, "ignore": ["lm_head", *spec.ignore], "kv_cache_scheme": None,
            "quant_method": "compressed-tensors", "quantization_status": "compressed", "sparsity_config": {},
            "transform_config": {}, "version": "0.18.0" if spec.dense else "0.17.0"}


def quantize_checkpoint(src_dir: Path, dst_dir: Path, spec: Spec, seed: int = 0) -> dict[str, np.ndarray]:
    """Write the quantized checkpoint; returns every weight as the converter must read it (float32)."""
    src_dir, dst_dir = Path(src_dir), Path(dst_dir)
    dst_dir.mkdir(parents=True, exist_ok=True)
    for f in src_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy(f, dst_dir / f.name)
    rng = np.random.default_rng(seed)
    weights = read_tensors(src_dir)
    stored: dict[str, torch.Tensor] = {}
    reference: dict[str, np.ndarray] = {}
    for name, w in sorted(weights.items()):
        if QUANTIZED.match(name) and not any(name.startswith(i + ".") for i in spec.ignore) \
                and (spec.only is None or re.match(spec.only, name)):
            tensors, deq = _quantize_linear(name, w, spec, rng)
            stored.update(tensors)
            reference[name] = deq
        else:
            stored[name] = torch.from_numpy(w).to(torch.bfloat16)
            reference[name] = stored[name].to(torch.float32).numpy()
    save_file(stored, str(dst_dir / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((dst_dir / "config.json").read_text())
    cfg["quantization_config"] = _quant_config(spec)
    cfg["dtype"] = "bfloat16"
    (dst_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return reference


def write_float_checkpoint(src_dir: Path, dst_dir: Path, weights: dict[str, np.ndarray]) -> Path:
    """The float checkpoint of `weights` (e.g. the dequantized reference) next to src_dir's config."""
    dst_dir = Path(dst_dir)
    dst_dir.mkdir(parents=True, exist_ok=True)
    for f in Path(src_dir).iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy(f, dst_dir / f.name)
    cfg = json.loads((dst_dir / "config.json").read_text())
    cfg.pop("quantization_config", None)
    cfg["dtype"] = "float32"
    (dst_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file({k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in weights.items()},
              str(dst_dir / "model.safetensors"), metadata={"format": "pt"})
    return dst_dir
