"""pyqwen-convert on quantized checkpoints: every layout, built from the same random float weights.

For each layout (tests/quant_checkpoints.py writes it with its own quantizer) the converted
GGUF must hold, tensor by tensor, exactly the dequantized weights where the format brief
promises a lossless target (Q4_0 for symmetric int4 on 32-aligned groups, Q8_0 for int8,
6-bit, asymmetric int4, AWQ), and say so in its report; elsewhere the reported error must be
the error actually measured, within the bound of the target type. The logits of pyqwen on
the converted models are checked against transformers on the dequantized weights.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import gguf
from gguf import GGMLQuantizationType as QT
from gguf_reference import expected_values
from pyqwen import Llama
from pyqwen.convert import REPORT_KEYS, ConversionError, convert
from pyqwen.convert.__main__ import main as convert_main
from quant_checkpoints import Spec, quantize_checkpoint, write_float_checkpoint
from tiny_models import make_tiny_qwen35
from upstream import upstream_llama  # noqa: F401  (session fixture)

ROOT = Path(__file__).resolve().parents[1]

# every K a multiple of 256 (K-quants), v heads of 64 columns (whole 32-blocks after the V reorder)
QCONFIG = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
               linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64)
SMALL_ROWS = ("model.layers.0.linear_attn.in_proj_a", "model.layers.0.linear_attn.in_proj_b",
              "model.layers.1.linear_attn.in_proj_a", "model.layers.1.linear_attn.in_proj_b",
              "model.layers.2.linear_attn.in_proj_a", "model.layers.2.linear_attn.in_proj_b")  # 4 rows: not N % 8

# layout -> (spec, ggml type the quantized weights must get with --outtype auto, exact?)
LAYOUTS = {
    "ct-w4a8-int": (Spec("ct-int", bits=4), QT.Q4_0, True),
    "ct-w6a8-int": (Spec("ct-int", bits=6), QT.Q8_0, True),
    "ct-w8a8-int-channel": (Spec("ct-int", bits=8, group=0), QT.Q8_0, True),
    "ct-w4a16-pack": (Spec("ct-pack", bits=4), QT.Q4_0, True),
    "ct-w6-pack-dense": (Spec("ct-pack", bits=6, dense=True), QT.Q8_0, True),
    "ct-w6-pack-word": (Spec("ct-pack", bits=6, dense=False), QT.Q8_0, True),
    "ct-w4-pack-asym": (Spec("ct-pack", bits=4, sym=False), QT.Q8_0, True),
    "ct-w4-int-asym-f16": (Spec("ct-int", bits=4, sym=False, scale_dtype=torch.float16), QT.Q8_0, True),
    "ct-w4-actorder": (Spec("ct-pack", bits=4, act_order=True), QT.Q8_0, False),
    "ct-mixed-w4-w8mlp": (Spec("ct-int", bits=4, mlp_bits=8), None, True),
    "gptq-v1-g128": (Spec("gptq", bits=4, ignore=SMALL_ROWS), QT.Q4_0, True),
    "gptq-v2-g32": (Spec("gptq", bits=4, group=32, gptq_v2=True, ignore=SMALL_ROWS), QT.Q4_0, True),
    "gptq-desc-act": (Spec("gptq", bits=4, act_order=True, ignore=SMALL_ROWS), QT.Q8_0, False),
    "gptq-8bit": (Spec("gptq", bits=8, ignore=SMALL_ROWS), QT.Q8_0, True),
    # asymmetric int8: u - z spans [-255, 255], more than a Q8_0 block holds
    "gptq-8bit-asym": (Spec("gptq", bits=8, sym=False, ignore=SMALL_ROWS), QT.Q8_0, False),
    "awq-gemm": (Spec("awq", bits=4, sym=False, ignore=SMALL_ROWS), QT.Q8_0, True),
    "fp8-block": (Spec("fp8"), QT.Q8_0, False),
}


@pytest.fixture(scope="module")
def float_model(tmp_path_factory):
    return make_tiny_qwen35(tmp_path_factory.mktemp("qfloat") / "tiny", seed=11, with_mtp=True, **QCONFIG)


_built: dict = {}


def built(float_model, tmp_path_factory, key: str):
    """(checkpoint dir, dequantized reference, auto GGUF, ConvertResult), made once per layout."""
    if key not in _built:
        spec = LAYOUTS[key][0]
        d = tmp_path_factory.mktemp(key) / "tiny"
        ref = quantize_checkpoint(float_model, d, spec, seed=5)
        res = convert(d, d.parent / "auto.gguf", outtype="auto")
        _built[key] = (d, ref, res.path, res)
    return _built[key]


def gguf_values(path) -> dict[str, tuple[np.ndarray, QT]]:
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        out[t.name] = (gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(shape), t.tensor_type)
    return out


@pytest.mark.parametrize("key", sorted(LAYOUTS))
def test_auto_is_exact_where_promised(float_model, tmp_path_factory, key):
    spec, want_type, exact = LAYOUTS[key]
    d, ref, path, res = built(float_model, tmp_path_factory, key)
    cfg = json.loads((d / "config.json").read_text())
    exp = expected_values(ref, cfg, n_mtp=1)
    got = gguf_values(path)
    reports = {r.gguf_name: r for r in res.reports}
    assert set(got) == set(exp) == set(reports)
    n_quant = 0
    for name, (values, qtype) in got.items():
        x = exp[name].astype(np.float32)
        r = reports[name]
        assert r.qtype == qtype
        if name.endswith(".ssm_a"):  # -exp: torch's float32 exp against float64, 1 ulp
            np.testing.assert_allclose(values, x, rtol=2e-7)
            continue
        err = np.abs(values.astype(np.float64) - x.astype(np.float64))
        # the report is the measured error
        assert r.max_error == pytest.approx(float(err.max()), rel=1e-5, abs=1e-30), name
        assert r.rms_error == pytest.approx(float(np.sqrt(np.mean(err ** 2))), rel=1e-3, abs=1e-30), name
        if "int" not in r.source and "fp8" not in r.source:
            assert qtype in (QT.F32, QT.BF16), name  # float tensors keep their precision (bf16 / f32 norms)
            assert r.exact, name
            continue
        n_quant += 1
        if spec.mlp_bits:  # mixed precision: int4 group -> Q4_0, int8 MLP group -> Q8_0, all exact
            want_type = QT.Q8_0 if "ffn_" in name else QT.Q4_0
            assert ("int8" in r.source) == ("ffn_" in name), (name, r.source)
        assert qtype == want_type, (name, qtype)
        if exact:
            assert r.exact and np.array_equal(values, x), (name, r.line())
        else:  # requantized to Q8_0: half a step of the block's amax/127, plus the fp16 scale
            blocks = x.reshape(-1, 32)
            tol = np.abs(blocks).max(axis=1, keepdims=True) * (0.5 / 127 + 2.0 ** -10)
            assert np.all(np.abs(values.reshape(-1, 32) - blocks) <= tol), name
            assert not r.exact
    assert n_quant >= 20

    # the GGUF metadata carries the same report
    rd = gguf.GGUFReader(path)
    names, sources, max_err, rms_err = (rd.fields[k].contents() for k in REPORT_KEYS)
    assert names == [t.name for t in rd.tensors]
    for i, n in enumerate(names):
        assert sources[i] == reports[n].source
        assert max_err[i] == pytest.approx(reports[n].max_error, rel=1e-6, abs=0)
        assert rms_err[i] == pytest.approx(reports[n].rms_error, rel=1e-6, abs=0)


def test_six_bit_packings_agree(float_model, tmp_path_factory):
    """<= 0.17 (five codes a word) and >= 0.18 (dense) packings of the same codes convert identically."""
    a = gguf_values(built(float_model, tmp_path_factory, "ct-w6-pack-dense")[2])
    b = gguf_values(built(float_model, tmp_path_factory, "ct-w6-pack-word")[2])
    c = gguf_values(built(float_model, tmp_path_factory, "ct-w6a8-int")[2])
    for name in a:
        assert np.array_equal(a[name][0], b[name][0]) and np.array_equal(a[name][0], c[name][0]), name


@pytest.mark.parametrize("outtype", ["q8_0", "q4_0", "q4_k", "q6_k", "f16", "bf16", "f32"])
def test_requantize_on_request(float_model, tmp_path_factory, outtype):
    """--outtype X: the asked type everywhere (head: Q6_K for q4_*), the error measured and reported;
    Q8_0 of int4 codes and F32 stay exact."""
    d, ref, _, _ = built(float_model, tmp_path_factory, "ct-w4a8-int")
    out = d.parent / f"{outtype}.gguf"
    res = convert(d, out, outtype=outtype)
    cfg = json.loads((d / "config.json").read_text())
    exp = expected_values(ref, cfg, n_mtp=1)
    want = {"q8_0": QT.Q8_0, "q4_0": QT.Q4_0, "q4_k": QT.Q4_K, "q6_k": QT.Q6_K, "f16": QT.F16, "bf16": QT.BF16,
            "f32": QT.F32}[outtype]
    reports = {r.gguf_name: r for r in res.reports}
    for name, (values, qtype) in gguf_values(out).items():
        x = exp[name]
        if values.ndim == 1 or name.endswith("_norm.weight") or ".ssm_conv1d." in name:
            assert qtype == QT.F32
            continue
        head = name == "output.weight"
        assert qtype == (QT.Q6_K if head and outtype in ("q4_0", "q4_k") else want), name
        err = float(np.abs(values.astype(np.float64) - x).max())
        assert reports[name].max_error == pytest.approx(err, rel=1e-5, abs=1e-30)
        amax = float(np.abs(x).max())
        bound = {QT.F32: 0, QT.F16: 2 ** -11, QT.BF16: 2 ** -8, QT.Q8_0: 1 / 127, QT.Q6_K: 1 / 16,
                 QT.Q4_0: 1 / 7, QT.Q4_K: 1 / 7}[qtype]
        assert err <= amax * bound + 1e-30, (name, err, amax)
        if "int4" in reports[name].source and qtype in (QT.Q8_0, QT.Q4_0, QT.F32):
            assert reports[name].exact, name  # int4 codes on fp16-exact scales fit these exactly


def rel_err(a, b):
    return float(np.max(np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)))


@pytest.mark.parametrize("key", ["ct-w4a8-int", "gptq-desc-act", "awq-gemm", "fp8-block"])
def test_logits_against_transformers_on_dequantized_weights(float_model, tmp_path_factory, key):
    """F32 conversion == the dequantized weights (pyqwen vs transformers, 1e-4); the auto conversion
    runs within the activation-rounding bound of its quantized types (see test_weight_types)."""
    from transformers import Qwen3_5ForCausalLM

    d, ref, auto_path, _ = built(float_model, tmp_path_factory, key)
    hf_dir = write_float_checkpoint(d, d.parent / "dequantized", ref)
    hf = Qwen3_5ForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    prompt = np.random.default_rng(3).integers(0, 900, size=24).tolist()
    with torch.no_grad():
        want = hf(torch.tensor([prompt])).logits[0].double().numpy()
    f32 = d.parent / "f32.gguf"
    assert convert_main([str(d), "-o", str(f32), "--outtype", "f32", "--quiet"]) == 0
    with Llama(f32, n_ctx=64, type_k="f32", type_v="f32") as llm:
        assert rel_err(llm.logits(prompt), want) <= 1e-4
    with Llama(auto_path, n_ctx=64, type_k="f32", type_v="f32") as llm:
        assert rel_err(llm.logits(prompt), want) <= 0.15


def test_default_model_w4a8_export_is_exact(float_model, tmp_path):
    """pyqwen/models/training/export_w4a8.py's export: llm-compressor's config, every linear (MTP
    head included) int4 and converted to Q4_0 bit-exact."""
    spec = importlib.util.spec_from_file_location("export_w4a8", ROOT / "pyqwen/models/training/export_w4a8.py")
    export = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(export)
    d = export.export_w4a8(float_model, tmp_path / "w4a8", tokenizer_dir=float_model)
    q = json.loads((d / "config.json").read_text())["quantization_config"]
    assert q["format"] == "int-quantized" and q["ignore"] == ["lm_head"]
    assert q["config_groups"]["group_0"]["input_activations"]["strategy"] == "token"
    res = convert(d, tmp_path / "w4a8.gguf", outtype="auto")
    quantized = [r for r in res.reports if "int4" in r.source]
    assert len(quantized) == 4 * 3 + 3 * 5 + 4 + 1 + 7  # MLPs, DeltaNet, attention, MTP fc + block
    assert all(r.qtype == QT.Q4_0 and r.exact for r in quantized), [r.line() for r in quantized if not r.exact]
    assert all(r.exact for r in res.reports)


def test_cli_prints_the_mapping(float_model, tmp_path_factory, capsys):
    d, *_ = built(float_model, tmp_path_factory, "gptq-desc-act")
    assert convert_main([str(d), "-o", str(d.parent / "cli.gguf")]) == 0
    err = capsys.readouterr().err
    assert "blk.0.ffn_down.weight: int4 sym g128 act-order (gptq v1) -> Q8_0, max err" in err
    assert "blk.3.attn_q.weight: int4 sym g128 act-order (gptq v1) -> Q8_0, max err" in err
    assert "token_embd.weight: BF16 -> BF16, exact" in err
    assert "bit-exact" in err


# --- bad quantized input ----------------------------------------------------------------------

def _edit_quant(d, **kv):
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"].update(kv)
    (d / "config.json").write_text(json.dumps(cfg))


def _drop(d, suffix):
    from safetensors.torch import load_file, save_file

    t = load_file(str(d / "model.safetensors"))
    victim = sorted(k for k in t if k.endswith(suffix))[0]
    del t[victim]
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    return victim


BAD = {
    "gptq-3bit": ("gptq-v1-g128", lambda d: _edit_quant(d, bits=3) or "bits=3"),
    "gptq-missing-qzeros": ("gptq-v1-g128", lambda d: _drop(d, ".qzeros")),
    "gptq-format": ("gptq-v1-g128", lambda d: _edit_quant(d, checkpoint_format="marlin") or "marlin"),
    "awq-gemv": ("awq-gemm", lambda d: _edit_quant(d, version="gemv") or "gemv"),
    "ct-nvfp4": ("ct-w4a16-pack", lambda d: _edit_quant(d, format="nvfp4-pack-quantized", config_groups={
        "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float"}, "format": "nvfp4-pack-quantized"}})
        or "nvfp4-pack-quantized"),
    "ct-no-group": ("ct-w4a8-int", lambda d: _edit_quant(d, config_groups={
        "group_0": {"targets": ["re:.*nothing.*"], "weights": {"num_bits": 4}}}) or "no quantization_config"),
    "ct-group-size": ("ct-w4a8-int", lambda d: _edit_quant(d, config_groups={
        "group_0": {"targets": ["Linear"], "format": "int-quantized",
                    "weights": {"num_bits": 4, "strategy": "group", "group_size": 64}}}) or "group_size 64"),
    "ct-missing-shape": ("ct-w4a16-pack", lambda d: _drop(d, ".weight_shape")),
    "fp8-missing-scale": ("fp8-block", lambda d: _drop(d, ".weight_scale_inv").removesuffix("_scale_inv")),
    "unknown-method": ("fp8-block", lambda d: _edit_quant(d, quant_method="bitsandbytes") or "bitsandbytes"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_quantized_input(float_model, tmp_path_factory, tmp_path, case):
    import shutil

    key, breaker = BAD[case]
    d = shutil.copytree(built(float_model, tmp_path_factory, key)[0], tmp_path / "m")
    needle = breaker(d)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ConversionError) as ei:
        convert(d, out / "x.gguf")
    assert needle in str(ei.value), str(ei.value)
    assert list(out.iterdir()) == []
    assert convert_main([str(d), "-o", str(out / "x.gguf"), "-q"]) == 1
    assert list(out.iterdir()) == []


# --- upstream llama.cpp loads what pyqwen-convert writes ------------------------------------------

@pytest.mark.parametrize("key", sorted(LAYOUTS))
def test_upstream_loads_auto_output(float_model, tmp_path_factory, upstream_llama, key):  # noqa: F811
    path = built(float_model, tmp_path_factory, key)[2]
    res = upstream_llama.run(path, [1, 2, 3, 4], n_predict=2)
    assert res.ok, res.stderr[-2000:]
    assert np.isfinite(res.logits).all()


@pytest.mark.parametrize("outtype", ["q4_0", "q4_k", "q6_k", "f16", "bf16"])
def test_upstream_loads_requantized(float_model, tmp_path_factory, upstream_llama, outtype):  # noqa: F811
    d = built(float_model, tmp_path_factory, "ct-w4a8-int")[0]
    path = convert(d, d.parent / f"up-{outtype}.gguf", outtype=outtype).path
    res = upstream_llama.run(path, [1, 2, 3, 4], n_predict=2)
    assert res.ok, res.stderr[-2000:]
