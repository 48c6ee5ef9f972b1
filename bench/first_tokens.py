"""What the first decode passes after a prompt cost, against the steady state (issue 6).

    python3 bench/first_tokens.py MODEL.gguf [--depths 0,8192,32640] [--first 4] [--tokens 128] [--reps 3]

After a prompt the decode graph is built anew (its shape differs from the prompt's passes, and the
attention span grows in whole blocks), and ggml's CUDA backend runs a new graph's first pass eagerly
and captures it as a CUDA graph on the second. For each depth and rep this fills the context with
random tokens, times the first --first greedy decode passes one call each (wall µs, and the host's
share: graph building, inputs, launches), then the rest of --tokens in one call (µs a token). The
last column is what the first passes cost above the steady state, spread over --tokens, which is
what pyqwen-bench's tg at that depth carries.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--depths", default="0,8192,32640")
    ap.add_argument("--first", type=int, default=4, help="passes timed one call each")
    ap.add_argument("--tokens", type=int, default=128, help="decode passes in all")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=99)
    a = ap.parse_args()
    depths = [int(d) for d in a.depths.split(",")]
    if a.first < 1 or a.tokens <= a.first:
        ap.error("need 1 <= --first < --tokens")

    from pyqwen._native import NativeContext, NativeModel, Sampling

    model = NativeModel(a.model, n_gpu_layers=a.n_gpu_layers, n_threads=None, verbose=False)
    ctx = NativeContext(model, n_ctx=max(depths) + a.tokens + 1, n_batch=512, type_k="f16", type_v="f16")
    greedy = Sampling(temperature=0.0, repeat_penalty=1.0).to_c()
    no_stop = np.empty(0, dtype=np.int32)
    rng = np.random.default_rng(0)
    n_vocab = model.info.n_vocab

    def timed(n: int) -> tuple[float, float]:
        """Wall and host µs of one generate call of n greedy passes."""
        host0, t0 = ctx.timings().host_us, time.perf_counter()
        ctx.generate(int(rng.integers(0, n_vocab)), n, greedy, no_stop, np.zeros(n, dtype=np.float32), no_stop)
        return 1e6 * (time.perf_counter() - t0), float(ctx.timings().host_us - host0)

    cols = " | ".join(f"pass {i + 1}" for i in range(a.first))
    print(f"| depth | rep | {cols} | then µs a token | first passes' extra, µs a token over {a.tokens} |")
    print("|---:|---:|" + "---:|" * a.first + "---:|---:|")
    try:
        for depth in depths:
            for rep in range(a.reps):
                ctx.reset()
                if depth:
                    ctx.eval(rng.integers(0, n_vocab, depth), logits="none")
                first = [timed(1) for _ in range(a.first)]
                rest_wall, _ = timed(a.tokens - a.first)
                steady = rest_wall / (a.tokens - a.first)
                extra = sum(w - steady for w, _ in first) / a.tokens
                cells = " | ".join(f"{w:.0f} (host {h:.0f})" for w, h in first)
                print(f"| {depth} | {rep + 1} | {cells} | {steady:.1f} | {extra:.1f} |", flush=True)
    finally:
        ctx.close()
        model.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
