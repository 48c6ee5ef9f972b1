import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> Path:
    """A tiny random Qwen3.5 model (with the tiny BPE vocabulary and chat template) as f32 GGUF."""
    return _tiny_f32_gguf(tmp_path_factory, "tiny")


@pytest.fixture(scope="session")
def tiny_tied_gguf(tmp_path_factory) -> Path:
    """tiny_gguf's model with tied embeddings (no output.weight: the token table is the output matrix too)."""
    return _tiny_f32_gguf(tmp_path_factory, "tiny-tied", tie_word_embeddings=True)


def _tiny_f32_gguf(tmp_path_factory, name: str, **config) -> Path:
    from pyqwen.convert.__main__ import main as convert_main
    from tiny_models import make_tiny_qwen35

    src = make_tiny_qwen35(tmp_path_factory.mktemp(f"{name}-hf"), seed=7, **config)
    out = src.parent / f"{name}-f32.gguf"
    assert convert_main([str(src), "-o", str(out), "--outtype", "f32", "--quiet"]) == 0
    return out


def pytest_configure(config):
    """Llama's default n_gpu_layers becomes device.TEST_NGL when the suite runs on a GPU."""
    from device import ON_GPU, TEST_NGL
    if not ON_GPU:
        return
    import pyqwen

    init = pyqwen.Llama.__init__

    def gpu_init(self, model_path, **kwargs):
        kwargs.setdefault("n_gpu_layers", TEST_NGL)
        init(self, model_path, **kwargs)
        assert self.info.n_gpu_layers > 0 or kwargs["n_gpu_layers"] == 0, \
            "PYQWEN_TEST_NGL is set but nothing was offloaded (CPU-only build?)"

    pyqwen.Llama.__init__ = gpu_init
