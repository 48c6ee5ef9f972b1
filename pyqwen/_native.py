"""Owning wrappers over the native runtime (pyqwen/csrc/pyqwen.h, through cffi).

Every failure of a native call becomes a Python exception carrying the runtime's message;
nothing here lets a ggml assert see bad input (the runtime validates before it builds graphs).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._cffi import ffi, lib

__version__ = "0.1.0"
if ffi.string(lib.pq_version()).decode() != __version__:
    raise ImportError(f"pyqwen's native module is version {ffi.string(lib.pq_version()).decode()}, "
                      f"the Python package {__version__}: reinstall pyqwen")

CACHE_TYPES = {"f32": lib.PQ_CACHE_F32, "f16": lib.PQ_CACHE_F16, "q8_0": lib.PQ_CACHE_Q8_0, "q4_0": lib.PQ_CACHE_Q4_0}


class ModelLoadError(ValueError):
    """The file is not a model pyqwen can run (not GGUF, damaged, wrong architecture, ...)."""


class ContextOverflowError(ValueError):
    """More tokens than the context (n_ctx) holds."""


def _error() -> str:
    return ffi.string(lib.pq_last_error()).decode("utf-8", "replace")


def backend_name() -> str:
    return ffi.string(lib.pq_backend_name()).decode()


@dataclass(frozen=True)
class ModelInfo:
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_mtp_layers: int
    n_params: int
    size_bytes: int
    n_gpu_layers: int


@dataclass(frozen=True)
class Timings:
    """A context's accumulated pass count, host time outside device waits, and wait time (us)."""
    n_passes: int
    host_us: int
    wait_us: int


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64

    def __post_init__(self):
        if not (self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not (0 <= self.min_p <= 1):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not (self.repeat_penalty > 0):
            raise ValueError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = whole vocabulary), got {self.top_k}")

    def to_c(self):
        return ffi.new("pq_sampling *", {
            "temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p,
            "repeat_penalty": self.repeat_penalty, "repeat_last_n": self.repeat_last_n})


class NativeModel:
    def __init__(self, path: str, *, n_gpu_layers: int, n_threads: int | None, verbose: bool):
        params = ffi.new("pq_model_params *", {
            "n_gpu_layers": n_gpu_layers, "n_threads": n_threads or 0, "verbose": int(verbose)})
        out = ffi.new("pq_model **")
        if lib.pq_model_load(path.encode(), params, out) != 0:
            raise ModelLoadError(f"cannot load {path}: {_error()}")
        self._ptr = out[0]
        info = ffi.new("pq_model_info *")
        lib.pq_model_get_info(self._ptr, info)
        self.info = ModelInfo(**{f: getattr(info, f) for f in ModelInfo.__dataclass_fields__})

    @property
    def ptr(self):
        if self._ptr is None:
            raise RuntimeError("the model is closed")
        return self._ptr

    def device_memory(self) -> tuple[int, int] | None:
        """(free, total) bytes of the GPU the model runs on; None on the CPU."""
        free, total = ffi.new("int64_t *"), ffi.new("int64_t *")
        return (free[0], total[0]) if lib.pq_model_device_memory(self.ptr, free, total) == 0 else None

    def close(self) -> None:
        if self._ptr is not None:
            lib.pq_model_free(self._ptr)
            self._ptr = None


def check_token_ids(tokens, n_vocab: int) -> np.ndarray:
    """tokens as an int64 array; ValueError for ids that are not integers or not in [0, n_vocab)."""
    ids = np.asarray(tokens)
    if ids.size and ids.dtype.kind not in "iu":
        raise ValueError(f"token ids are integers, got {ids.dtype} values")
    ids = ids.astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= n_vocab):
        bad = int(ids[(ids < 0) | (ids >= n_vocab)][0])
        raise ValueError(f"token id {bad} is out of range [0, {n_vocab})")
    return ids


