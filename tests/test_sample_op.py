"""The in-graph sampler GGML_OP_PYQWEN_SAMPLE (ggml-patches/) against a float64 numpy reference.

lib.pq_sample_logits runs the patched op as a one-node graph on ggml's CPU backend, so these tests
exercise the op through pyqwen's C API. Where pyqwen is built with CUDA and a GPU answers, every
such test also runs on the CUDA backend (lib.pq_sample_logits_gpu, the kernel in
ggml-patches/src/src/ggml-cuda/pyqwen-sample.cu) against the same reference; elsewhere those
cases skip, saying why. The reference below is the sampler's specification:
repetition penalty (float32, each id of the window once), ranking by logit then lowest id,
top-k, top-p and min-p on the untempered distribution, temperature, one draw with the given
uniform number (first candidate whose running tempered mass exceeds uniform * total).

Greedy picks must match exactly. A sampled pick must match unless the draw, or the top-p cut,
lies within 1e-6 of a cumulative-probability boundary, where the op's summation order may
legitimately round the other way; such draws are counted and must stay rare.

NaN logits: never chosen (they rank below -inf); a row with only NaN is an error
("every logit is NaN") and leaves the output untouched. If the best logit is +-inf, the row is
decided greedily (lowest id among the best).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ggml_ctypes
import numpy as np
import pytest

from pyqwen._cffi import ffi, lib

POISON = -123456789
BOUNDARY = 1e-6


# --------------------------------------------------------------------------------------------
# reference


@dataclass
class Ref:
    greedy: int | None = None       # set when the row is decided without a draw
    ids: np.ndarray | None = None   # kept candidates, in rank order
    cum: np.ndarray | None = None   # running tempered mass over ids
    cut_ambiguous: bool = False     # top-p / min-p cut within rounding distance of a boundary

    def pick(self, u: float) -> tuple[int, bool]:
        """(token, ambiguous) for the uniform number u (a float32 value)."""
        if self.greedy is not None:
            return self.greedy, False
        total = self.cum[-1]
        target = float(u) * total
        i = int(np.searchsorted(self.cum, target, side="right"))  # first cum > target
        i = min(i, len(self.ids) - 1)
        # the last running mass is the total itself, which target (< total) never reaches
        near = np.abs(self.cum[:-1] - target) < BOUNDARY * total
        return int(self.ids[i]), bool(near.any() or self.cut_ambiguous)


def penalty_window(history: np.ndarray, cfg: dict) -> np.ndarray:
    last_n = cfg.get("repeat_last_n", 0)
    if cfg.get("repeat_penalty", 1.0) == 1.0 or history.size == 0:
        return history[:0]
    if 0 < last_n < history.size:
        return history[-last_n:]
    return history


def reference(logits: np.ndarray, cfg: dict, history: np.ndarray) -> Ref | None:
    """None when every logit is NaN."""
    f32 = np.float32
    n = logits.size
    temp, top_p, min_p, pen = (f32(cfg.get(k, d)) for k, d in
                               (("temperature", 0.0), ("top_p", 1.0), ("min_p", 0.0), ("repeat_penalty", 1.0)))
    top_k = int(cfg.get("top_k", 0))

    l = logits.astype(f32).copy()
    window = penalty_window(history, cfg)
    if pen != f32(1.0) and window.size:
        ids = np.unique(window[(window >= 0) & (window < n)])
        v = l[ids]
        l[ids] = np.where(v > 0, v / pen, v * pen).astype(f32)
    nan = np.isnan(l)
    if nan.all():
        return None
    l64 = np.where(nan, -np.inf, l.astype(np.float64))
    order = np.lexsort((np.arange(n), nan, -l64))       # logit desc, non-NaN first, id asc
    best = int(order[0])
    if not temp > 0 or not math.isfinite(l64[best]):
        return Ref(greedy=best)

    k = top_k if 0 < top_k < n else n
    cand = order[:k]
    lc = l64[cand]
    lmax = lc[0]
    p = np.exp(lc - lmax)
    total = p.sum()
    keep = k
    ambiguous = False
    if top_p < 1:
        acc = np.cumsum(p / total)
        hit = np.nonzero(acc >= np.float64(top_p))[0]
        if hit.size:
            keep = int(hit[0]) + 1
        ambiguous |= bool((np.abs(acc - np.float64(top_p)) < BOUNDARY).any())
    if min_p > 0:
        floor = np.float64(min_p)
        passing = p[1:keep] >= floor
        keep = 1 + (int(np.argmin(passing)) if (~passing).any() else keep - 1)
        ambiguous |= bool((np.abs(p - floor) < 1e-12).any())
    ids = cand[:keep]
    w = np.exp((lc[:keep] - lmax) / np.float64(temp))
    return Ref(ids=ids, cum=np.cumsum(w), cut_ambiguous=ambiguous)


# --------------------------------------------------------------------------------------------
# calling the op


def sampling(cfg: dict):
    s = ffi.new("pq_sampling *")
    s.temperature = cfg.get("temperature", 0.0)
    s.top_k = cfg.get("top_k", 0)
    s.top_p = cfg.get("top_p", 1.0)
    s.min_p = cfg.get("min_p", 0.0)
    s.repeat_penalty = cfg.get("repeat_penalty", 1.0)
    s.repeat_last_n = cfg.get("repeat_last_n", 0)
    return s


class Sampler:
    """One row of logits + history bound to the C call (CPU or CUDA backend), reused over many
    uniform numbers."""

    def __init__(self, logits: np.ndarray, cfg: dict, history: np.ndarray, gpu: bool = False):
        self.logits = np.ascontiguousarray(logits, dtype=np.float32)
        self.history = np.ascontiguousarray(history, dtype=np.int32)
        self.s = sampling(cfg)
        self.out = ffi.new("int32_t *")
        self.lp = ffi.from_buffer("float[]", self.logits)
        self.hp = ffi.from_buffer("int32_t[]", self.history) if self.history.size else ffi.NULL
        self.fn = lib.pq_sample_logits_gpu if gpu else lib.pq_sample_logits

    def __call__(self, u: float) -> tuple[int, int]:
        self.out[0] = POISON
        rc = self.fn(self.lp, self.logits.size, self.s, self.hp, self.history.size, u, self.out)
        return rc, self.out[0]


def last_error() -> str:
    return ffi.string(lib.pq_last_error()).decode()


def cuda_unavailable() -> str | None:
    """Why the CUDA cases cannot run here (the C entry says), or None when they can."""
    rc, _ = Sampler(np.array([0.0, 1.0], np.float32), {}, np.zeros(0, np.int32), gpu=True)(0.5)
    return last_error() if rc else None


NO_CUDA = cuda_unavailable()
needs_cuda = pytest.mark.skipif(NO_CUDA is not None, reason=f"CUDA sampler: {NO_CUDA}")
BACKENDS = [pytest.param(False, id="cpu"), pytest.param(True, id="cuda", marks=needs_cuda)]  # Sampler's `gpu`


def check_draws(logits: np.ndarray, cfg: dict, history: np.ndarray, gpu: bool, us: np.ndarray) -> tuple[int, int]:
    """Draws with each uniform of us match the reference, except ambiguous ones: (compared, skipped)."""
    ref = reference(logits, cfg, history)
    call = Sampler(logits, cfg, history, gpu)
    compared = skipped = 0
    for u in us:
        want, ambiguous = ref.pick(u)
        rc, got = call(float(u))
        assert rc == 0, last_error()
        assert 0 <= got < logits.size
        if ambiguous:
            skipped += 1
            continue
        compared += 1
        assert got == want, (float(u), cfg)
    return compared, skipped


def random_history(rng, n_vocab: int, size: int) -> np.ndarray:
    """Token ids with repeats, empty slots (-1) and out-of-range ids mixed in."""
    h = rng.integers(0, n_vocab, size=size).astype(np.int32)
    if size:
        h[rng.random(size) < 0.2] = h[0]
        h[rng.random(size) < 0.1] = -1
        h[rng.random(size) < 0.05] = n_vocab + 3
    return h


def uniforms(rng, n: int) -> np.ndarray:
    u = rng.random(n, dtype=np.float32)
    u[:2] = [0.0, np.nextafter(np.float32(1), np.float32(0))]
    return u


# --------------------------------------------------------------------------------------------
# tests

VOCABS = [1, 2, 7, 1000, 32000, 248320]


@pytest.mark.parametrize("gpu", BACKENDS)
@pytest.mark.parametrize("n_vocab", VOCABS)
def test_greedy_exact(n_vocab, gpu):
    rng = np.random.default_rng(1000 + n_vocab)
    rows = 40 if n_vocab < 100_000 else 12
    for r in range(rows):
        logits = (rng.standard_normal(n_vocab) * 3).astype(np.float32)
        if r % 3 == 1:
            logits = np.round(logits * 2) / 2          # many ties: lowest id must win
        if r % 4 == 2:
            logits[rng.integers(0, n_vocab)] = logits.max()
        cfg = {"temperature": [0.0, -1.0][r % 2], "top_k": 5, "top_p": 0.5, "min_p": 0.1}
        if r % 2:
            cfg.update(repeat_penalty=[1.3, 0.8][r % 4 // 2], repeat_last_n=[0, 16][r % 3 == 0])
        history = random_history(rng, n_vocab, 64)
        want = reference(logits, cfg, history).greedy
        rc, got = Sampler(logits, cfg, history, gpu)(0.5)
        assert rc == 0, last_error()
        assert got == want, (r, cfg)
        if cfg.get("repeat_penalty", 1.0) == 1.0:
            assert got == int(np.argmax(logits))   # numpy's argmax: first of the maxima


CONFIGS = [
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 40},
    {"temperature": 1.0, "top_p": 0.9},
    {"temperature": 1.3, "min_p": 0.05},
    {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.1, "repeat_last_n": 64},
    {"temperature": 0.6, "top_p": 0.8, "repeat_penalty": 1.5},
    {"temperature": 2.0, "top_k": 3000, "min_p": 0.3, "repeat_penalty": 0.9, "repeat_last_n": 8},
    {"temperature": 1.0, "top_k": 1},
    {"temperature": 1.0, "min_p": 1.5},        # only the best survives
    {"temperature": 1.0, "top_k": 2000, "top_p": 0.9},   # CUDA: top-k beyond the kernel's shortlist
    {"temperature": 0.9, "top_p": 0.8, "min_p": 0.02},   # CUDA: min-p shortlist, top-p total over the row
]


@pytest.mark.parametrize("gpu", BACKENDS)
@pytest.mark.parametrize("n_vocab", [7, 1000, 32000, 248320])
@pytest.mark.parametrize("ci", range(len(CONFIGS)))
def test_sampling_matches_reference(n_vocab, ci, gpu):
    cfg = CONFIGS[ci]
    rng = np.random.default_rng(7919 * ci + n_vocab)
    big = n_vocab > 100_000
    rows, draws = (2, 60) if big else (4, 100)
    compared = skipped = 0
    for r in range(rows):
        # large vocabularies get peaked logits, as a language model's are; flat rows of 248k
        # candidates would put nearly every draw within 1e-6 of a boundary
        scale = [[1.0, 3.0], [3.0, 5.0], [4.0, 6.0]][(n_vocab > 5000) + big][r % 2]
        logits = (rng.standard_normal(n_vocab) * scale).astype(np.float32)
        if r == 1:
            logits = (np.round(logits * 4) / 4).astype(np.float32)   # ties in the ranking
        history = random_history(rng, n_vocab, 100)
        c, s = check_draws(logits, cfg, history, gpu, uniforms(rng, draws))
        compared, skipped = compared + c, skipped + s
    assert skipped <= 0.05 * (compared + skipped), (compared, skipped)


@pytest.mark.parametrize("gpu", BACKENDS)
def test_many_ties_at_the_cut(gpu):
    """Thousands of candidates tie where top-k, top-p or min-p cut (more than the CUDA kernel's
    shortlist of 2048 holds): lower ids rank first, as in the reference."""
    rng = np.random.default_rng(11)
    logits = rng.integers(0, 4, 32000).astype(np.float32)
    history = random_history(rng, logits.size, 100)
    compared = skipped = 0
    for cfg in [{"temperature": 1.0, "top_k": 40}, {"temperature": 0.7, "top_k": 5000, "top_p": 0.4321},
                {"temperature": 1.5, "min_p": 0.5, "repeat_penalty": 1.2}, {"temperature": 1.0, "top_p": 0.3}]:
        c, s = check_draws(logits, cfg, history, gpu, uniforms(rng, 100))
        compared, skipped = compared + c, skipped + s
    assert skipped <= 0.05 * (compared + skipped), (compared, skipped)


@pytest.mark.parametrize("gpu", BACKENDS)
def test_uniform_outside_unit_interval(gpu):
    """A uniform number below 0 draws the best candidate; 1 or more (or NaN) the last candidate
    that can be drawn at all, not one whose tempered weight underflows to 0."""
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal(5000) * 3).astype(np.float32)
    for cfg in [{"temperature": 0.004, "top_k": 40}, {"temperature": 0.01}, {"temperature": 0.02, "min_p": 1e-30}]:
        ref = reference(logits, cfg, np.zeros(0, np.int32))
        lr = logits[ref.ids].astype(np.float64)
        weights = np.exp((lr - lr[0]) / np.float64(np.float32(cfg["temperature"])))
        last = int(ref.ids[np.nonzero(weights)[0][-1]])
        assert last != ref.ids[-1]                          # the tail's weights underflow
        call = Sampler(logits, cfg, np.zeros(0, np.int32), gpu)
        for u, want in [(-0.5, int(ref.ids[0])), (1.0, last), (7.0, last), (float("nan"), last)]:
            assert call(u) == (0, want), (cfg, u)


@pytest.mark.parametrize("gpu", BACKENDS)
def test_draw_follows_the_distribution(gpu):
    """Many draws on a small vocabulary: frequencies follow the tempered, truncated distribution."""
    rng = np.random.default_rng(5)
    logits = rng.standard_normal(50).astype(np.float32)
    cfg = {"temperature": 0.9, "top_k": 20, "top_p": 0.9}
    ref = reference(logits, cfg, np.zeros(0, np.int32))
    call = Sampler(logits, cfg, np.zeros(0, np.int32), gpu)
    counts = np.zeros(50)
    n = 4000
    for u in rng.random(n, dtype=np.float32):
        rc, got = call(float(u))
        assert rc == 0
        counts[got] += 1
    prob = np.zeros(50)
    prob[ref.ids] = np.diff(np.concatenate([[0.0], ref.cum])) / ref.cum[-1]
    assert counts[prob == 0].sum() == 0
    assert np.abs(counts / n - prob).max() < 0.03


@pytest.mark.parametrize("gpu", BACKENDS)
def test_output_is_written_and_errors_leave_it(gpu):
    logits = np.array([0.0, 2.0, 1.0], np.float32)
    rc, got = Sampler(logits, {}, np.zeros(0, np.int32), gpu)(0.3)
    assert (rc, got) == (0, 1)
    nan_row = np.full(5, np.nan, np.float32)
    rc, got = Sampler(nan_row, {"temperature": 1.0}, np.zeros(0, np.int32), gpu)(0.3)
    assert rc == -1 and got == POISON
    assert "NaN" in last_error()
    out = ffi.new("int32_t *", POISON)
    fn = lib.pq_sample_logits_gpu if gpu else lib.pq_sample_logits
    assert fn(ffi.new("float[1]"), 0, sampling({}), ffi.NULL, 0, 0.5, out) == -1
    assert out[0] == POISON


@pytest.mark.skipif(NO_CUDA is None, reason="a CUDA device answers here")
def test_gpu_entry_says_why_it_cannot_run():
    out = ffi.new("int32_t *", POISON)
    assert lib.pq_sample_logits_gpu(ffi.new("float[2]"), 2, sampling({}), ffi.NULL, 0, 0.5, out) == -1
    assert out[0] == POISON and last_error() == NO_CUDA and "CUDA" in NO_CUDA


@pytest.mark.parametrize("gpu", BACKENDS)
@pytest.mark.parametrize("n_vocab", [8, 1000, 248320])
def test_nan_logits_are_never_chosen(n_vocab, gpu):
    rng = np.random.default_rng(n_vocab)
    logits = (rng.standard_normal(n_vocab) * 2).astype(np.float32)
    nan_ids = rng.choice(n_vocab, size=max(1, n_vocab // 3), replace=False)
    nan_ids[0] = int(np.argmax(logits))        # the best logit is NaN
    logits[nan_ids] = np.nan
    if n_vocab > 8:
        logits[np.argsort(np.nan_to_num(logits, nan=-1e9))[-5:]] = np.nan  # and the next ones
    nan_set = set(np.nonzero(np.isnan(logits))[0].tolist())
    history = random_history(rng, n_vocab, 32)
    for cfg in [{}, {"temperature": 1.0}, {"temperature": 1.0, "top_k": 10, "top_p": 0.9, "min_p": 0.01},
                {"temperature": 5.0, "repeat_penalty": 1.2}]:
        ref = reference(logits, cfg, history)
        call = Sampler(logits, cfg, history, gpu)
        for u in uniforms(rng, 50):
            rc, got = call(float(u))
            assert rc == 0, last_error()
            assert got not in nan_set
            want, ambiguous = ref.pick(u)
            assert ambiguous or got == want


@pytest.mark.parametrize("gpu", BACKENDS)
def test_infinite_and_nan_mixtures(gpu):
    ninf, inf, nan = -np.inf, np.inf, np.nan
    cases = [
        ([nan, ninf, ninf, nan], 1),       # only -inf besides NaN: the lowest -inf id
        ([0.0, inf, 1.0, inf], 1),         # +inf: greedy among the +inf ones
        ([nan, 1.0, ninf, 3.0, nan], 3),
    ]
    for row, want in cases:
        logits = np.array(row, np.float32)
        for cfg in [{}, {"temperature": 1.0}, {"temperature": 1.0, "top_p": 0.5, "min_p": 0.1}]:
            for u in [0.0, 0.5, 0.999]:
                rc, got = Sampler(logits, cfg, np.zeros(0, np.int32), gpu)(u)
                assert rc == 0, last_error()
                if cfg.get("temperature", 0.0) > 0 and row == cases[2][0]:
                    assert got in (1, 3)            # both finite candidates can be drawn
                    assert got == reference(logits, cfg, np.zeros(0, np.int32)).pick(u)[0]
                else:
                    assert got == want, (row, cfg, u)


@pytest.mark.parametrize("gpu", BACKENDS)
def test_penalty_window_and_empty_slots(gpu):
    logits = np.array([1.0, 4.0, 3.9, -2.0, 0.5], np.float32)
    # token 1 appears twice: penalised once (4/2 = 2 < 3.9)
    hist = np.array([1, -1, 1, 99, 3], np.int32)
    cfg = {"repeat_penalty": 2.0}
    assert Sampler(logits, cfg, hist, gpu)(0.5)[1] == 2
    # a window of the last 2 tokens no longer sees token 1
    assert Sampler(logits, {**cfg, "repeat_last_n": 2}, hist, gpu)(0.5)[1] == 1
    # only empty / out-of-range slots: nothing penalised
    assert Sampler(logits, cfg, np.array([-1, 5, 1000], np.int32), gpu)(0.5)[1] == 1


# --------------------------------------------------------------------------------------------
# the op itself, straight through ggml's API in the built extension


@pytest.mark.parametrize("gpu,n_threads", [(False, 1), (False, 3), (False, 8), pytest.param(True, 1, id="cuda", marks=needs_cuda)])
def test_op_in_library_multi_row(gpu, n_threads):
    """The op is registered under its name and a multi-row graph (strided logits view, several
    threads or blocks) gives per row what the one-row C API gives on the same backend."""
    g = ggml_ctypes.load()
    backend = ggml_ctypes.new_backend(g, "cuda" if gpu else "cpu", n_threads)
    rng = np.random.default_rng(n_threads + gpu)
    n_vocab, n_rows, n_hist, pad = 5000, 6, 16, 7
    graph = ggml_ctypes.SampleGraph(g, backend, n_vocab, n_rows, n_hist, pad)
    try:
        assert g.ggml_op_desc(graph.outs[0]) == b"PYQWEN_SAMPLE"
        L = (rng.standard_normal((n_rows, n_vocab + pad)) * 3).astype(np.float32)
        L[:, n_vocab:] = 100.0                      # padding outside the view: never sampled
        cfgs = [{"temperature": 0.0}, {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.1},
                {"temperature": 1.0}, {"temperature": 1.0, "top_p": 0.7}, {"temperature": 0.5, "min_p": 0.2, "repeat_penalty": 1.3},
                {"temperature": 1.0, "top_k": 2}]
        us = rng.random(n_rows, dtype=np.float32)
        P = np.array([[cfg.get("temperature", 0.0), cfg.get("top_k", 0), cfg.get("top_p", 1.0), cfg.get("min_p", 0.0),
                       cfg.get("repeat_penalty", 1.0), us[r], 0, 0] for r, cfg in enumerate(cfgs)], np.float32)
        H = np.stack([random_history(rng, n_vocab, n_hist) for _ in range(n_rows)])
        graph.set(L, P, H)
        graph.compute()
        got = graph.tokens()
        for r, cfg in enumerate(cfgs):
            rc, want = Sampler(L[r, :n_vocab].copy(), cfg, H[r].copy(), gpu)(float(us[r]))
            assert rc == 0
            assert got[r] == want, (r, cfg)
    finally:
        graph.close()
        g.ggml_backend_free(backend)
