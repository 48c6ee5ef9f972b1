"""ComfyUI `comfy_quant` checkpoints for tests, made from tiny Hugging Face ones.

The quantizers follow comfy-kitchen as the format brief describes them (written here, not
imported from the converter):
- asym_w4a8_int8: rotate W by the ConvRot Hadamard matrix per 256 columns, fit a 16-level
  Lloyd-Max codebook to the group-normalized rotated weights, assign codes and refit the group
  scales by least squares, s_channel = max|shifted| / 127, s_rel = s_group / s_channel stored as
  e4m3fn, then assign each weight the nearest level of the int8 grid the kernels decode,
  round(codebook * s_rel). Variants: uniform codes (no codebook) and the asymmetric one with a
  per-group correction.
- int8_tensorwise: per-row absmax / 127 (with convrot) or one scale for the tensor.
- float8_e4m3fn: scale = absmax / 448.

`dequantize` is the float64 reference decoder of the same formats.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch

from tiny_models import read_tensors

H4 = np.array([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=np.float64)


def hadamard(n: int) -> np.ndarray:
    h = H4
    while h.shape[0] < n:
        h = np.kron(h, H4)
    return h / np.sqrt(n)


def rotate(w: np.ndarray, n: int = 256) -> np.ndarray:
    r, k = w.shape
    return (w.astype(np.float64).reshape(r, k // n, n) @ hadamard(n)).reshape(r, k)


def to_e4m3(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def e4m3_values(b: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(b, dtype=np.uint8)).view(torch.float8_e4m3fn).to(torch.float32).numpy()


# pyqwen's GGML_TYPE_PQ_W4A8 block (ggml-patches/0003, include/ggml-pyqwen.h), transcribed here rather
# than imported from the converter
W4A8_BLOCK = np.dtype([("d", "<f4"), ("cb", "<u4"), ("sr", "u1", (16,)), ("qs", "u1", (128,))])


def w4a8_decode(b: np.ndarray, codebook) -> np.ndarray:
    """float32 decode of [rows, blocks] PQ_W4A8 blocks per the type's definition (include/ggml-pyqwen.h);
    codebook None: the uniform code (code - 8)."""
    n, nb = b.shape
    codes = np.empty((n, nb, 256), dtype=np.uint8)
    codes[..., 0::2], codes[..., 1::2] = b["qs"] & 15, b["qs"] >> 4
    levels = np.asarray(codebook, np.float32) if codebook is not None else np.arange(-8, 8, dtype=np.float32)
    s = np.repeat(e4m3_values(b["sr"]), 16, axis=-1)
    L = np.clip(np.round((levels[codes] * s).astype(np.float32)), -127, 127)
    return (L * b["d"][..., None]).reshape(n, nb * 256).astype(np.float32)


def lloyd_max(x: np.ndarray, levels: int = 16, iters: int = 25) -> np.ndarray:
    x = x.reshape(-1).astype(np.float32)
    cb = np.quantile(x, np.linspace(0, 1, levels)).astype(np.float32)
    for _ in range(iters):
        a = np.abs(x[:, None] - cb[None]).argmin(1)
        cb = np.array([x[a == j].mean() if (a == j).any() else cb[j] for j in range(levels)], dtype=np.float32)
    return np.sort(cb)


def _nearest(x: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Index of the nearest level (levels broadcast against x[..., None])."""
    return np.abs(x[..., None] - levels).argmin(-1)


