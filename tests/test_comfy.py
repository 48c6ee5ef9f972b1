"""ComfyUI `comfy_quant` checkpoints -> GGUF, and the ggml additions they need.

The ggml side (ggml-patches/0003, 0004) against float64 numpy references:
- GGML_OP_PYQWEN_HADAMARD against the explicit Kronecker-power matrix;
- GGML_TYPE_PQ_W4A8: dequantization is bit-exact against the format's float32 decode, its CPU
  matrix product against float64 (activations are rounded to Q8_0, as for Q8_0 weights), and
  NaN scales give NaN.

The converter side, on tiny Qwen3.5 checkpoints quantized here the way comfy-kitchen does
(comfy_checkpoints.py): the stored bits reach the GGUF unchanged where promised (pq_w4a8; Q8_0
with d = fp16 of the stored scale), every tensor decodes to the reference weight, and pyqwen's
logits on the converted files match transformers on the dequantized weights.
"""
from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest
import torch

from comfy_checkpoints import (W4A8_BLOCK, dequantize, hadamard, make_comfy, rotate, w4a8_decode, w4a8_grid,
                               w4a8_rotated)
from pyqwen import Llama
from pyqwen._cffi import ffi, lib
from pyqwen.convert import ConversionError, convert
from pyqwen.convert.__main__ import main as convert_main
from device import ON_GPU
from tiny_models import make_tiny_qwen35
from upstream import upstream_llama  # noqa: F401  (the session fixture)

PQ_W4A8 = 100
# on a GPU (device.ON_GPU) the models run on CUDA, whose TF32 matmuls cost f32 parity 2e-2..7e-2
# (test_parity); pq_w4a8 weights stay 4-bit in the interleaved GEMV there (PYQWEN_GEMV=upstream: Q8_0,
# pq_w4a8_to_q8_0), the rotation stays on the CPU
F32_BOUND = 6e-2 if ON_GPU else 1e-4
Q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", (32,))])
T = gguf.GGMLQuantizationType


def err(msg=""):
    return ffi.string(lib.pq_last_error()).decode() + msg


def rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


# --------------------------------------------------------------------------------------------
# ggml: the rotation op and the type


@pytest.mark.parametrize("n", [4, 16, 64, 256, 1024])
def test_hadamard_op_matches_matrix(n):
    rng = np.random.default_rng(n)
    k = 2048 if n == 1024 else 3 * n
    x = rng.normal(0, 2, (7, k)).astype(np.float32)
    out = np.full_like(x, np.nan)
    assert lib.pq_hadamard(ffi.from_buffer("float[]", x), k, 7, n, ffi.from_buffer("float[]", out)) == 0, err()
    ref = (x.astype(np.float64).reshape(7, -1, n) @ hadamard(n)).reshape(7, k)
    assert np.isfinite(out).all()
    e = np.abs(out - ref).max() / np.abs(ref).max()
    print(f"hadamard n={n}: max error {e:.1e} of max |x·H|")
    assert e < 1e-6
    # H is its own inverse
    back = np.full_like(x, np.nan)
    assert lib.pq_hadamard(ffi.from_buffer("float[]", out), k, 7, n, ffi.from_buffer("float[]", back)) == 0
    assert np.abs(back - x).max() < 1e-5 * np.abs(x).max()


def test_hadamard_op_rejects_bad_length():
    x = np.ones((1, 96), np.float32)
    out = np.empty_like(x)
    assert lib.pq_hadamard(ffi.from_buffer("float[]", x), 96, 1, 64, ffi.from_buffer("float[]", out)) == -1
    assert lib.pq_hadamard(ffi.from_buffer("float[]", x), 96, 1, 32, ffi.from_buffer("float[]", out)) == -1


