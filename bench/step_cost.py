"""Cost of one forward step over M token rows against one row (the MTP verify shape, issue 6).

    python3 bench/step_cost.py MODEL.gguf [-ngl 99] [--rows 1,2,4,8] [--steps 40] [--depth 512]

After a prompt of --depth tokens, runs --steps passes of M rows for each M (each pass appends its
rows; the context is reset before each M), after two untimed passes (graph build, CUDA graph
capture), and prints the median wall time per pass, the spread of its middle half (interquartile
range), and its ratio to M = 1. A pass returns the logits of its last row, as a verify step reads
them, so every M pays the same readback. The passes of one M run back to back, so drift between
them moves the ratio: compare ratios only when their spreads are small against their difference.
The host and wait columns split a pass (medians, from the context's timings): the host's own work
(embedding rows, input uploads, graph launch) and the wait for the device, which holds the GPU time
(with the CPU backend the whole pass is host time).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from pyqwen._native import NativeContext, NativeModel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=99)
    ap.add_argument("--rows", default="1,2,4,8", help="comma-separated row counts")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--depth", type=int, default=512, help="tokens in the context before the timed passes")
    a = ap.parse_args()
    rows = [int(r) for r in a.rows.split(",")]
    if a.steps < 2 or min(rows) < 1:
        ap.error("--steps must be at least 2 (the spread needs two passes) and every --rows value at least 1")

    model = NativeModel(a.model, n_gpu_layers=a.n_gpu_layers, n_threads=None, verbose=False)
    n_vocab = model.info.n_vocab
    rng = np.random.default_rng(0)
    n_ctx = a.depth + (a.steps + 2) * max(rows)
    ctx = NativeContext(model, n_ctx=n_ctx, n_batch=max(512, max(rows)), type_k="f16", type_v="f16")
    per_pass = {}
    try:
        for m in rows:
            ctx.reset()
            ctx.eval(rng.integers(0, n_vocab, size=a.depth), logits="none")
            times, host_us, wait_us = [], [], []
            for step in range(a.steps + 2):
                tokens = rng.integers(0, n_vocab, size=m)
                before = ctx.timings()
                t0 = time.perf_counter()
                ctx.eval(tokens, logits="last")
                t1 = time.perf_counter()
                after = ctx.timings()
                if step >= 2:
                    times.append(t1 - t0)
                    host_us.append(after.host_us - before.host_us)
                    wait_us.append(after.wait_us - before.wait_us)
            q1, _, q3 = statistics.quantiles(times, n=4)
            per_pass[m] = (statistics.median(times), q3 - q1, statistics.median(host_us), statistics.median(wait_us))
    finally:
        ctx.close()
        model.close()

    print(f"| rows | ms per pass | IQR ms | vs 1 row | host ms | wait ms |  (depth {a.depth}, median of {a.steps} passes)")
    print("|---:|---:|---:|---:|---:|---:|")
    for m in rows:
        med, iqr, host, wait = per_pass[m]
        print(f"| {m} | {1e3 * med:.3f} | {1e3 * iqr:.3f} | {med / per_pass[rows[0]][0]:.2f}x | {1e-3 * host:.3f} | {1e-3 * wait:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
