#!/usr/bin/env python3
"""Time per call of the in-graph sampler (GGML_OP_PYQWEN_SAMPLE) on the CUDA and CPU backends.

  python bench/sample_op_bench.py [--vocab 248320] [--copies 50] [--reps 20] [--threads 16]

A case is one graph of --copies sampler nodes over the same inputs, computed --reps times after a
warm-up; time per call = best graph time / copies, so the launch of each node counts, as it does
in a decode graph. Rows 1 and 8; greedy, top-k 40 / top-p 0.95 (the brief's setting), llama.cpp's
default chain, and two settings without top-k (the CUDA kernel's radix-search path). The logits
are peaked like a language model's. Also timed: reading one row of logits back to the host, which
placing the op on the CPU costs a GPU run on top of the CPU op. Needs pyqwen installed; a CPU-only
build times the CPU rows alone.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import ggml_ctypes  # noqa: E402

SAMPLERS = {  # temperature, top_k, top_p, min_p, repeat_penalty
    "greedy": (0.0, 0, 1.0, 0.0, 1.0),
    "top-k 40, top-p 0.95": (0.8, 40, 0.95, 0.0, 1.0),
    "top-k 40, top-p 0.95, min-p 0.05, penalty 1.1": (0.8, 40, 0.95, 0.05, 1.1),
    "top-p 0.95": (0.8, 0, 0.95, 0.0, 1.0),
    "temperature only": (1.0, 0, 1.0, 0.0, 1.0),
}
N_HIST = 256  # the runtime's window (PQ_HISTORY)


def inputs(rng, n_vocab: int, n_rows: int, sampler: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    logits = (rng.standard_normal((n_rows, n_vocab)) * 2.0).astype(np.float32)
    for row in logits:
        row[rng.choice(n_vocab, 30, replace=False)] += rng.uniform(6.0, 14.0, 30).astype(np.float32)
    params = np.zeros((n_rows, ggml_ctypes.N_PARAMS), np.float32)
    params[:, :5] = sampler
    params[:, 5] = rng.random(n_rows)
    history = rng.integers(0, n_vocab, (n_rows, N_HIST)).astype(np.int32)
    return logits, params, history


def time_call(graph: ggml_ctypes.SampleGraph, copies: int, reps: int) -> float:
    """Best seconds per sampler call."""
    for _ in range(3):
        graph.compute()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        graph.compute()
        best = min(best, time.perf_counter() - t)
    return best / copies


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--copies", type=int, default=50)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=16, help="CPU backend threads")
    args = ap.parse_args()

    g = ggml_ctypes.load()
    backends = [("CUDA", ggml_ctypes.new_backend(g, "cuda")),
                (f"CPU ({args.threads} threads)", ggml_ctypes.new_backend(g, "cpu", args.threads))]
    backends = [(name, be) for name, be in backends if be]
    rng = np.random.default_rng(0)
    print(f"n_vocab {args.vocab}, history {N_HIST}, {args.copies} sampler nodes per CUDA graph "
          f"({max(1, args.copies // 10)} per CPU graph), best of {args.reps}\n")
    print("| rows | sampler | " + " | ".join(f"{name} us per call" for name, _ in backends) + " | same tokens |")
    print("|---|---|" + "---|" * len(backends) + "---|")
    for n_rows in (1, 8):
        for name_s, sampler in SAMPLERS.items():
            data = inputs(rng, args.vocab, n_rows, sampler)
            times, picks = [], []
            for name_b, be in backends:
                copies = args.copies if name_b == "CUDA" else max(1, args.copies // 10)
                graph = ggml_ctypes.SampleGraph(g, be, args.vocab, n_rows, N_HIST, n_copies=copies)
                try:
                    graph.set(*data)
                    times.append(time_call(graph, copies, args.reps) * 1e6)
                    picks.append(graph.tokens())
                finally:
                    graph.close()
            same = f"{int((picks[0] == picks[1]).sum())}/{n_rows}" if len(picks) == 2 else "-"
            print(f"| {n_rows} | {name_s} | " + " | ".join(f"{t:.1f}" for t in times) + f" | {same} |")
    for name_b, be in backends:
        if name_b == "CUDA":
            graph = ggml_ctypes.SampleGraph(g, be, args.vocab, 1, N_HIST)
            graph.set(*inputs(rng, args.vocab, 1, SAMPLERS["greedy"]))
            best = float("inf")
            for _ in range(args.reps):
                t = time.perf_counter()
                graph.read_logits()
                best = min(best, time.perf_counter() - t)
            graph.close()
            print(f"\nreading one row of {args.vocab} logits back from the GPU: {best * 1e6:.1f} us")
    for _, be in backends:
        g.ggml_backend_free(be)
    return 0


if __name__ == "__main__":
    sys.exit(main())