def random_blocks(rng, n_rows: int, k: int, *, nan_at=None) -> np.ndarray:
    b = np.zeros((n_rows, k // 256), dtype=W4A8_BLOCK)
    b["d"] = rng.uniform(1e-3, 3e-2, (n_rows, 1)).astype(np.float32)  # one scale per row
    finite = np.array([s for s in range(256) if (s & 0x7F) != 0x7F], dtype=np.uint8)
    b["sr"] = rng.choice(finite, size=b["sr"].shape)
    b["qs"] = rng.integers(0, 256, size=b["qs"].shape, dtype=np.uint8)
    b["cb"] = 12345  # overwritten by the codebook call
    if nan_at is not None:
        b["sr"][nan_at] = 0x7F
    return b


def attach(b: np.ndarray, codebook) -> np.ndarray:
    b = b.copy()
    cb = ffi.NULL if codebook is None else ffi.from_buffer("float[]", np.ascontiguousarray(codebook, np.float32))
    assert lib.pq_w4a8_set_codebook(ffi.from_buffer(b), b.size, cb) == 0, err()
    return b


def pq_dequantize(b: np.ndarray) -> np.ndarray:
    out = np.full((b.shape[0], b.shape[1] * 256), -1.0, dtype=np.float32)
    assert lib.pq_dequantize(PQ_W4A8, ffi.from_buffer(b), ffi.from_buffer("float[]", out), out.size) == 0, err()
    return out


def test_w4a8_type_layout():
    assert W4A8_BLOCK.itemsize == 152
    assert lib.pq_type_row_size(PQ_W4A8, 512) == 2 * 152
    assert lib.pq_type_row_size(PQ_W4A8, 100) == -1  # rows are whole 256-column blocks
    assert lib.pq_quantize(PQ_W4A8, ffi.NULL, ffi.NULL, 1, 256) == -1  # only made by the converter
    assert "no quantizer" in err()


@pytest.mark.parametrize("with_codebook", [True, False], ids=["codebook", "uniform"])
def test_w4a8_dequantize_exact(with_codebook):
    rng = np.random.default_rng(1 + with_codebook)
    codebook = np.sort(rng.normal(0, 0.6, 16)).astype(np.float32) if with_codebook else None
    b = attach(random_blocks(rng, 9, 768), codebook)
    got, ref = pq_dequantize(b), w4a8_decode(b, codebook)
    assert np.isfinite(got).all()
    assert np.array_equal(got, ref)


def test_w4a8_codebooks_are_per_tensor():
    rng = np.random.default_rng(5)
    cbs = [np.sort(rng.normal(0, 1, 16)).astype(np.float32) for _ in range(3)]
    blocks = [attach(random_blocks(rng, 2, 256), cb) for cb in cbs]
    ids = [int(b["cb"][0, 0]) for b in blocks]
    assert len(set(ids)) == 3 and 0 not in ids
    assert int(attach(blocks[0], cbs[0])["cb"][0, 0]) == ids[0]  # an equal table shares its id
    for b, cb in zip(blocks, cbs):
        assert np.array_equal(pq_dequantize(b), w4a8_decode(b, cb))


def test_w4a8_bad_codebook_and_nan_scale():
    rng = np.random.default_rng(6)
    b = random_blocks(rng, 2, 256)
    bad = np.full(16, np.inf, np.float32)
    assert lib.pq_w4a8_set_codebook(ffi.from_buffer(b), b.size, ffi.from_buffer("float[]", bad)) == -1
    b = attach(random_blocks(rng, 2, 512, nan_at=(1, 1, 3)), None)
    got = pq_dequantize(b)
    nan = np.isnan(got)
    assert nan[1, 256 + 48:256 + 64].all() and nan.sum() == 16  # exactly that scale group
    x = rng.normal(size=(3, 512)).astype(np.float32)
    out = mul_mat(PQ_W4A8, b, 2, 512, x)
    assert np.isnan(out[:, 1]).all() and np.isfinite(out[:, 0]).all()


@pytest.mark.parametrize("with_codebook", [True, False], ids=["codebook", "uniform"])
def test_w4a8_as_q8_0(with_codebook):
    """How pq_w4a8 weights are stored on a GPU outside the interleaved GEMV (whose prefill slabs get the
    same blocks): Q8_0 blocks with the same int8 grid values and the channel scale in fp16, so each
    value is the exact decode times fp16(d) / d (to float32 rounding);
    a 32-column block with a NaN scale group decodes to NaN; a part-block length is refused."""
    rng = np.random.default_rng(7 + with_codebook)
    codebook = np.sort(rng.normal(0, 0.6, 16)).astype(np.float32) if with_codebook else None
    b = attach(random_blocks(rng, 5, 512, nan_at=(3, 1, 5)), codebook)
    q8 = np.full(b.size * 8 * 34, 0xAB, dtype=np.uint8)  # poisoned: 8 Q8_0 blocks of 34 bytes per block
    assert lib.pq_w4a8_to_q8_0(ffi.from_buffer(b), ffi.from_buffer(q8), b.size * 256) == 0, err()
    got = np.full(b.size * 256, -1.0, dtype=np.float32)
    assert lib.pq_dequantize(int(T.Q8_0), ffi.from_buffer(q8), ffi.from_buffer("float[]", got), got.size) == 0, err()
    got, ref = got.reshape(5, 512), w4a8_decode(b, codebook)
    ratio = (b["d"].astype(np.float16).astype(np.float32) / b["d"])[:, 0, None]
    nan = np.zeros_like(got, dtype=bool)
    nan[3, 256 + 64:256 + 96] = True  # scale group 5 of block 1 is columns 80..95: its Q8_0 block 64..95
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_allclose(got[~nan], (ref * ratio)[~nan], rtol=1e-6, atol=0)
    assert lib.pq_w4a8_to_q8_0(ffi.from_buffer(b), ffi.from_buffer(q8), 100) == -1
    assert "whole blocks" in err()


def mul_mat(qtype, w, n_rows, k, x, hadamard_n=0) -> np.ndarray:
    out = np.full((x.shape[0], n_rows), np.nan, dtype=np.float32)
    assert lib.pq_mul_mat(int(qtype), ffi.from_buffer(w), n_rows, k, ffi.from_buffer("float[]", x), x.shape[0],
                          hadamard_n, ffi.from_buffer("float[]", out)) == 0, err()
    return out


def to_q8_0(w_grid: np.ndarray, d: np.ndarray) -> np.ndarray:
    n, k = w_grid.shape
    q = np.empty((n, k // 32), dtype=Q8_0)
    q["d"], q["qs"] = d.astype(np.float16)[:, None], w_grid.reshape(n, k // 32, 32)
    return q


@pytest.mark.parametrize("rotated", [False, True], ids=["plain", "rotated"])
def test_w4a8_mul_mat(rotated):
    """W·x on the CPU against float64; the same grid as Q8_0 gives nearly the same numbers."""
    rng = np.random.default_rng(7 + rotated)
    n, k = 67, 1024
    codebook = np.sort(rng.normal(0, 0.5, 16)).astype(np.float32)
    b = attach(random_blocks(rng, n, k), codebook)
    w = w4a8_decode(b, codebook).astype(np.float64)
    x = rng.normal(0, 1, (5, k)).astype(np.float32)
    ref = (rotate(x, 256) if rotated else x.astype(np.float64)) @ w.T
    got = mul_mat(PQ_W4A8, b, n, k, x, 256 if rotated else 0)
    assert np.isfinite(got).all()
    e = rel(got, ref)
    # the activations are rounded to Q8_0 (8 bits per 32 values): about 0.5% relative
    print(f"pq_w4a8 x{' H' if rotated else ''}: relative error {e:.2e} against float64")
    assert e < 1.5e-2
    # as Q8_0 with d = fp16(row scale) the product differs only by that rounding and the summation order
    grid = np.rint(w / b["d"][:, :1].astype(np.float64)).astype(np.int8)
    q8 = mul_mat(T.Q8_0, to_q8_0(grid, b["d"][:, 0]), n, k, x, 256 if rotated else 0)
    assert rel(q8, got) < 2e-3


# --------------------------------------------------------------------------------------------
# the converter

CFG = dict(hidden_size=256, intermediate_size=512, head_dim=64, linear_key_head_dim=64, linear_value_head_dim=64,
           rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": [3, 3, 2], "mrope_interleaved": True})


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    return make_tiny_qwen35(tmp_path_factory.mktemp("comfy-hf"), seed=11, with_mtp=True, **CFG)


def by_projection(mapping: dict[str, str]):
    """scheme: the first key contained in the tensor name picks the quantizer."""
    return lambda name: next((q for k, q in mapping.items() if k in name), None)


ALL_W4A8 = by_projection({"": "w4a8"})
MIXED = by_projection({"mlp.up_proj": "w4a8_uniform_g32", "mlp.down_proj": "int8_convrot", "self_attn.k_proj": "int8",
                       "self_attn.v_proj": "fp8", "in_proj_z": "w4a8_asym", "": "w4a8"})


@pytest.fixture(scope="module")
def comfy_w4a8(hf, tmp_path_factory):
    return make_comfy(hf, tmp_path_factory.mktemp("c") / "w4a8", ALL_W4A8, quantize_head=True)


@pytest.fixture(scope="module")
def comfy_mixed(hf, tmp_path_factory):
    return make_comfy(hf, tmp_path_factory.mktemp("c") / "mixed", MIXED, marker="header")


class Reader(gguf.GGUFReader):
    """GGUFReader that also lists tensors of the pyqwen-only type (as raw bytes)."""

    def _build_tensors(self, start_offs, fields):
        self.raw = {}
        for f in fields:
            _, name, _, dims, qtype, offset = f.parts
            qtype, dims = int(qtype[0]), [int(d) for d in dims]
            block, size = (256, 152) if qtype == PQ_W4A8 else gguf.GGML_QUANT_SIZES[T(qtype)]
            nbytes = int(np.prod(dims)) // block * size
            start = int(start_offs + offset[0])
            self.raw[bytes(name).decode()] = (qtype, dims[::-1], np.asarray(self.data[start:start + nbytes]))
        self.tensors = []


def gguf_of(src, tmp_path, outtype, **kw):
    out = tmp_path / f"{src.name}-{outtype}.gguf"
    convert(src, out, outtype=outtype, **kw)
    return Reader(out), out


def tiled(nk: int, nv: int) -> list[int]:
    """llama.cpp's order of the V heads: grouped (k0v0 k0v1 .. k1v0 ..) -> tiled (k0v0 k1v0 ..)."""
    r = nv // nk
    return [k * r + j for j in range(r) for k in range(nk)]


def gguf_rows(name: str, cfg: dict) -> np.ndarray | None:
    """The HF row each GGUF row comes from (None: unchanged)."""
    nk, nv, dk, dv = (cfg["linear_num_key_heads"], cfg["linear_num_value_heads"], cfg["linear_key_head_dim"],
                      cfg["linear_value_head_dim"])
    heads = tiled(nk, nv)
    if name.endswith("attn_qkv.weight"):
        qk = 2 * nk * dk
        return np.concatenate([np.arange(qk), qk + np.concatenate([np.arange(h * dv, (h + 1) * dv) for h in heads])])
    if name.endswith("attn_gate.weight"):
        return np.concatenate([np.arange(h * dv, (h + 1) * dv) for h in heads])
    if name.endswith(("ssm_alpha.weight", "ssm_beta.weight")):
        return np.array(heads)
    return None


def hf_name(gguf_name: str, n_layer: int) -> str:
    blk, i, rest = gguf_name.split(".", 2)
    pre = "mtp.layers.0" if int(i) == n_layer else f"model.layers.{i}"
    table = {"attn_qkv.weight": "linear_attn.in_proj_qkv.weight", "attn_gate.weight": "linear_attn.in_proj_z.weight",
             "ssm_alpha.weight": "linear_attn.in_proj_a.weight", "ssm_beta.weight": "linear_attn.in_proj_b.weight",
             "ssm_out.weight": "linear_attn.out_proj.weight", "attn_q.weight": "self_attn.q_proj.weight",
             "attn_k.weight": "self_attn.k_proj.weight", "attn_v.weight": "self_attn.v_proj.weight",
             "attn_output.weight": "self_attn.o_proj.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
             "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
             "nextn.eh_proj.weight": "fc.weight"}
    return ("mtp." if rest == "nextn.eh_proj.weight" else pre + ".") + table[rest]


def comfy_layers(comfy_dir) -> dict[str, tuple[dict, dict[str, np.ndarray]]]:
    """HF weight name -> (comfy_quant config, stored parts), read back from the checkpoint."""
    from safetensors import safe_open

    path = comfy_dir / "model.safetensors"
    with safe_open(str(path), "pt") as f:
        header = json.loads(f.metadata().get("_quantization_metadata", '{"layers": {}}'))["layers"]
        raw = {k: f.get_tensor(k) for k in f.keys()}
    arrays = {k: (v.view(torch.uint8) if v.dtype == torch.float8_e4m3fn else v).numpy() for k, v in raw.items()}
    layers = {}
    for name in arrays:
        for suffix in (".comfy_quant", ".weight_s_rel", ".weight_scale"):
            if name.endswith(suffix):
                layer = name[: -len(suffix)]
                if layer in layers or (suffix != ".comfy_quant" and layer not in header and layer + ".comfy_quant" not in arrays):
                    continue
                cfg = header.get(layer) or json.loads(arrays[layer + ".comfy_quant"].tobytes())
                parts = {k[len(layer) + 1:]: v for k, v in arrays.items() if k.startswith(layer + ".") and not k.endswith("comfy_quant")}
                hf = layer.replace("model.language_model.", "model.").replace("model.lm_head", "lm_head") + ".weight"
                layers[hf] = (cfg, parts)
    return layers


def check_tensors(reader: Reader, comfy_dir, cfg: dict, n_layer: int, expect: dict[str, str]):
    """Every quantized weight in the GGUF: its type, its bits and its decoded values."""
    layers = comfy_layers(comfy_dir)
    seen = set()
    for gname, (qtype, shape, data) in reader.raw.items():
        if not gname.startswith(("blk.", "output.weight")) or len(shape) != 2 or "conv1d" in gname:
            continue
        hname = "lm_head.weight" if gname == "output.weight" else hf_name(gname, n_layer)
        if hname not in layers:
            continue
        fmtcfg, parts = layers[hname]
        rows = gguf_rows(gname, cfg)
        pick = (lambda a: a) if rows is None else (lambda a: a[rows])
        kind = expect[fmtcfg["format"] + ("/convrot" if fmtcfg.get("convrot") else "")
                      + ("/asym" if "weight_correction" in parts else "")]
        rotated = f"pyqwen.hadamard.{gname}" in reader.fields
        if kind == "pq_w4a8":
            assert qtype == PQ_W4A8, gname
            b = data.view(W4A8_BLOCK).reshape(shape[0], -1)
            g = fmtcfg["group_size"]
            assert np.array_equal(b["qs"].reshape(shape[0], -1), pick(parts["weight"].view(np.uint8))), gname
            assert np.array_equal(b["sr"].reshape(shape[0], -1), pick(np.repeat(parts["weight_s_rel"], g // 16, axis=1)))
            assert np.array_equal(b["d"], np.repeat(pick(parts["weight_s_channel"])[:, None], b.shape[1], 1))
            key = f"pyqwen.w4a8.codebook.{gname}"
            cb = reader.fields[key].contents() if key in reader.fields else None
            assert (cb is None) == ("weight_codebook" not in parts)
            assert cb is None or np.array_equal(np.float32(cb), parts["weight_codebook"])
            assert rotated
            got = pq_dequantize(attach(b, cb))
            assert np.array_equal(got, pick(w4a8_rotated(fmtcfg, parts))), gname
        elif kind == "q8_0_requantized":  # ggml's Q8_0 of the dequantized weight
            assert qtype == T.Q8_0 and not rotated, gname
            w = dequantize(fmtcfg["format"], fmtcfg, parts)
            got = np.empty(shape, np.float32)
            assert lib.pq_dequantize(int(T.Q8_0), ffi.from_buffer(data), ffi.from_buffer("float[]", got), got.size) == 0
            assert rel(got, pick(w)) < 1e-2, gname
        elif kind == "q8_0_rotated" or kind == "q8_0":
            assert qtype == T.Q8_0, gname
            b = data.view(Q8_0).reshape(shape[0], -1)
            if fmtcfg["format"] == "asym_w4a8_int8":
                grid, scale = w4a8_grid(fmtcfg, parts), parts["weight_s_channel"]
            else:
                grid, scale = parts["weight"], np.broadcast_to(parts["weight_scale"].reshape(-1), (parts["weight"].shape[0],))
            if not rotated and gname.endswith("ssm_out.weight"):
                grid = grid[:, np.concatenate([np.arange(h * 64, (h + 1) * 64) for h in tiled(cfg["linear_num_key_heads"], cfg["linear_num_value_heads"])])]
            assert rotated == (kind == "q8_0_rotated"), gname
            assert np.array_equal(b["qs"].reshape(shape[0], -1), pick(grid)), gname
            assert np.array_equal(b["d"], np.repeat(pick(scale.astype(np.float16))[:, None], b.shape[1], 1)), gname
        else:  # the float path: the dequantized weight, in llama.cpp's order
            assert qtype == T[kind.upper()], (gname, qtype)
            assert not rotated
            w = dequantize(fmtcfg["format"], fmtcfg, parts)
            if gname.endswith("ssm_out.weight"):
                w = w[:, np.concatenate([np.arange(h * 64, (h + 1) * 64) for h in tiled(cfg["linear_num_key_heads"], cfg["linear_num_value_heads"])])]
            got = data.view(np.float16 if kind == "f16" else np.float32).reshape(shape).astype(np.float64)
            tol = 2.0 ** -11 if kind == "f16" else 1e-6
            assert np.abs(got - pick(w)).max() <= tol * np.abs(w).max(), gname
        seen.add(fmtcfg["format"])
    return seen


def test_w4a8_auto_keeps_the_bits(comfy_w4a8, tmp_path):
    src, _ = comfy_w4a8
    reader, _ = gguf_of(src, tmp_path, "auto")
    cfg = json.loads((src / "config.json").read_text())
    assert check_tensors(reader, src, cfg, cfg["num_hidden_layers"], {"asym_w4a8_int8": "pq_w4a8"}) == {"asym_w4a8_int8"}
    types = {q for n, (q, s, _) in reader.raw.items() if n.endswith(".weight") and len(s) == 2 and "conv1d" not in n}
    assert types == {PQ_W4A8, int(T.F32)}  # token_embd (not quantized, stored f32) is the only float matrix
    assert reader.raw["output.weight"][0] == PQ_W4A8
    assert sorted(reader.fields["pyqwen.requires"].contents()) == ["hadamard", "pq_w4a8"]
    assert reader.raw["pyqwen.requires"][:2] == (int(T.I8), [1])  # the marker tensor upstream refuses
    assert reader.fields["pyqwen.hadamard.blk.0.ffn_up.weight"].contents() == 256


def test_w4a8_q8_0_is_the_rotated_grid(comfy_w4a8, tmp_path):
    src, _ = comfy_w4a8
    reader, _ = gguf_of(src, tmp_path, "q8_0")
    cfg = json.loads((src / "config.json").read_text())
    check_tensors(reader, src, cfg, cfg["num_hidden_layers"], {"asym_w4a8_int8": "q8_0_rotated"})
    assert reader.fields["pyqwen.requires"].contents() == ["hadamard"]
    assert "pyqwen.requires" in reader.raw


def test_mixed_formats_and_header_marker(comfy_mixed, tmp_path):
    src, _ = comfy_mixed
    cfg = json.loads((src / "config.json").read_text())
    reader, _ = gguf_of(src, tmp_path, "auto")
    seen = check_tensors(reader, src, cfg, cfg["num_hidden_layers"], {
        "asym_w4a8_int8": "pq_w4a8", "asym_w4a8_int8/asym": "f16", "int8_tensorwise/convrot": "q8_0_rotated",
        "int8_tensorwise": "q8_0", "float8_e4m3fn": "q8_0_requantized"})
    assert seen == {"asym_w4a8_int8", "int8_tensorwise", "float8_e4m3fn"}
    reader, _ = gguf_of(src, tmp_path, "f32")
    check_tensors(reader, src, cfg, cfg["num_hidden_layers"], {
        "asym_w4a8_int8": "f32", "asym_w4a8_int8/asym": "f32", "int8_tensorwise/convrot": "f32",
        "int8_tensorwise": "f32", "float8_e4m3fn": "f32"})
    assert "pyqwen.requires" not in reader.fields and "pyqwen.requires" not in reader.raw


def hf_logits(model_dir, tokens) -> np.ndarray:
    from transformers import Qwen3_5ForCausalLM

    m = Qwen3_5ForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return m(torch.tensor([tokens])).logits[0].double().numpy()


def pq_logits(path, tokens) -> np.ndarray:
    with Llama(path, n_ctx=128, type_k="f32", type_v="f32") as llm:
        out = llm.logits(tokens)
    assert np.isfinite(out).all()
    return out


def max_rel(a, b) -> float:
    return float(np.max(np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)))


@pytest.mark.parametrize("which", ["w4a8", "mixed"])
def test_logits_against_transformers(which, comfy_w4a8, comfy_mixed, tmp_path):
    """pyqwen on the converted files against transformers on the dequantized weights.

    f32 output: the decode and de-rotation alone, so the f32 parity bound holds. auto / q8_0:
    the weights are exactly the dequantized ones (q8_0: but for the fp16 rounding of the scales,
    and its unquantized tensors such as token_embd become Q8_0 too) and multiply rotated,
    Q8_0-rounded activations, which these random models amplify to a few percent, as for any
    Q8_0 weight against its dequantized twin (test_weight_types: 5e-2)."""
    src, twin = comfy_w4a8 if which == "w4a8" else comfy_mixed
    prompt = np.random.default_rng(2).integers(0, 900, size=40).tolist()
    ref = hf_logits(twin, prompt)
    got = {t: pq_logits(gguf_of(src, tmp_path, t)[1], prompt) for t in ("f32", "auto", "q8_0")}
    errs = {t: max_rel(g, ref) for t, g in got.items()}
    print(f"{which}: relative logit error against transformers: "
          + ", ".join(f"{t} {e:.2e}" for t, e in errs.items()))
    assert errs["f32"] < F32_BOUND
    assert errs["auto"] < 0.15 and errs["q8_0"] < 0.15


def decoded_copy(reader: Reader, out, *, keep_rotation: bool, keep_marker: bool, decode: bool = True):
    """The file with every pq_w4a8 tensor decoded to F32 (the rotated weight W·H, exactly), or kept
    as it is with its codebook (decode=False), with or without its rotation keys, and with or without
    the pyqwen.requires marker tensor."""
    w = gguf.GGUFWriter(out, arch="qwen35")
    for key, f in reader.fields.items():
        if key.startswith(("GGUF.", "general.architecture", "pyqwen.requires")) \
                or (key.startswith("pyqwen.w4a8.") and decode) \
                or (key.startswith("pyqwen.hadamard.") and not keep_rotation):
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), f.types[0], sub_type=sub)
    requires = (["hadamard"] if keep_rotation else []) + ([] if decode else ["pq_w4a8"])
    if requires:
        w.add_array("pyqwen.requires", requires)
    for name, (qtype, shape, data) in reader.raw.items():
        if name == "pyqwen.requires" and not keep_marker:
            continue
        if qtype == PQ_W4A8 and not decode:
            # codebook ids 0, as a file read by another process has them (the converter's are of
            # this process); gguf-py does not know the type: its bytes, shape and id as they are
            b = data.view(W4A8_BLOCK).copy()
            b["cb"] = 0
            w.add_tensor(name, b.view(np.int8), raw_shape=shape, raw_dtype=PQ_W4A8)
        elif qtype == PQ_W4A8:
            key = f"pyqwen.w4a8.codebook.{name}"
            b = attach(data.view(W4A8_BLOCK).reshape(shape[0], -1), reader.fields[key].contents() if key in reader.fields else None)
            w.add_tensor(name, pq_dequantize(b))
        elif qtype in (T.F32, T.F16):
            w.add_tensor(name, data.view(np.float32 if qtype == T.F32 else np.float16).reshape(shape))
        else:
            w.add_tensor(name, data.reshape(*shape[:-1], -1), raw_dtype=T(qtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_rotated_weights_in_the_graph(comfy_w4a8, tmp_path):
    """The graph's rotation of the activations, ssm_out's regrouped V heads included, at f32
    precision: the pq_w4a8 weights decoded to F32 in the Hadamard basis (with their rotation keys)
    give transformers' logits; without the keys (same weights) they are wrecked."""
    src, twin = comfy_w4a8
    reader, _ = gguf_of(src, tmp_path, "auto")
    prompt = np.random.default_rng(3).integers(0, 900, size=24).tolist()
    ref = hf_logits(twin, prompt)
    rotated = max_rel(pq_logits(decoded_copy(reader, tmp_path / "rot.gguf", keep_rotation=True, keep_marker=True),
                                prompt), ref)
    stripped = max_rel(pq_logits(decoded_copy(reader, tmp_path / "plain.gguf", keep_rotation=False, keep_marker=False),
                                 prompt), ref)
    print(f"rotated f32 weights: {rotated:.2e}; without rotation keys: {stripped:.2e}")
    assert rotated < F32_BOUND
    assert stripped > 0.5


def test_stacked_w4a8_parts_keep_their_codebooks(comfy_w4a8, tmp_path):
    """Without rotation keys, a layer's pq_w4a8 projections of one input stack into one weight at
    load (in_proj, qkv, gate+up). Each part's codebook must still reach its blocks: the logits match
    those of the same weights decoded to F32."""
    src, _ = comfy_w4a8
    reader, _ = gguf_of(src, tmp_path, "auto")
    prompt = np.random.default_rng(5).integers(0, 900, size=24).tolist()
    ref = pq_logits(decoded_copy(reader, tmp_path / "plain_f32.gguf", keep_rotation=False, keep_marker=False), prompt)
    got = pq_logits(decoded_copy(reader, tmp_path / "plain_w4a8.gguf", keep_rotation=False, keep_marker=True,
                                 decode=False), prompt)
    err = max_rel(got, ref)
    print(f"stacked pq_w4a8 against its F32 decode: relative logit error {err:.2e}")
    assert err < 0.15


def test_upstream_llama_cpp(comfy_w4a8, tmp_path, upstream_llama):  # noqa: F811
    """Upstream refuses both files that need pyqwen with its own error, without crashing: the
    pq_w4a8 one for its type, the rotated Q8_0 one (standard types only) for its pyqwen.requires
    marker tensor. Without that marker upstream loads the rotated file, ignores the rotation keys
    and computes the wrong model, while pyqwen's logits do not change."""
    src, twin = comfy_w4a8
    prompt = np.random.default_rng(4).integers(0, 900, size=12).tolist()
    res = upstream_llama.run(gguf_of(src, tmp_path, "auto")[1], prompt)
    assert not res.ok and "invalid ggml type 100" in res.stderr, res.stderr[-2000:]
    reader, marked = gguf_of(src, tmp_path, "q8_0")
    res = upstream_llama.run(marked, prompt)
    n = len(reader.raw)
    assert not res.ok and f"wrong number of tensors; expected {n}, got {n - 1}" in res.stderr, res.stderr[-2000:]

    unmarked = decoded_copy(reader, tmp_path / "unmarked.gguf", keep_rotation=True, keep_marker=False)
    res = upstream_llama.run(unmarked, prompt)
    assert res.ok, res.stderr[-2000:]
    wrong = max_rel(res.logits, hf_logits(twin, prompt))
    print(f"upstream on the rotated q8_0 file without the marker: relative logit error {wrong:.2f}")
    assert wrong > 0.5
    assert np.array_equal(pq_logits(marked, prompt), pq_logits(unmarked, prompt))


def test_comfy_names(hf, tmp_path):
    """The HF layout (plain `model.` keys, `lm_head.weight`) converts the same."""
    uniform = by_projection({"": "w4a8_uniform_g32"})
    a, _ = make_comfy(hf, tmp_path / "comfy", uniform, quantize_head=True)
    b, _ = make_comfy(hf, tmp_path / "hfnames", uniform, quantize_head=True, comfy_names=False)
    ra, _ = gguf_of(a, tmp_path, "auto")
    rb, _ = gguf_of(b, tmp_path, "auto")
    assert ra.raw.keys() == rb.raw.keys()
    for name in ra.raw:
        assert ra.raw[name][0] == rb.raw[name][0]
    assert "blk.4.nextn.eh_proj.weight" in ra.raw  # the MTP head


def _edit(src, tmp_path, fn):
    """A copy of the ComfyUI checkpoint `src` with fn applied to its tensors."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    d = tmp_path / "bad"
    shutil.copytree(src, d)
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        meta = f.metadata()
    t = load_file(str(d / "model.safetensors"))
    fn(t)
    save_file(t, str(d / "model.safetensors"), metadata=meta)
    return d


L0 = "model.language_model.layers.0.mlp.up_proj"


@pytest.mark.parametrize("breaker,match", [
    (lambda t: t.__setitem__(f"{L0}.comfy_quant", torch.frombuffer(bytearray(b'{"format": "nvfp4"}'), dtype=torch.uint8)),
     "format 'nvfp4'"),
    (lambda t: t.__setitem__(f"{L0}.comfy_quant", torch.frombuffer(bytearray(b'{"format": '), dtype=torch.uint8)),
     "not UTF-8 JSON"),
    (lambda t: t.pop(f"{L0}.weight_s_channel"), "no tensor .*up_proj.weight_s_channel"),
    (lambda t: t[f"{L0}.weight_s_rel"].view(torch.uint8).__setitem__((0, 0), 0x7F), "NaN"),
    (lambda t: t.__setitem__(f"{L0}.weight_s_rel", t[f"{L0}.weight_s_rel"][:, :-1].contiguous()), "weight_s_rel has shape"),
    (lambda t: t.pop(f"{L0}.comfy_quant"), "no comfy_quant marker"),
])
def test_bad_input(comfy_w4a8, tmp_path, breaker, match):
    d = _edit(comfy_w4a8[0], tmp_path, breaker)
    out = tmp_path / "out.gguf"
    with pytest.raises(ConversionError, match=match):
        convert(d, out, outtype="auto")
    assert not list(tmp_path.glob("out.gguf*"))


def test_report(comfy_mixed, tmp_path, capsys):
    """The per-tensor report: the kept bits are exact, the Q8_0 scales cost their fp16 rounding
    (measured against the weight in the rotated basis), the rest is requantized."""
    out = tmp_path / "m.gguf"
    assert convert_main([str(comfy_mixed[0]), "-o", str(out), "--outtype", "auto"]) == 0
    log = capsys.readouterr().err
    assert "blk.0.ffn_up.weight: comfy asym_w4a8_int8 uniform g32, stored ·H256 -> PQ_W4A8, exact" in log
    assert "blk.0.ffn_gate.weight: comfy asym_w4a8_int8 codebook g16, stored ·H256 -> PQ_W4A8, exact" in log
    assert "blk.0.ffn_down.weight: comfy int8_tensorwise, stored ·H256 -> Q8_0, max err" in log
    r = Reader(out)
    names = r.fields["pyqwen.converter.tensor_names"].contents()
    max_err = dict(zip(names, r.fields["pyqwen.converter.tensor_max_error"].contents()))
    layers = comfy_layers(comfy_mixed[0])
    for gname, hname in (("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight"),
                         ("blk.3.attn_k.weight", "model.layers.3.self_attn.k_proj.weight")):
        cfg, parts = layers[hname]
        s = parts["weight_scale"].reshape(-1)
        bound = np.max(np.abs(parts["weight"]).max(1) * np.abs(s.astype(np.float16).astype(np.float64) - s))
        assert 0 < max_err[gname] <= bound * (1 + 1e-6) + 1e-12, gname
    assert max_err["blk.0.ffn_up.weight"] == 0 and max_err["blk.0.ffn_gate.weight"] == 0