def quantize_w4a8(w: np.ndarray, *, group: int = 16, codebook: bool = True, asym: bool = False) -> dict[str, np.ndarray]:
    n, k = w.shape
    x = rotate(w).astype(np.float32).reshape(n, k // group, group)
    cb = None
    correction = None
    if asym:
        mn = x.min(-1, keepdims=True)
        s_g = np.maximum((x.max(-1, keepdims=True) - mn) / 15, 1e-8)
        u = np.clip(np.round((x - mn) / s_g), 0, 15)
        shifted = (u - 8) * s_g
        correction = (8 * s_g + mn)[..., 0].T.astype(np.float32)
    elif codebook:
        amax = np.maximum(np.abs(x).max(-1, keepdims=True), 1e-8)
        cb = lloyd_max(x / amax)
        q = _nearest(x / amax, cb)
        s_g = amax
        for _ in range(2):
            lv = cb[q]
            s_g = np.maximum((x * lv).sum(-1, keepdims=True) / np.maximum((lv * lv).sum(-1, keepdims=True), 1e-8), 1e-8)
            q = _nearest(x / s_g, cb)
        shifted = cb[q] * s_g
    else:
        s_g = np.maximum(np.abs(x).max(-1, keepdims=True) / 7, 1e-8)
        u = np.clip(np.round(x / s_g), -8, 7) + 8
        shifted = (u - 8) * s_g
    s_ch = np.maximum(np.abs(shifted).max(axis=(1, 2)) / 127, 1e-8).astype(np.float32)
    s_rel = to_e4m3((s_g[..., 0] / s_ch[:, None]).astype(np.float32))
    if cb is not None:
        levels = np.clip(np.round(cb[None, None, :] * e4m3_values(s_rel)[..., None]), -127, 127)  # [n, groups, 16]
        u = _nearest(x / s_ch[:, None, None], levels[:, :, None, :])
    u = u.reshape(n, k).astype(np.uint8)
    out = {"weight": (u[:, 0::2] | (u[:, 1::2] << 4)).view(np.int8), "weight_s_rel": s_rel, "weight_s_channel": s_ch}
    if cb is not None:
        out["weight_codebook"] = cb
    if correction is not None:
        out["weight_correction"] = correction
    return out


def quantize_int8(w: np.ndarray, *, convrot: bool) -> dict[str, np.ndarray]:
    x = rotate(w).astype(np.float32) if convrot else w.astype(np.float32)
    scale = (np.abs(x).max(1, keepdims=True) if convrot else np.abs(x).max(keepdims=True).reshape(())) / 127
    scale = np.asarray(scale, dtype=np.float32)
    return {"weight": np.clip(np.round(x / scale), -128, 127).astype(np.int8), "weight_scale": scale}


def quantize_fp8(w: np.ndarray) -> dict[str, np.ndarray]:
    scale = np.asarray(np.abs(w).max() / 448, dtype=np.float32)
    return {"weight": to_e4m3(w / scale), "weight_scale": scale}


def dequantize(fmt: str, cfg: dict, t: dict[str, np.ndarray]) -> np.ndarray:
    """The weight in the original basis, float64 (the reference of every comparison)."""
    if fmt == "float8_e4m3fn":
        return e4m3_values(t["weight"]).astype(np.float64) * np.float64(t["weight_scale"])
    if fmt == "int8_tensorwise":
        w = t["weight"].astype(np.float32) * np.asarray(t["weight_scale"], np.float32).reshape(-1, 1)
        return rotate(w, cfg.get("convrot_groupsize", 256)) if cfg.get("convrot") else w.astype(np.float64)
    return rotate(w4a8_rotated(cfg, t), cfg.get("convrot_groupsize", 256))


def w4a8_grid(cfg: dict, t: dict[str, np.ndarray]) -> np.ndarray:
    """The int8 values L = clamp(round(v * s_rel)) (float32 product, as the kernels compute it)."""
    b = t["weight"].view(np.uint8)
    n, k = b.shape[0], 2 * b.shape[1]
    codes = np.empty((n, k), dtype=np.uint8)
    codes[:, 0::2], codes[:, 1::2] = b & 15, b >> 4
    v = t["weight_codebook"][codes] if "weight_codebook" in t else codes.astype(np.float32) - 8
    g = cfg.get("group_size", 16)
    s = np.repeat(e4m3_values(t["weight_s_rel"]), g, axis=1)
    return np.clip(np.round((v * s).astype(np.float32)), -127, 127).astype(np.int8)


def w4a8_rotated(cfg: dict, t: dict[str, np.ndarray]) -> np.ndarray:
    w = w4a8_grid(cfg, t).astype(np.float32) * t["weight_s_channel"][:, None]
    if "weight_correction" in t:
        w = w + np.repeat(t["weight_correction"].T, cfg.get("group_size", 16), axis=1)
    return w


QUANTIZERS = {
    "w4a8": lambda w: ({"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256}, quantize_w4a8(w)),
    "w4a8_uniform_g32": lambda w: ({"format": "asym_w4a8_int8", "group_size": 32, "convrot_groupsize": 256},
                                   quantize_w4a8(w, group=32, codebook=False)),
    "w4a8_asym": lambda w: ({"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256},
                            quantize_w4a8(w, codebook=False, asym=True)),
    "int8_convrot": lambda w: ({"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256},
                               quantize_int8(w, convrot=True)),
    "int8": lambda w: ({"format": "int8_tensorwise"}, quantize_int8(w, convrot=False)),
    "fp8": lambda w: ({"format": "float8_e4m3fn"}, quantize_fp8(w)),
}


def is_linear(name: str, shape) -> bool:
    return len(shape) == 2 and name.endswith(("proj.weight", "mtp.fc.weight"))


def make_comfy(hf_dir: Path, out_dir: Path, scheme, *, marker: str = "tensor", quantize_head: bool = False,
               comfy_names: bool = True) -> tuple[Path, Path]:
    """Quantize the linear weights of `hf_dir` (scheme(name) -> QUANTIZERS key or None) into a
    ComfyUI checkpoint in `out_dir` (config and tokenizer copied), and write next to it the
    Hugging Face twin with the dequantized weights. Returns (comfy dir, twin dir).

    marker "tensor" writes `L.comfy_quant`, "header" the older `_quantization_metadata`.
    comfy_names stores the head as `model.lm_head.weight` and the trunk under
    `model.language_model.`."""
    tensors = read_tensors(hf_dir)
    stored: dict[str, np.ndarray] = {}
    twin: dict[str, np.ndarray] = {}
    layers: dict[str, dict] = {}
    for name, w in sorted(tensors.items()):
        kind = scheme(name) if is_linear(name, w.shape) or (quantize_head and name == "lm_head.weight") else None
        cname = name
        if comfy_names and name.startswith("model."):
            cname = "model.language_model." + name[len("model."):]
        if comfy_names and name == "lm_head.weight":
            cname = "model.lm_head.weight"
        if kind is None:
            stored[cname] = w
            twin[name] = w
            continue
        cfg, parts = QUANTIZERS[kind](w)
        layer = cname[: -len(".weight")]
        for part, v in parts.items():
            stored[f"{layer}.{part}"] = v
        layers[layer] = cfg
        twin[name] = dequantize(cfg["format"], cfg, parts).astype(np.float32)
        if marker == "tensor":
            stored[f"{layer}.comfy_quant"] = np.frombuffer(json.dumps(cfg).encode(), dtype=np.uint8).copy()
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in hf_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy(f, out_dir / f.name)
    meta = {"format": "pt"}
    if marker == "header":
        meta["_quantization_metadata"] = json.dumps({"format_version": "1.0", "layers": layers})
    save(stored, out_dir / "model.safetensors", meta)
    twin_dir = out_dir.parent / (out_dir.name + "-twin")
    twin_dir.mkdir(exist_ok=True)
    for f in hf_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy(f, twin_dir / f.name)
    save(twin, twin_dir / "model.safetensors", {"format": "pt"})
    return out_dir, twin_dir


def save(tensors: dict[str, np.ndarray], path: Path, metadata: dict[str, str]) -> None:
    from safetensors.torch import save_file

    def as_torch(v: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(v))
        return t.view(torch.float8_e4m3fn) if v.dtype == np.uint8 and v.ndim == 2 else t

    save_file({k: as_torch(v) for k, v in tensors.items()}, str(path), metadata=metadata)
