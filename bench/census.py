"""Where a decode token's GPU time goes, kernel by kernel (issue 6): a census under Nsight Compute.

    ncu --clock-control none --cache-control none --profile-from-start off \\
        --metrics gpu__time_duration.sum,launch__grid_size --csv --page raw --log-file K.csv \\
        python3 bench/census.py run MODEL.gguf [--depth 512] [--tokens 8] [--rows M]
    python3 bench/census.py table K.csv --tokens 8 [--wall-us W] [--by-grid]

`run` fills the context with --depth random tokens, times --tokens greedy decode steps with no
profiler attached to them (printed as wall µs per token), then decodes --tokens more between
cudaProfilerStart and cudaProfilerStop, so ncu sees exactly those steps' kernels. With --rows M
each step is instead a pass of M random rows returning the last row's logits (the verify shape that
bench/step_cost.py times), and `table --tokens` counts passes. ncu runs the
kernels one at a time and leaves the clocks and the L2 alone (as METHOD.md asks), so the sum of
kernel times is the GPU's busy time without overlap, and wall minus that sum is what the launches
and dependencies between kernels cost. `table` sums the CSV by kernel per token; with --by-grid, by
kernel and grid size (for the GEMVs: by weight shape).
"""
from __future__ import annotations

import argparse
import csv
import ctypes
import sys
import time
from collections import defaultdict

import numpy as np


def _cuda_profiler():
    """cudaProfilerStart/Stop of the CUDA runtime that pyqwen's ggml loaded (same process)."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libcudart.so" in line}
    if not paths:
        sys.exit("census: no libcudart in this process (a CPU build of pyqwen?)")
    rt = ctypes.CDLL(sorted(paths)[0])
    return rt.cudaProfilerStart, rt.cudaProfilerStop


def run(a) -> int:
    from pyqwen._native import NativeContext, NativeModel, Sampling

    model = NativeModel(a.model, n_gpu_layers=99, n_threads=None, verbose=False)
    ctx = NativeContext(model, n_ctx=a.depth + 3 * a.tokens * max(a.rows, 1) + 16, n_batch=512, type_k="f16", type_v="f16")
    rng = np.random.default_rng(0)
    greedy = Sampling(temperature=0.0, repeat_penalty=1.0).to_c()
    no_stop = np.empty(0, dtype=np.int32)
    uniforms = np.zeros(a.tokens, dtype=np.float32)

    def decode():
        if a.rows:  # passes of M rows returning the last row's logits, as bench/step_cost.py times them
            for _ in range(a.tokens):
                ctx.eval(rng.integers(0, model.info.n_vocab, size=a.rows), logits="last")
        else:
            ctx.generate(int(rng.integers(0, model.info.n_vocab)), a.tokens, greedy, no_stop, uniforms, no_stop)

    start, stop = _cuda_profiler()
    try:
        ctx.eval(rng.integers(0, model.info.n_vocab, size=a.depth), logits="none")
        decode()  # graph build and CUDA graph capture
        t0 = time.perf_counter()
        decode()
        unit = f"pass of {a.rows} rows" if a.rows else "token"
        print(f"census: wall {1e6 * (time.perf_counter() - t0) / a.tokens:.1f} us per {unit} "
              f"(depth {a.depth}, {a.tokens} steps, no profiler)")
        start()
        decode()
        stop()
    finally:
        ctx.close()
        model.close()
    return 0


def short_name(name: str) -> str:
    """A kernel's name without its parameter list and with template arguments shortened."""
    name = name.removeprefix("void ")
    if name.endswith(")"):  # drop the parameter list: from the "(" that balances the last ")"
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    head, _, args = name.partition("<")
    return f"{head}<{args[:60]}{'...' if len(args) > 61 else ''}" if args else head


def table(a) -> int:
    with open(a.csv, newline="") as f:
        rows = [r for r in csv.reader(f) if len(r) > 3]
    header = rows[0]
    name_col = header.index("Kernel Name")
    time_col = header.index("gpu__time_duration.sum")
    grid_col = header.index("launch__grid_size") if "launch__grid_size" in header else None
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(rows[1][time_col], None)
    if scale is None:
        sys.exit(f"census: unexpected time unit {rows[1][time_col]!r}")
    us, calls, grids = defaultdict(float), defaultdict(int), defaultdict(set)
    if a.by_grid and grid_col is None:
        sys.exit("census: --by-grid needs the launch__grid_size metric in the CSV")
    for r in rows[2:]:
        k = short_name(r[name_col]) + (f" grid {r[grid_col]}" if a.by_grid else "")
        us[k] += float(r[time_col].replace(",", "")) * scale
        calls[k] += 1
        if grid_col is not None:
            grids[k].add(r[grid_col])
    total = sum(us.values()) / a.tokens
    print(f"| kernel | launches/token | us/token | share | grid sizes |")
    print("|---|---:|---:|---:|---|")
    for k in sorted(us, key=us.get, reverse=True):
        print(f"| `{k}` | {calls[k] / a.tokens:.0f} | {us[k] / a.tokens:.1f} | {100 * us[k] / a.tokens / total:.1f}% "
              f"| {', '.join(sorted(grids[k], key=lambda g: int(g) if g.isdigit() else 0)[:6])} |")
    launches = sum(calls.values()) / a.tokens
    print(f"\nkernels: {launches:.0f} launches and {total:.1f} us of GPU time per token", end="")
    if a.wall_us:
        print(f"; wall {a.wall_us:.1f} us per token, so {a.wall_us - total:.1f} us "
              f"({100 * (a.wall_us - total) / a.wall_us:.0f}%) between kernels", end="")
    print()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="decode under ncu")
    r.add_argument("model")
    r.add_argument("--depth", type=int, default=512)
    r.add_argument("--tokens", type=int, default=8, help="decode steps (passes, with --rows) timed, then profiled")
    r.add_argument("--rows", type=int, default=0, help="time passes of this many rows (ctx.eval) instead of greedy decode")
    t = sub.add_parser("table", help="sum ncu's CSV per kernel and token")
    t.add_argument("csv")
    t.add_argument("--tokens", type=int, default=8)
    t.add_argument("--wall-us", type=float, default=None, help="the wall time per token that `run` printed")
    t.add_argument("--by-grid", action="store_true", help="one row per kernel and grid size")
    a = ap.parse_args()
    return run(a) if a.cmd == "run" else table(a)


if __name__ == "__main__":
    sys.exit(main())
