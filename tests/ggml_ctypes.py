"""ctypes bindings of the ggml API that pyqwen's extension exports, for the tests and benches that
run the sampler op (GGML_OP_PYQWEN_SAMPLE) as a graph of its own on a chosen backend."""

from __future__ import annotations

import ctypes

import numpy as np

GGML_TYPE_F32, GGML_TYPE_I32 = 0, 26
N_PARAMS = 8  # GGML_PYQWEN_SAMPLE_N_PARAMS: columns of the params tensor


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


_vp, _i64, _sz, _int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t, ctypes.c_int
_SIGNATURES = {
    "ggml_init": (_vp, [_InitParams]),
    "ggml_free": (None, [_vp]),
    "ggml_tensor_overhead": (_sz, []),
    "ggml_graph_overhead_custom": (_sz, [_sz, ctypes.c_bool]),
    "ggml_new_tensor_2d": (_vp, [_vp, _int, _i64, _i64]),
    "ggml_view_2d": (_vp, [_vp, _vp, _i64, _i64, _sz, _sz]),
    "ggml_pyqwen_sample": (_vp, [_vp, _vp, _vp, _vp]),
    "ggml_op_desc": (ctypes.c_char_p, [_vp]),
    "ggml_new_graph_custom": (_vp, [_vp, _sz, ctypes.c_bool]),
    "ggml_build_forward_expand": (None, [_vp, _vp]),
    "ggml_backend_cpu_init": (_vp, []),
    "ggml_backend_cpu_set_n_threads": (None, [_vp, _int]),
    "ggml_backend_alloc_ctx_tensors": (_vp, [_vp, _vp]),
    "ggml_backend_tensor_set": (None, [_vp, _vp, _sz, _sz]),
    "ggml_backend_tensor_get": (None, [_vp, _vp, _sz, _sz]),
    "ggml_backend_graph_compute": (_int, [_vp, _vp]),
    "ggml_backend_buffer_free": (None, [_vp]),
    "ggml_backend_free": (None, [_vp]),
}
_CUDA_SIGNATURES = {  # only in builds with CUDA
    "ggml_backend_cuda_get_device_count": (_int, []),
    "ggml_backend_cuda_init": (_vp, [_int]),
}


def load() -> ctypes.CDLL:
    """The extension's ggml. Raises RuntimeError when a function is not exported."""
    import pyqwen._cffi as ext

    so = ctypes.CDLL(ext.__file__)
    for name, (res, args) in {**_SIGNATURES, **_CUDA_SIGNATURES}.items():
        try:
            fn = getattr(so, name)
        except AttributeError:
            if name in _CUDA_SIGNATURES:
                continue
            raise RuntimeError(f"{name} is not exported by {ext.__file__}: the patched ggml is not in this "
                               "build, or its symbols became hidden") from None
        fn.restype, fn.argtypes = res, args
    return so


def new_backend(g: ctypes.CDLL, kind: str, n_threads: int = 1):
    """A ggml backend: "cpu" with n_threads, or "cuda" (device 0); None if there is no such device."""
    if kind == "cpu":
        be = g.ggml_backend_cpu_init()
        g.ggml_backend_cpu_set_n_threads(be, n_threads)
        return be
    if not hasattr(g, "ggml_backend_cuda_init") or g.ggml_backend_cuda_get_device_count() < 1:
        return None
    return g.ggml_backend_cuda_init(0)


class SampleGraph:
    """n_copies sampler nodes over one set of inputs, allocated on a backend. The logits are a view
    of the first n_vocab columns of a [n_vocab + pad, n_rows] tensor, so rows are strided."""

    def __init__(self, g: ctypes.CDLL, backend, n_vocab: int, n_rows: int, n_hist: int, pad: int = 0,
                 n_copies: int = 1):
        self.g, self.shape = g, (n_rows, n_vocab + pad)
        n_nodes = n_copies + 8
        mem = n_nodes * g.ggml_tensor_overhead() + g.ggml_graph_overhead_custom(n_nodes, False)
        self.ctx = g.ggml_init(_InitParams(mem, None, True))
        assert self.ctx
        self.base = g.ggml_new_tensor_2d(self.ctx, GGML_TYPE_F32, n_vocab + pad, n_rows)
        self.logits = g.ggml_view_2d(self.ctx, self.base, n_vocab, n_rows, 4 * (n_vocab + pad), 0)
        self.params = g.ggml_new_tensor_2d(self.ctx, GGML_TYPE_F32, N_PARAMS, n_rows)
        self.history = g.ggml_new_tensor_2d(self.ctx, GGML_TYPE_I32, n_hist, n_rows)
        self.outs = [g.ggml_pyqwen_sample(self.ctx, self.logits, self.params, self.history) for _ in range(n_copies)]
        self.graph = g.ggml_new_graph_custom(self.ctx, n_nodes, False)
        for out in self.outs:
            g.ggml_build_forward_expand(self.graph, out)
        self.backend = backend
        self.buf = g.ggml_backend_alloc_ctx_tensors(self.ctx, backend)
        assert self.buf

    def set(self, logits: np.ndarray, params: np.ndarray, history: np.ndarray) -> None:
        """logits [n_rows, n_vocab + pad], params [n_rows, N_PARAMS], history [n_rows, n_hist]"""
        for t, a, dtype in ((self.base, logits, np.float32), (self.params, params, np.float32),
                            (self.history, history, np.int32)):
            a = np.ascontiguousarray(a, dtype=dtype)
            self.g.ggml_backend_tensor_set(t, a.ctypes.data, 0, a.nbytes)

    def compute(self) -> None:
        assert self.g.ggml_backend_graph_compute(self.backend, self.graph) == 0

    def tokens(self, copy: int = 0) -> np.ndarray:
        out = np.empty(self.shape[0], np.int32)
        self.g.ggml_backend_tensor_get(self.outs[copy], out.ctypes.data, 0, out.nbytes)
        return out

    def read_logits(self) -> np.ndarray:
        """The logits back on the host: the copy a CPU placement of the op costs on a GPU run."""
        out = np.empty(self.shape, np.float32)
        self.g.ggml_backend_tensor_get(self.base, out.ctypes.data, 0, out.nbytes)
        return out

    def close(self) -> None:
        self.g.ggml_backend_buffer_free(self.buf)
        self.g.ggml_free(self.ctx)