class NativeContext:
    def __init__(self, model: NativeModel, *, n_ctx: int, n_batch: int, type_k: str, type_v: str):
        for name, t in (("type_k", type_k), ("type_v", type_v)):
            if t not in CACHE_TYPES:
                raise ValueError(f"{name}={t!r} is not a KV cache type; choose one of {sorted(CACHE_TYPES)}")
        params = ffi.new("pq_ctx_params *", {
            "n_ctx": n_ctx, "n_batch": n_batch, "type_k": CACHE_TYPES[type_k], "type_v": CACHE_TYPES[type_v]})
        out = ffi.new("pq_ctx **")
        if lib.pq_ctx_new(model.ptr, params, out) != 0:
            raise RuntimeError(f"cannot create the context: {_error()}")
        self._ptr = out[0]
        self.model = model
        self.n_ctx = n_ctx
        self.n_vocab = model.info.n_vocab

    @property
    def ptr(self):
        if self._ptr is None:
            raise RuntimeError("the context is closed")
        return self._ptr

    @property
    def n_past(self) -> int:
        return lib.pq_ctx_n_past(self.ptr)

    @property
    def memory_bytes(self) -> int:
        return lib.pq_ctx_memory_bytes(self.ptr)

    def reset(self) -> None:
        lib.pq_ctx_reset(self.ptr)

    def timings(self) -> Timings:
        t = ffi.new("pq_ctx_timings *")
        lib.pq_ctx_get_timings(self.ptr, t)
        return Timings(t.n_passes, t.host_us, t.wait_us)

    def _check(self, tokens) -> np.ndarray:
        """tokens as checked ids (check_token_ids) that fit in the context after what it holds."""
        ids = check_token_ids(tokens, self.n_vocab)
        if self.n_past + ids.size > self.n_ctx:
            raise ContextOverflowError(
                f"{self.n_past} tokens in the context + {ids.size} new exceed n_ctx={self.n_ctx}; "
                "use a larger n_ctx or a shorter prompt")
        return ids

    def eval(self, tokens, *, logits: str = "last") -> np.ndarray | None:
        """Feed tokens; logits='all' returns [n, n_vocab], 'last' returns [n_vocab], 'none' None."""
        shape = np.shape(tokens)
        if len(shape) != 1 or shape[0] == 0:
            raise ValueError("expected a non-empty 1-D sequence of token ids")
        toks = np.ascontiguousarray(self._check(tokens), dtype=np.int32)
        out = None
        if logits == "all":
            out = np.empty((toks.size, self.n_vocab), dtype=np.float32)
        elif logits == "last":
            out = np.empty(self.n_vocab, dtype=np.float32)
        out_ptr = ffi.from_buffer("float[]", out) if out is not None else ffi.NULL
        rc = lib.pq_ctx_eval(self.ptr, ffi.from_buffer("int32_t[]", toks), toks.size, int(logits == "all"), out_ptr)
        if rc != 0:
            raise RuntimeError(_error())
        return out

    def generate(self, token: int, n_steps: int, c_sampling, history: np.ndarray, uniforms: np.ndarray,
                 stop: np.ndarray) -> np.ndarray:
        """Feed `token`, then decode up to n_steps tokens in the runtime (one call, no Python per
        token); stops after a token in `stop`, or one token later where the pipelined CUDA decode had fed
        it already (pq_ctx_generate). c_sampling from Sampling.to_c(); uniforms: n_steps float32 draws in
        [0, 1). Returns the picked tokens; all but the last have been fed."""
        self._check(np.array([token]))
        if self.n_past + n_steps > self.n_ctx:
            raise ContextOverflowError(f"{self.n_past} tokens in the context + {n_steps} steps exceed n_ctx={self.n_ctx}")
        out = np.empty(n_steps, dtype=np.int32)
        history = np.ascontiguousarray(history, dtype=np.int32)
        uniforms = np.ascontiguousarray(uniforms, dtype=np.float32)
        stop = np.ascontiguousarray(stop, dtype=np.int32)
        n = lib.pq_ctx_generate(self.ptr, token, n_steps, c_sampling,
                                ffi.from_buffer("int32_t[]", history) if history.size else ffi.NULL, history.size,
                                ffi.from_buffer("float[]", uniforms),
                                ffi.from_buffer("int32_t[]", stop) if stop.size else ffi.NULL, stop.size,
                                ffi.from_buffer("int32_t[]", out))
        if n < 0:
            raise RuntimeError(_error())
        return out[:n]

    def close(self) -> None:
        if self._ptr is not None:
            lib.pq_ctx_free(self._ptr)
            self._ptr = None
