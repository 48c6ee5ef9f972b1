"""pyqwen-convert on tiny random Qwen3.5 checkpoints.

Expectations are derived here from config.json and llama.cpp's qwen35 loader
dimensions (src/models/qwen35.cpp), not from the converter's own tables; the
transforms are re-implemented with plain numpy (explicit head permutations).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import quants  # noqa: E402

from gguf_reference import expected_values, tiled_heads  # noqa: E402
from tiny_models import make_tiny_qwen35, read_tensors  # noqa: E402


import pyqwen.convert as conv  # noqa: E402
from pyqwen.convert import encode as conv_encode  # noqa: E402
from pyqwen.convert import layouts as conv_layouts  # noqa: E402
from pyqwen.convert import plan as conv_plan  # noqa: E402
from pyqwen.convert.__main__ import main as convert_main  # noqa: E402

ConversionError = conv.ConversionError
convert = conv.convert

OUTTYPES = ["f32", "f16", "bf16", "q8_0", "q4_0"]
WTYPE = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_0": QT.Q4_0}
FILE_TYPE = {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7, "q4_0": 2}


# --- fixtures ------------------------------------------------------------------

@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """Tiny checkpoints; dirs that must convert identically share a basename."""
    base = tmp_path_factory.mktemp("models")
    return {
        "mtp": make_tiny_qwen35(base / "plain" / "tiny", seed=1, with_mtp=True),
        "sharded": make_tiny_qwen35(base / "sharded" / "tiny", seed=1, with_mtp=True, max_shard_size=20_000),
        "condgen": make_tiny_qwen35(base / "condgen" / "tiny", seed=1, with_mtp=True,
                                    layout="conditional_generation"),
        "tied": make_tiny_qwen35(base / "tied", seed=2, tie_word_embeddings=True),
        "bf16": make_tiny_qwen35(base / "bf16", seed=3, with_mtp=True, dtype="bfloat16"),
        "ff80": make_tiny_qwen35(base / "ff80", seed=4, intermediate_size=80),
    }


_cache: dict = {}


def converted(models, tmp_path_factory, key: str, outtype: str, **kw) -> Path:
    ck = (key, outtype, tuple(sorted(kw.items())))
    if ck not in _cache:
        out = tmp_path_factory.mktemp("out") / f"{key}-{outtype}.gguf"
        res = convert(models[key], out, outtype=outtype, **kw)
        assert res.path == out and out.is_file()
        _cache[ck] = (out, res)
    return _cache[ck][0]


def cfg_of(model_dir: Path) -> dict:
    cfg = json.loads((model_dir / "config.json").read_text())
    return {**cfg, **cfg.get("text_config", {})}


def reader_tensors(path: Path) -> dict:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def field(r, key):
    f = r.fields[key]
    return f.contents()


# --- independent expectations ----------------------------------------------------

def expected_layout(cfg: dict, outtype: str, *, n_mtp: int, tied: bool) -> dict[str, tuple[tuple[int, ...], QT]]:
    """GGUF name -> (ne, ggml type), with llama.cpp qwen35 loader dims."""
    H, V, FF = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    hd, nh, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    key_dim, value_dim = dk * nk, dv * nv
    conv_dim = 2 * key_dim + value_dim
    w = WTYPE[outtype]
    head = QT.Q8_0 if outtype == "q4_0" else w

    def wt(ne0, t=None):
        t = t or w
        return t if ne0 % gguf.GGML_QUANT_SIZES[t][0] == 0 else QT.F16

    e = {"token_embd.weight": ((H, V), wt(H, head if tied else w)), "output_norm.weight": ((H,), QT.F32)}
    if not tied:
        e["output.weight"] = ((H, V), wt(H, head))

    def common(i):
        e[f"blk.{i}.attn_norm.weight"] = ((H,), QT.F32)
        e[f"blk.{i}.post_attention_norm.weight"] = ((H,), QT.F32)
        e[f"blk.{i}.ffn_gate.weight"] = ((H, FF), wt(H))
        e[f"blk.{i}.ffn_up.weight"] = ((H, FF), wt(H))
        e[f"blk.{i}.ffn_down.weight"] = ((FF, H), wt(FF))

    def full(i):
        e[f"blk.{i}.attn_q.weight"] = ((H, hd * nh * 2), wt(H))
        e[f"blk.{i}.attn_k.weight"] = ((H, hd * nkv), wt(H))
        e[f"blk.{i}.attn_v.weight"] = ((H, hd * nkv), wt(H))
        e[f"blk.{i}.attn_output.weight"] = ((hd * nh, H), wt(hd * nh))
        e[f"blk.{i}.attn_q_norm.weight"] = ((hd,), QT.F32)
        e[f"blk.{i}.attn_k_norm.weight"] = ((hd,), QT.F32)

    for i, lt in enumerate(cfg["layer_types"]):
        common(i)
        if lt == "full_attention":
            full(i)
        else:
            e[f"blk.{i}.attn_qkv.weight"] = ((H, conv_dim), wt(H))
            e[f"blk.{i}.attn_gate.weight"] = ((H, value_dim), wt(H))
            e[f"blk.{i}.ssm_conv1d.weight"] = ((K, conv_dim), QT.F32)
            e[f"blk.{i}.ssm_dt.bias"] = ((nv,), QT.F32)
            e[f"blk.{i}.ssm_a"] = ((nv,), QT.F32)
            e[f"blk.{i}.ssm_beta.weight"] = ((H, nv), wt(H))
            e[f"blk.{i}.ssm_alpha.weight"] = ((H, nv), wt(H))
            e[f"blk.{i}.ssm_norm.weight"] = ((dv,), QT.F32)
            e[f"blk.{i}.ssm_out.weight"] = ((value_dim, H), wt(value_dim))
    n = len(cfg["layer_types"])
    for j in range(n_mtp):
        common(n + j)
        full(n + j)
    if n_mtp:
        e[f"blk.{n}.nextn.eh_proj.weight"] = ((2 * H, H), wt(2 * H))
        e[f"blk.{n}.nextn.enorm.weight"] = ((H,), QT.F32)
        e[f"blk.{n}.nextn.hnorm.weight"] = ((H,), QT.F32)
        e[f"blk.{n}.nextn.shared_head_norm.weight"] = ((H,), QT.F32)
    return e


# --- layout and metadata -------------------------------------------------------------

@pytest.mark.parametrize("outtype", OUTTYPES)
def test_layout_and_metadata(models, tmp_path_factory, outtype):
    out = converted(models, tmp_path_factory, "mtp", outtype)
    cfg = cfg_of(models["mtp"])
    r = gguf.GGUFReader(out)
    got = {t.name: (tuple(int(d) for d in t.shape), t.tensor_type) for t in r.tensors}
    assert got == expected_layout(cfg, outtype, n_mtp=1, tied=False)

    n = cfg["num_hidden_layers"]
    rope = cfg["rope_parameters"]
    want = {
        "general.architecture": "qwen35",
        "general.type": "model",
        "general.name": "Tiny",
        "general.file_type": FILE_TYPE[outtype],
        "general.quantization_version": 2,
        "qwen35.block_count": n + 1,
        "qwen35.nextn_predict_layers": 1,
        "qwen35.context_length": cfg["max_position_embeddings"],
        "qwen35.embedding_length": cfg["hidden_size"],
        "qwen35.feed_forward_length": cfg["intermediate_size"],
        "qwen35.attention.head_count": cfg["num_attention_heads"],
        "qwen35.attention.head_count_kv": cfg["num_key_value_heads"],
        "qwen35.attention.key_length": cfg["head_dim"],
        "qwen35.attention.value_length": cfg["head_dim"],
        "qwen35.rope.dimension_sections": rope["mrope_section"] + [0],
        "qwen35.rope.dimension_count": int(cfg["head_dim"] * rope["partial_rotary_factor"]),
        "qwen35.full_attention_interval": 4,
        "qwen35.ssm.conv_kernel": cfg["linear_conv_kernel_dim"],
        "qwen35.ssm.state_size": cfg["linear_key_head_dim"],
        "qwen35.ssm.group_count": cfg["linear_num_key_heads"],
        "qwen35.ssm.time_step_rank": cfg["linear_num_value_heads"],
        "qwen35.ssm.inner_size": cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"],
        "qwen35.attention.recurrent_layers": [t == "linear_attention" for t in cfg["layer_types"]] + [False],
        conv.VERSION_KEY: conv.CONVERTER_VERSION,
    }
    for k, v in want.items():
        assert field(r, k) == v, k
    assert field(r, "qwen35.rope.freq_base") == pytest.approx(rope["rope_theta"])
    assert np.float32(field(r, "qwen35.attention.layer_norm_rms_epsilon")) == np.float32(cfg["rms_norm_eps"])
    tok_cfg = json.loads((models["mtp"] / "tokenizer_config.json").read_text())
    assert field(r, "tokenizer.chat_template") == tok_cfg["chat_template"]
    assert len(field(r, "tokenizer.ggml.tokens")) == cfg["vocab_size"]
    assert field(r, "tokenizer.ggml.eos_token_id") == cfg["eos_token_id"]
    # the KV types llama.cpp reads
    assert r.fields["qwen35.block_count"].types == [gguf.GGUFValueType.UINT32]
    assert r.fields["qwen35.attention.recurrent_layers"].types == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.BOOL]
    assert r.fields["qwen35.rope.dimension_sections"].types == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32]


def test_f32_values_match_transformed_source(models, tmp_path_factory):
    out = converted(models, tmp_path_factory, "mtp", "f32")
    cfg = cfg_of(models["mtp"])
    exp = expected_values(read_tensors(models["mtp"]), cfg, n_mtp=1)
    got = reader_tensors(out)
    assert set(got) == set(exp)
    for name, t in got.items():
        a = np.asarray(t.data)
        if name.endswith(".ssm_a"):
            # llama.cpp uses torch's float32 exp: allow 1 ulp against float64
            np.testing.assert_allclose(a, exp[name], rtol=2e-7, err_msg=name)
        else:
            np.testing.assert_array_equal(a, exp[name].astype(np.float32), err_msg=name)


def test_transforms_explicitly(models, tmp_path_factory):
    """Spot checks, written out by hand: V reorder, +1 norms, plain ssm_norm, squeezed conv."""
    out = converted(models, tmp_path_factory, "mtp", "f32")
    src = read_tensors(models["mtp"])
    got = {k: np.asarray(t.data) for k, t in reader_tensors(out).items()}
    # nk=2, nv=4: grouped [k0v0 k0v1 k1v0 k1v1] -> tiled [k0v0 k1v0 k0v1 k1v1] = heads 0, 2, 1, 3
    assert tiled_heads(2, 4) == [0, 2, 1, 3]
    a_log = src["model.layers.1.linear_attn.A_log"]
    np.testing.assert_allclose(got["blk.1.ssm_a"], -np.exp(a_log[[0, 2, 1, 3]]), rtol=2e-7)
    np.testing.assert_array_equal(got["blk.1.ssm_dt.bias"], src["model.layers.1.linear_attn.dt_bias"][[0, 2, 1, 3]])
    z = src["model.layers.0.linear_attn.in_proj_z.weight"]  # 4 heads of 16 rows
    np.testing.assert_array_equal(got["blk.0.attn_gate.weight"][16:32], z[32:48])
    np.testing.assert_array_equal(got["blk.0.attn_gate.weight"][32:48], z[16:32])
    qkv = src["model.layers.0.linear_attn.in_proj_qkv.weight"]  # q 32 | k 32 | v 64 rows
    np.testing.assert_array_equal(got["blk.0.attn_qkv.weight"][:64], qkv[:64])
    np.testing.assert_array_equal(got["blk.0.attn_qkv.weight"][64 + 16:64 + 32], qkv[64 + 32:64 + 48])
    o = src["model.layers.2.linear_attn.out_proj.weight"]
    np.testing.assert_array_equal(got["blk.2.ssm_out.weight"][:, 16:32], o[:, 32:48])
    conv1d = src["model.layers.0.linear_attn.conv1d.weight"]  # [128, 1, 4]
    assert got["blk.0.ssm_conv1d.weight"].shape == (128, 4)
    np.testing.assert_array_equal(got["blk.0.ssm_conv1d.weight"][:64], conv1d[:64, 0])
    np.testing.assert_array_equal(got["blk.0.ssm_conv1d.weight"][64 + 16:64 + 32], conv1d[64 + 32:64 + 48, 0])
    norm = src["model.layers.3.input_layernorm.weight"]
    assert np.abs(norm).max() > 0.05  # randomized, not the zero init
    np.testing.assert_array_equal(got["blk.3.attn_norm.weight"], norm + np.float32(1))
    np.testing.assert_array_equal(got["blk.3.attn_q_norm.weight"], src["model.layers.3.self_attn.q_norm.weight"] + 1)
    np.testing.assert_array_equal(got["blk.0.ssm_norm.weight"], src["model.layers.0.linear_attn.norm.weight"])
    np.testing.assert_array_equal(got["blk.3.attn_q.weight"], src["model.layers.3.self_attn.q_proj.weight"])


def test_ssm_a_without_torch(models, tmp_path, monkeypatch):
    """Without torch, ssm_a = -exp(A_log) comes from numpy (correctly rounded): within 1 ulp."""
    a_log = read_tensors(models["mtp"])["model.layers.0.linear_attn.A_log"]
    monkeypatch.setitem(sys.modules, "torch", None)
    res = convert(models["mtp"], tmp_path / "o.gguf", outtype="f32")
    got = np.asarray(reader_tensors(res.path)["blk.0.ssm_a"].data)
    np.testing.assert_allclose(got, -np.exp(a_log[tiled_heads(2, 4)].astype(np.float64)), rtol=1e-7)


def test_mtp_mapping(models, tmp_path_factory):
    out = converted(models, tmp_path_factory, "mtp", "f32")
    src = read_tensors(models["mtp"])
    got = {k: np.asarray(t.data) for k, t in reader_tensors(out).items()}
    np.testing.assert_array_equal(got["blk.4.nextn.eh_proj.weight"], src["mtp.fc.weight"])
    np.testing.assert_array_equal(got["blk.4.nextn.enorm.weight"], src["mtp.pre_fc_norm_embedding.weight"] + 1)
    np.testing.assert_array_equal(got["blk.4.nextn.hnorm.weight"], src["mtp.pre_fc_norm_hidden.weight"] + 1)
    np.testing.assert_array_equal(got["blk.4.nextn.shared_head_norm.weight"], src["mtp.norm.weight"] + 1)
    np.testing.assert_array_equal(got["blk.4.attn_k.weight"], src["mtp.layers.0.self_attn.k_proj.weight"])
    np.testing.assert_array_equal(got["blk.4.ffn_down.weight"], src["mtp.layers.0.mlp.down_proj.weight"])

    no = converted(models, tmp_path_factory, "mtp", "f32", mtp=False)
    r = gguf.GGUFReader(no)
    assert field(r, "qwen35.block_count") == 4
    assert "qwen35.nextn_predict_layers" not in r.fields
    assert field(r, "qwen35.attention.recurrent_layers") == [True, True, True, False]
    names = {t.name for t in r.tensors}
    assert not any(n.startswith("blk.4.") for n in names)
    assert names == set(expected_layout(cfg_of(models["mtp"]), "f32", n_mtp=0, tied=False))


@pytest.mark.parametrize("outtype", ["f16", "bf16", "q8_0", "q4_0"])
def test_encoded_values(models, tmp_path_factory, outtype):
    ref = {k: np.asarray(t.data) for k, t in reader_tensors(converted(models, tmp_path_factory, "mtp", "f32")).items()}
    got = reader_tensors(converted(models, tmp_path_factory, "mtp", outtype))
    for name, t in got.items():
        x = ref[name]
        data = np.asarray(t.data)
        if t.tensor_type == QT.F32:
            np.testing.assert_array_equal(data, x, err_msg=name)
            continue
        # bit-identical to gguf-py's encoder of the F32 result
        np.testing.assert_array_equal(data.view(np.uint8), np.asarray(quants.quantize(x, t.tensor_type)).view(np.uint8),
                                      err_msg=name)
        deq = quants.dequantize(data, t.tensor_type).reshape(x.shape)
        if t.tensor_type == QT.F16:
            np.testing.assert_array_equal(deq, x.astype(np.float16).astype(np.float32))
        elif t.tensor_type == QT.BF16:
            assert np.all(np.abs(deq - x) <= np.abs(x) * 2.0 ** -8), name
        else:
            blocks = x.reshape(-1, 32)
            amax = np.abs(blocks).max(axis=1, keepdims=True)
            # q8_0: half a step of amax/127; q4_0: one step of amax/8 (the top code is clipped); + f16 scale
            tol = amax * ((0.5 / 127 if t.tensor_type == QT.Q8_0 else 1 / 8) + 2.0 ** -10)
            assert np.all(np.abs(deq.reshape(-1, 32) - blocks) <= tol), name


def _ggml_quantize():
    from pyqwen._cffi import ffi, lib  # the installed package always has it: no skip

    def q(x: np.ndarray, qtype: QT) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        rows, per_row = x.shape
        dst = np.empty(lib.pq_type_row_size(int(qtype), per_row) * rows, np.uint8)
        n = lib.pq_quantize(int(qtype), ffi.from_buffer("float[]", x), ffi.from_buffer(dst), rows, per_row)
        assert n == dst.size
        return dst
    return q


@pytest.mark.parametrize("outtype", ["q8_0", "q4_0"])
def test_quantized_bit_identical_to_ggml(models, tmp_path_factory, outtype):
    q = _ggml_quantize()
    ref = {k: np.asarray(t.data) for k, t in reader_tensors(converted(models, tmp_path_factory, "mtp", "f32")).items()}
    n = 0
    for name, t in reader_tensors(converted(models, tmp_path_factory, "mtp", outtype)).items():
        if t.tensor_type in (QT.Q8_0, QT.Q4_0):
            assert np.array_equal(np.asarray(t.data).reshape(-1), q(ref[name], t.tensor_type)), name
            n += 1
    assert n > 20


def test_tied_embeddings(models, tmp_path_factory):
    cfg = cfg_of(models["tied"])
    for outtype in ("f32", "q4_0"):
        out = converted(models, tmp_path_factory, "tied", outtype)
        got = {t.name: (tuple(int(d) for d in t.shape), t.tensor_type) for t in gguf.GGUFReader(out).tensors}
        assert got == expected_layout(cfg, outtype, n_mtp=0, tied=True)
        assert "output.weight" not in got
    assert got["token_embd.weight"][1] == QT.Q8_0  # q4_0: the head (tied embedding) gets Q8_0
    r = gguf.GGUFReader(converted(models, tmp_path_factory, "tied", "f32"))
    assert "qwen35.nextn_predict_layers" not in r.fields
    emb = read_tensors(models["tied"])["model.embed_tokens.weight"]
    np.testing.assert_array_equal(np.asarray(reader_tensors(converted(models, tmp_path_factory, "tied", "f32"))
                                             ["token_embd.weight"].data), emb)


def test_tied_with_stored_lm_head_is_skipped(models, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    d = shutil.copytree(models["tied"], tmp_path / "tied")
    t = load_file(str(d / "model.safetensors"))
    t["lm_head.weight"] = torch.zeros_like(t["model.embed_tokens.weight"])
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    res = convert(d, tmp_path / "o.gguf", outtype="f32")
    assert "output.weight" not in reader_tensors(res.path)
    assert any("lm_head" in n for n in res.notes)


def test_q4_0_head_and_f16_fallback(models, tmp_path_factory):
    out = converted(models, tmp_path_factory, "mtp", "q4_0")
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(out).tensors}
    assert types["output.weight"] == QT.Q8_0 and types["token_embd.weight"] == QT.Q4_0
    cfg = cfg_of(models["ff80"])
    for outtype in ("q8_0", "q4_0"):
        out = converted(models, tmp_path_factory, "ff80", outtype)
        got = {t.name: (tuple(int(d) for d in t.shape), t.tensor_type) for t in gguf.GGUFReader(out).tensors}
        assert got == expected_layout(cfg, outtype, n_mtp=0, tied=False)
        assert got["blk.0.ffn_down.weight"] == ((80, 64), QT.F16)  # 80 % 32 != 0
        assert got["blk.0.ffn_up.weight"][1] == WTYPE[outtype]
        res = _cache[("ff80", outtype, ())][1]
        assert any("ffn_down" in n and "F16" in n for n in res.notes)


def test_sharded_equals_unsharded(models, tmp_path_factory):
    assert len(list(models["sharded"].glob("model-*.safetensors"))) > 3
    for outtype in ("f16", "q8_0"):
        a = converted(models, tmp_path_factory, "mtp", outtype)
        b = converted(models, tmp_path_factory, "sharded", outtype)
        # shards hold the tensors in sorted order, so even the byte order matches
        assert a.read_bytes() == b.read_bytes()


def test_conditional_generation_layout(models, tmp_path_factory):
    a = converted(models, tmp_path_factory, "mtp", "f32")
    b = converted(models, tmp_path_factory, "condgen", "f32")
    ta, tb = reader_tensors(a), reader_tensors(b)
    assert set(ta) == set(tb)  # visual tensors skipped
    for n in ta:
        assert np.array_equal(np.asarray(ta[n].data), np.asarray(tb[n].data)), n
    ra, rb = gguf.GGUFReader(a), gguf.GGUFReader(b)
    for k in ra.fields:
        if k.startswith(("qwen35.", "tokenizer.", "general.file_type")):
            assert ra.fields[k].contents() == rb.fields[k].contents(), k


def test_bf16_source(models, tmp_path_factory):
    d = models["bf16"]
    cfg = cfg_of(d)
    src = read_tensors(d)  # bf16 values, widened exactly
    got = reader_tensors(converted(models, tmp_path_factory, "bf16", "f32"))
    exp = expected_values(src, cfg, n_mtp=1)
    for name in ("token_embd.weight", "blk.0.attn_qkv.weight", "blk.3.attn_norm.weight", "blk.4.nextn.enorm.weight"):
        np.testing.assert_array_equal(np.asarray(got[name].data), exp[name])
    # bf16 -> bf16 is lossless for untransformed weights
    b = reader_tensors(converted(models, tmp_path_factory, "bf16", "bf16"))
    want = quants.quantize(src["model.layers.0.mlp.up_proj.weight"], QT.BF16)
    np.testing.assert_array_equal(np.asarray(b["blk.0.ffn_up.weight"].data).view(np.uint8), want.view(np.uint8))


def test_config_declares_mtp_without_tensors(models, tmp_path):
    d = shutil.copytree(models["ff80"], tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["mtp_num_hidden_layers"] = 1
    (d / "config.json").write_text(json.dumps(cfg))
    res = convert(d, tmp_path / "o.gguf", outtype="f16")
    assert res.n_mtp == 0 and any("mtp" in n for n in res.notes)
    assert field(gguf.GGUFReader(res.path), "qwen35.block_count") == cfg["num_hidden_layers"]


# --- streaming, atomic output ------------------------------------------------------------

def test_streams_one_tensor_at_a_time(models, tmp_path, monkeypatch):
    live: list[weakref.ref] = []
    loads: list[int] = []
    real = conv_layouts.read_float

    def spy(ref, rows=None):
        alive = [w for w in live if w() is not None]
        assert not alive, "a previously loaded tensor is still referenced when the next one is read"
        a = real(ref, rows)
        live.append(weakref.ref(a))
        loads.append(a.nbytes)
        return a

    monkeypatch.setattr(conv_layouts, "read_float", spy)
    res = convert(models["mtp"], tmp_path / "a.gguf", outtype="q8_0")
    sizes = [r.nbytes for r in conv.plan_model(models["mtp"], "q8_0").checkpoint.tensors.values()]
    # every tensor read exactly once, whole, and freed before the next read
    assert len(loads) == res.n_tensors == len(sizes)
    assert sorted(loads) == sorted(sizes)

    # row-chunked path (big tensors) writes the same bytes, in more, smaller reads
    live.clear()
    loads.clear()
    monkeypatch.setattr(conv_plan, "CHUNK_BYTES", 4096)
    res2 = convert(models["mtp"], tmp_path / "b.gguf", outtype="q8_0")
    assert len(loads) > res2.n_tensors and max(loads) <= max(4096, 4 * 2 * 64 * 64)
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()


def test_interrupt_leaves_no_partial_output(models, tmp_path, monkeypatch):
    out = tmp_path / "model.gguf"
    out.write_bytes(b"previous")
    calls = {"n": 0}
    real = conv_encode.quantize

    def boom(a, qtype):
        calls["n"] += 1
        if calls["n"] == 10:
            raise KeyboardInterrupt
        return real(a, qtype)

    monkeypatch.setattr(conv_encode, "quantize", boom)
    with pytest.raises(KeyboardInterrupt):
        convert(models["mtp"], out, outtype="f16")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]
    assert out.read_bytes() == b"previous"

    calls["n"] = 0
    assert convert_main([str(models["mtp"]), "-o", str(tmp_path / "cli.gguf"), "-q"]) == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]


# --- bad input ----------------------------------------------------------------------

def _copy(models, tmp_path, key="mtp") -> Path:
    return shutil.copytree(models[key], tmp_path / "src" / "m")


def _edit_config(d: Path, **kv) -> None:
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(kv)
    (d / "config.json").write_text(json.dumps(cfg))


def _rewrite(d: Path, fn) -> None:
    from safetensors.torch import load_file, save_file

    t = load_file(str(d / "model.safetensors"))
    fn(t)
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})


def _bad_missing_dir(d):
    shutil.rmtree(d)
    return str(d)


def _bad_no_config(d):
    (d / "config.json").unlink()
    return "config.json"


def _bad_arch(d):
    _edit_config(d, architectures=["LlamaForCausalLM"])
    return "LlamaForCausalLM"


def _bad_quant(d):
    _edit_config(d, quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128})
    return "gptq"


def _bad_header(d):
    p = d / "model.safetensors"
    raw = bytearray(p.read_bytes())
    raw[8:20] = b"{not json!!!"
    p.write_bytes(bytes(raw))
    return "model.safetensors"


def _bad_truncated(d):
    p = d / "model.safetensors"
    raw = p.read_bytes()
    p.write_bytes(raw[: len(raw) - 1000])
    return "model.safetensors"


def _bad_shape(d):
    import torch

    _rewrite(d, lambda t: t.__setitem__("model.layers.1.linear_attn.in_proj_z.weight", torch.zeros(60, 64)))
    return "model.layers.1.linear_attn.in_proj_z.weight' in model.safetensors has shape [60, 64], expected [64, 64]"


def _bad_missing_tensor(d):
    _rewrite(d, lambda t: t.pop("model.layers.2.mlp.up_proj.weight"))
    return "model.layers.2.mlp.up_proj.weight"


def _bad_extra_tensor(d):
    import torch

    _rewrite(d, lambda t: t.__setitem__("model.layers.0.self_attn.q_proj.weight", torch.zeros(128, 64)))
    return "model.layers.0.self_attn.q_proj.weight"


def _bad_int_tensor(d):
    import torch

    _rewrite(d, lambda t: t.__setitem__("model.norm.weight", torch.zeros(64, dtype=torch.int8)))
    return "model.norm.weight"


def _bad_no_tokenizer(d):
    (d / "tokenizer.json").unlink()
    return "tokenizer.json"


def _bad_layer_types(d):
    _edit_config(d, layer_types=["linear_attention"] * 3)
    return "layer_types"


BAD_INPUTS = [_bad_no_tokenizer, _bad_layer_types, _bad_missing_dir, _bad_no_config, _bad_arch, _bad_quant, _bad_header, _bad_truncated,
              _bad_shape, _bad_missing_tensor, _bad_extra_tensor, _bad_int_tensor]


@pytest.mark.parametrize("breaker", BAD_INPUTS, ids=lambda f: f.__name__[5:])
def test_bad_input(models, tmp_path, breaker):
    d = _copy(models, tmp_path)
    needle = breaker(d)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(ConversionError) as ei:
        convert(d, out_dir / "x.gguf", outtype="q8_0")
    assert needle in str(ei.value)
    assert list(out_dir.iterdir()) == []


def test_missing_shard(models, tmp_path):
    d = shutil.copytree(models["sharded"], tmp_path / "m")
    victim = sorted(d.glob("model-*.safetensors"))[2]
    victim.unlink()
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(ConversionError, match=victim.name):
        convert(d, out_dir / "x.gguf")
    assert list(out_dir.iterdir()) == []


# --- CLI ------------------------------------------------------------------------------

def test_cli(models, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    assert convert_main([str(models["mtp"]), "-o", str(out), "--outtype", "q8_0"]) == 0
    err = capsys.readouterr().err
    assert "wrote" in err and "B/s" in err  # tqdm bytes throughput
    assert gguf.GGUFReader(out).tensors

    assert convert_main([str(models["mtp"]), "-o", str(tmp_path / "q.gguf"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""

    rc = convert_main([str(tmp_path / "nope"), "-o", str(tmp_path / "x.gguf")])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("pyqwen-convert: error: ") and "nope" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "q.gguf"]


def test_cli_subprocess_error(models, tmp_path, capsys):
    d = _copy(models, tmp_path)
    _bad_arch(d)
    p = subprocess.run([sys.executable, "-m", "pyqwen.convert", str(d), "-o", str(tmp_path / "x.gguf")],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert p.returncode == 1
    assert p.stderr.startswith("pyqwen-convert: error: unknown architecture 'LlamaForCausalLM'")
    assert "Traceback" not in p.stderr
    for shard in d.glob("*.safetensors"):  # said before anything about the shards
        shard.unlink()
    assert convert_main([str(d), "-o", str(tmp_path / "x.gguf")]) == 1
    assert "unknown architecture 'LlamaForCausalLM'" in capsys.readouterr().err
