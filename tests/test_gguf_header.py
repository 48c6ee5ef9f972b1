"""pyqwen.gguf_header against gguf-py's reader, and on damaged files."""
import gguf
import numpy as np
import pytest

from pyqwen.gguf_header import read_header


def _plain(v):
    return v.tolist() if isinstance(v, np.ndarray) else v


def test_matches_gguf_py(tiny_gguf):
    ref = gguf.GGUFReader(tiny_gguf, "r")
    header = read_header(tiny_gguf)
    want = {k: _plain(f.contents()) for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert header.metadata.keys() == want.keys()
    for k, v in want.items():
        got = header.metadata[k]
        assert got == pytest.approx(v) if isinstance(v, float) else got == v, k
    assert list(header.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        info = header.tensors[t.name]
        assert info.shape == tuple(int(n) for n in t.shape) and info.ggml_type == int(t.tensor_type)
        assert header.data_start + info.offset == t.data_offset
    assert header.file_size == tiny_gguf.stat().st_size


def test_key_filter_skips_values(tiny_gguf):
    header = read_header(tiny_gguf, ("general.",))
    assert header.metadata and all(k.startswith("general.") for k in header.metadata)
    assert header.tensors == read_header(tiny_gguf).tensors


@pytest.mark.parametrize("cut", [3, 20, 200, 5000])
def test_truncated_header_is_a_value_error(tiny_gguf, tmp_path, cut):
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(tiny_gguf.read_bytes()[:cut])
    with pytest.raises(ValueError):
        read_header(bad)
