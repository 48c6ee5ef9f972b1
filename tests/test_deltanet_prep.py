"""GGML_OP_PYQWEN_DELTANET_PREP (ggml-patches) on the CPU against a float64 reference: the input side of a
Gated DeltaNet layer for passes of 1..8 tokens (conv step with the state advanced in place, SiLU, q/k L2
norms, log decay, sigmoid), with its inputs as views of one stacked projection output."""
from __future__ import annotations

import numpy as np
import pytest

from pyqwen._cffi import ffi, lib
from pyqwen._native import _error as err

EPS = 1e-6


def reference(y, beta_col, alpha_col, state, w, dt_bias, a, hk, hv, S):
    """float64: (q|k|v of every token, then g [n, hv], then beta [n, hv]) and the new conv state."""
    y, state, w = y.astype(np.float64), state.astype(np.float64), w.astype(np.float64)
    C = (2 * hk + hv) * S
    rows, gs, bs = [], [], []
    for t in range(y.shape[0]):
        window = np.concatenate([state, y[t, :C, None]], axis=1)       # [C, K]
        conv = (window * w).sum(axis=1)
        s = conv / (1.0 + np.exp(-conv))
        state = window[:, 1:]
        q, k = s[:hk * S].reshape(hk, S), s[hk * S:2 * hk * S].reshape(hk, S)
        q = q / np.sqrt((q * q).sum(axis=1, keepdims=True) + EPS)
        k = k / np.sqrt((k * k).sum(axis=1, keepdims=True) + EPS)
        rows.append(np.concatenate([q.ravel(), k.ravel(), s[2 * hk * S:]]))
        x = y[t, alpha_col:alpha_col + hv] + dt_bias
        gs.append(np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0)))) * a)
        bs.append(1.0 / (1.0 + np.exp(-y[t, beta_col:beta_col + hv])))
    return np.concatenate([np.ravel(rows), np.ravel(gs), np.ravel(bs)]), state


def run(y, beta_col, alpha_col, state, w, dt_bias, a, hk, hv, S):
    n, width = y.shape
    C = (2 * hk + hv) * S
    out = np.full((C + 2 * hv) * n, np.nan, dtype=np.float32)  # poisoned
    state = np.ascontiguousarray(state, dtype=np.float32).copy()
    f = lambda x: ffi.from_buffer("float[]", np.ascontiguousarray(x, dtype=np.float32))  # noqa: E731
    rc = lib.pq_deltanet_prep(f(y), width, n, beta_col, alpha_col, ffi.from_buffer("float[]", state), f(w), w.shape[1],
                              f(dt_bias), f(a), hk, hv, S, EPS, ffi.from_buffer("float[]", out))
    assert rc == 0, err()
    return out, state


def inputs(rng, hk, hv, S, K, n):
    C = (2 * hk + hv) * S
    width = C + hv * S + 2 * hv + 3                      # q|k|v, z, beta, alpha and a few more columns
    y = rng.standard_normal((n, width)).astype(np.float32)
    y[:, C + hv * S + hv:C + hv * S + 2 * hv] *= 8.0     # alpha past softplus's linear threshold too
    state = rng.standard_normal((C, K - 1)).astype(np.float32)
    w = (0.5 * rng.standard_normal((C, K))).astype(np.float32)
    dt_bias = rng.standard_normal(hv).astype(np.float32)
    a = -np.exp(rng.standard_normal(hv)).astype(np.float32)
    return y, C + hv * S, C + hv * S + hv, state, w, dt_bias, a


@pytest.mark.parametrize("hk,hv,S,K,n", [(1, 4, 16, 4, 1), (2, 6, 32, 4, 8), (3, 3, 8, 2, 5), (16, 32, 128, 4, 3)])
def test_matches_float64(hk, hv, S, K, n):
    rng = np.random.default_rng(hk * 100 + n)
    y, beta_col, alpha_col, state, w, dt_bias, a = inputs(rng, hk, hv, S, K, n)
    got, got_state = run(y, beta_col, alpha_col, state, w, dt_bias, a, hk, hv, S)
    ref, ref_state = reference(y, beta_col, alpha_col, state, w, dt_bias, a, hk, hv, S)
    assert np.isfinite(got).all()
    assert (np.abs(got - ref) <= 2e-6 + 1e-5 * np.abs(ref)).all(), np.abs(got - ref).max()
    # the state holds the last K - 1 inputs: copies, so exact
    assert np.array_equal(got_state, ref_state.astype(np.float32))


def test_passes_carry_the_state():
    """Eight tokens in passes of 3 and 5 equal one pass of 8."""
    rng = np.random.default_rng(7)
    hk, hv, S = 2, 4, 16
    y, beta_col, alpha_col, state, w, dt_bias, a = inputs(rng, hk, hv, S, 4, 8)
    whole, whole_state = run(y, beta_col, alpha_col, state, w, dt_bias, a, hk, hv, S)
    first, mid_state = run(y[:3], beta_col, alpha_col, state, w, dt_bias, a, hk, hv, S)
    second, end_state = run(y[3:], beta_col, alpha_col, mid_state, w, dt_bias, a, hk, hv, S)
    C = (2 * hk + hv) * S
    split = lambda o, n: (o[:C * n], o[C * n:C * n + hv * n], o[C * n + hv * n:])  # noqa: E731
    for part_whole, part_first, part_second in zip(split(whole, 8), split(first, 3), split(second, 5)):
        assert np.array_equal(part_whole, np.concatenate([part_first, part_second]))
    assert np.array_equal(whole_state, end_state)


def test_bad_shape_is_an_error():
    y = np.ones((2, 10), dtype=np.float32)
    out = np.zeros(64, dtype=np.float32)
    state = np.zeros(64, dtype=np.float32)
    f = lambda x: ffi.from_buffer("float[]", x)  # noqa: E731
    # beta past the end of the row
    assert lib.pq_deltanet_prep(f(y), 10, 2, 10, 6, f(state), f(state), 4, f(state), f(state), 1, 1, 2, EPS, f(out)) == -1
    assert "bad shape" in err()
