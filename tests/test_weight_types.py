"""Every weight type the runtime promises (F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K besides F32).

The reference for a quantized file is its "dequantized twin": the same model with those weights
decoded back to f32 (which test_parity already checks against transformers). The quantized
run may differ from its twin only by the activation rounding of ggml's quantized dot products
(f16, bf16 or 8-bit). A random model amplifies that rounding through its layers (4-bit weight
rounding alone moves its logits by 30-80%), so the bounds are loose but still far below what a
misread block layout produces.
"""
from __future__ import annotations


import numpy as np
import pytest

import gguf
from pyqwen import Llama
from pyqwen._cffi import ffi, lib
from pyqwen._native import NativeContext, NativeModel
from pyqwen.convert.__main__ import main as convert_main
from device import ON_GPU, TEST_NGL
from tiny_models import make_tiny_qwen35

T = gguf.GGMLQuantizationType
# bound on the relative logit error against the twin: activations are rounded to f16 / bf16 / 8 bits
# (measured on this model: 1.2e-3, 1.9e-2, 5.0e-2, 4.5e-2, 1.0e-1, 8.0e-2). On CUDA, ggml also
# accumulates F16 products in fp16 (cuBLAS COMPUTE_16F beyond 16 rows, half2 sums in mmvf): 7.7e-3
# in one 40-row pass on the H200, 0 with GGML_CUDA_CUBLAS_COMPUTE_TYPE=f32.
BOUNDS = {T.F16: 1.5e-2 if ON_GPU else 5e-3, T.BF16: 5e-2, T.Q8_0: 0.15, T.Q4_0: 0.15, T.Q4_K: 0.2, T.Q6_K: 0.15}


def quantize(w: np.ndarray, qtype: T) -> np.ndarray:
    rows, n = w.shape
    row_size = lib.pq_type_row_size(int(qtype), n)
    assert row_size > 0
    out = np.full((rows, row_size), 0xAB, dtype=np.uint8)  # poisoned
    src = np.ascontiguousarray(w, dtype=np.float32)
    assert lib.pq_quantize(int(qtype), ffi.from_buffer("float[]", src), ffi.from_buffer(out), rows, n) == out.nbytes
    return out


def dequantize(q: np.ndarray, qtype: T, shape) -> np.ndarray:
    out = np.full(shape, np.nan, dtype=np.float32)
    assert lib.pq_dequantize(int(qtype), ffi.from_buffer(q), ffi.from_buffer("float[]", out), out.size) == 0
    return out


def rewrite(src, dst, tensors: dict[str, tuple[np.ndarray, T]]) -> None:
    """Copy a GGUF, replacing some tensors' data and types."""
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch=r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), f.types[0], sub_type=sub)
    for t in r.tensors:
        data, qtype = tensors.get(t.name, (np.asarray(t.data), T.F32))
        w.add_tensor(t.name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def logits_in_passes(path, prompt: list[int], sizes: list[int]) -> np.ndarray:
    """Logits of every prompt position, fed in passes of the given sizes. On a GPU, passes of up to
    24 rows run the skinny GEMV (8 rows per launch) and longer ones the prefill path."""
    assert sum(sizes) == len(prompt)
    model = NativeModel(str(path), n_gpu_layers=TEST_NGL, n_threads=2, verbose=False)
    try:
        ctx = NativeContext(model, n_ctx=128, n_batch=64, type_k="f32", type_v="f32")
        try:
            bounds = np.cumsum([0, *sizes])
            return np.concatenate([ctx.eval(prompt[a:b], logits="all") for a, b in zip(bounds[:-1], bounds[1:])])
        finally:
            ctx.close()
    finally:
        model.close()


def is_matmul_weight(t) -> bool:
    return len(t.shape) == 2 and t.name.endswith(".weight") and "conv1d" not in t.name


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    # widths that are multiples of 256, so the K-quants (super-blocks of 256) apply everywhere
    rope = {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
            "mrope_section": [3, 3, 2], "mrope_interleaved": True}
    src = make_tiny_qwen35(tmp_path_factory.mktemp("wt-hf"), seed=3, hidden_size=256, intermediate_size=512,
                           head_dim=64, linear_key_head_dim=64, linear_value_head_dim=64, rope_parameters=rope)
    path = src.parent / "base-f32.gguf"
    assert convert_main([str(src), "-o", str(path), "--outtype", "f32", "--quiet"]) == 0
    return path


@pytest.mark.parametrize("qtype", list(BOUNDS), ids=lambda t: t.name)
def test_weight_type(base, tmp_path, qtype):
    reader = gguf.GGUFReader(base)
    quant, twin = {}, {}
    for t in reader.tensors:
        if is_matmul_weight(t):
            w = np.asarray(t.data, dtype=np.float32)
            q = quantize(w, qtype)
            quant[t.name] = (q, qtype)
            twin[t.name] = (dequantize(q, qtype, w.shape), T.F32)
    assert quant, "no weights were quantized"
    qpath, tpath = tmp_path / f"{qtype.name}.gguf", tmp_path / "twin.gguf"
    rewrite(base, qpath, quant)
    rewrite(base, tpath, twin)
    assert {t.tensor_type for t in gguf.GGUFReader(qpath).tensors if t.name in quant} == {qtype}

    prompt = np.random.default_rng(1).integers(0, 900, size=40).tolist()
    with Llama(qpath, n_ctx=128, type_k="f32", type_v="f32") as llm:
        got = llm.logits(prompt)
    with Llama(tpath, n_ctx=128, type_k="f32", type_v="f32") as llm:
        ref = llm.logits(prompt)
    with Llama(base, n_ctx=128, type_k="f32", type_v="f32") as llm:
        orig = llm.logits(prompt)
    stepped = logits_in_passes(qpath, prompt, [24, 8, 3, 1, 1, 1, 2])  # decode-sized passes
    assert np.isfinite(got).all() and np.isfinite(stepped).all()

    def rel(a, b):
        return float(np.max(np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)))
    err, err_stepped, moved = rel(got, ref), rel(stepped, ref), rel(orig, ref)
    print(f"{qtype.name}: vs dequantized twin {err:.2e} (one pass), {err_stepped:.2e} (small passes); "
          f"twin vs f32 model {moved:.2e}")
    assert err <= BOUNDS[qtype] and err_stepped <= BOUNDS[qtype]
    assert moved > 0  # the weights really were rounded
