"""Bad input never crashes the process: each case is a clear Python exception, and the
interpreter (checked in a subprocess for the native paths) stays alive afterwards."""
from __future__ import annotations

import struct
import subprocess
import sys

import numpy as np
import pytest

import pyqwen
from pyqwen import ContextOverflowError, Llama, ModelLoadError


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        Llama(tmp_path / "nope.gguf")


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(ModelLoadError, match="not a file"):
        Llama(tmp_path)


def test_not_gguf(tmp_path):
    p = tmp_path / "model.safetensors"
    p.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      " * 10)
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        Llama(p)


@pytest.mark.parametrize("keep", [4, 24, 200, 0.5, 0.999])
def test_truncated_gguf(tiny_gguf, tmp_path, keep):
    data = tiny_gguf.read_bytes()
    n = int(len(data) * keep) if isinstance(keep, float) else keep
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[:n])
    with pytest.raises(ModelLoadError, match="truncated|damaged"):
        Llama(p)


def _rewrite_arch(data: bytes, arch: bytes) -> bytes:
    """Replace the value of general.architecture (a GGUF string right after its key)."""
    key = b"general.architecture"
    i = data.index(key) + len(key) + 4  # key, then the u32 value type
    n = struct.unpack_from("<Q", data, i)[0]
    return data[:i] + struct.pack("<Q", len(arch)) + arch + data[i + 8 + n:]


def test_wrong_architecture(tiny_gguf, tmp_path):
    p = tmp_path / "llama.gguf"
    p.write_bytes(_rewrite_arch(tiny_gguf.read_bytes(), b"llama"))
    with pytest.raises(ModelLoadError, match="unsupported architecture 'llama'"):
        Llama(p)


def test_context_overflow(tiny_gguf):
    with Llama(tiny_gguf, n_ctx=16) as llm:
        with pytest.raises(ContextOverflowError, match="n_ctx=16"):
            llm.logits(list(range(17)))
        with pytest.raises(ContextOverflowError):
            llm.create_completion(list(range(1, 20)), max_tokens=4)
        # still usable afterwards
        assert llm.logits([1, 2, 3]).shape == (3, llm.n_vocab())


def test_generation_stops_at_context_end(tiny_gguf):
    with Llama(tiny_gguf, n_ctx=12) as llm:
        out = llm.create_completion([5, 6, 7, 8], max_tokens=100, temperature=0.0)
        assert out["choices"][0]["finish_reason"] in ("length", "stop")
        assert out["usage"]["completion_tokens"] <= 12 - 4  # prompt + output fit in n_ctx


@pytest.mark.parametrize("bad", [-1, 10**6])
def test_out_of_range_token(tiny_gguf, bad):
    with Llama(tiny_gguf, n_ctx=64) as llm:
        with pytest.raises(ValueError, match=f"token id {bad} is out of range"):
            llm.logits([1, bad, 2])
        with pytest.raises(ValueError, match="out of range"):
            llm.detokenize([bad])
        assert np.isfinite(llm.logits([1, 2])).all()


def test_unknown_and_bad_options(tiny_gguf):
    with pytest.raises(TypeError, match="unexpected keyword"):
        Llama(tiny_gguf, n_ctxx=64)
    with pytest.raises(ValueError, match="n_ctx must be a positive integer"):
        Llama(tiny_gguf, n_ctx=0)
    with pytest.raises(ValueError, match="KV cache type"):
        Llama(tiny_gguf, type_k="q3_x")
    with Llama(tiny_gguf, n_ctx=64) as llm:
        with pytest.raises(ValueError, match="top_p"):
            llm.create_completion("hi", top_p=0.0)
        with pytest.raises(ValueError, match="temperature"):
            llm.create_completion("hi", temperature=-1.0)
        with pytest.raises(TypeError):
            llm.create_completion("hi", frobnicate=True)


@pytest.mark.parametrize("kw, match", [
    (dict(temperature=-1.0), "temperature"), (dict(top_k=-3), "top_k"), (dict(seed=-2), "seed"),
    (dict(seed=1.5), "seed"), (dict(max_tokens="8"), "max_tokens"), (dict(stop=5), "stop"),
    (dict(stop=["ok", ""]), "stop"),
])
def test_stream_options_fail_at_the_call(tiny_gguf, kw, match):
    """A stream checks its options when it is made, not at its first chunk (by then a CLI has printed the
    prompt, and a server has sent its headers)."""
    with Llama(tiny_gguf, n_ctx=64) as llm:
        with pytest.raises(ValueError, match=match):
            llm.create_completion("hi", stream=True, **kw)
        with pytest.raises(ValueError, match=match):
            llm.create_chat_completion([{"role": "user", "content": "hi"}], stream=True, **kw)
        assert llm("hi", max_tokens=2, temperature=0.0)["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("prompt, match", [([1, 10**6], "token id 1000000 is out of range"),
                                           ([1, 2.5], "token ids are integers"), ([], "empty")])
def test_prompt_ids_fail_at_the_call(tiny_gguf, prompt, match):
    with Llama(tiny_gguf, n_ctx=64) as llm:
        with pytest.raises(ValueError, match=match):
            llm.create_completion(prompt, stream=True)
        with pytest.raises(ValueError, match=match):
            llm.generate(prompt)
        with pytest.raises(ValueError, match="temperature"):
            llm.generate([1, 2], temperature=-1.0)


def test_seed_minus_one_is_random(tiny_gguf):
    """-1 is llama.cpp's "random seed": accepted where None is, and a fresh seed each time."""
    kw = dict(max_tokens=12, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    with Llama(tiny_gguf, n_ctx=64, seed=-1) as llm:
        texts = {llm("hi", seed=-1, **kw)["choices"][0]["text"] for _ in range(4)}
    assert len(texts) > 1


def test_context_size_default_and_beyond_training(tiny_gguf):
    """n_ctx None is 4096 or the training context where shorter; more than the training context warns; more than the
    host memory holds is an error that says so, before anything is allocated."""
    with Llama(tiny_gguf) as llm:
        trained = llm._model.info.n_ctx_train
        assert llm.n_ctx() == min(4096, trained)
    with pytest.warns(UserWarning, match=f"beyond the {trained} tokens the model was trained on"):
        Llama(tiny_gguf, n_ctx=trained + 256).close()
    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match="use a smaller n_ctx"):
        Llama(tiny_gguf, n_ctx=2_000_000_000)


def test_closed_llama(tiny_gguf):
    llm = Llama(tiny_gguf, n_ctx=64)
    llm.close()
    llm.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        llm.logits([1, 2])


def test_interpreter_survives_native_errors(tiny_gguf, tmp_path):
    """Run the native failure paths in a child interpreter: it must exit normally."""
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:1000])
    code = f"""
import pyqwen
for p in [{str(cut)!r}, {str(tmp_path)!r} + '/missing.gguf']:
    try:
        pyqwen.Llama(p)
    except Exception as e:
        print(type(e).__name__)
llm = pyqwen.Llama({str(tiny_gguf)!r}, n_ctx=8)
for toks in ([1] * 9, [-5], [1 << 30]):
    try:
        llm.logits(toks)
    except Exception as e:
        print(type(e).__name__)
print("alive")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ModelLoadError", "FileNotFoundError", "ContextOverflowError",
                                   "ValueError", "ValueError", "alive"]


def test_cli_errors_are_messages(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pyqwen.cli", "generate", "-m", str(tmp_path / "x.gguf"), "-p", "hi"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1
    assert "pyqwen: error: model file not found" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert pyqwen.__version__
