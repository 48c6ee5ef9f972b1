"""pyqwen-bench: llama-bench's tests, flags and output, run on pyqwen's runtime.

Tests, as llama-bench defines them: ppN processes a random N-token prompt in passes of n_batch
tokens; tgN decodes N tokens one at a time (greedy, in the runtime: no Python per token);
ppN+tgM does both; "@ dD" first fills the context with D random tokens (not timed). Every
(model, parameter) combination of the comma-separated values is one run: a warm-up test, then
-r timed repetitions from a fresh state; t/s is the mean and standard deviation over them.
Beyond llama-bench's columns: `mtp` (speculation, off until pyqwen has it), host time per
token outside device waits, and the GPU memory in use during the test.
"""
from __future__ import annotations

import argparse
import csv
import itertools
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Iterator

import numpy as np

from ._native import CACHE_TYPES, NativeContext, NativeModel, Sampling, backend_name
from .llama import _check_model_path, read_metadata

GREEDY = Sampling(temperature=0.0, repeat_penalty=1.0)


@dataclass
class TestResult:
    model_filename: str
    model_type: str
    model_size: int
    model_n_params: int
    backend: str
    n_gpu_layers: int
    n_batch: int
    type_k: str
    type_v: str
    flash_attn: int
    mtp: str
    n_prompt: int
    n_gen: int
    n_depth: int
    test_time: str
    samples_ns: list[int] = field(default_factory=list)
    host_us_per_token: float = 0.0
    device_mem_bytes: int | None = None

    @property
    def name(self) -> str:
        if self.n_prompt and self.n_gen:
            test = f"pp{self.n_prompt}+tg{self.n_gen}"
        else:
            test = f"pp{self.n_prompt}" if self.n_prompt else f"tg{self.n_gen}"
        return test + (f" @ d{self.n_depth}" if self.n_depth else "")

    @property
    def samples_ts(self) -> list[float]:
        return [(self.n_prompt + self.n_gen) * 1e9 / ns for ns in self.samples_ns]

    def record(self) -> dict:
        ts = self.samples_ts
        rec = asdict(self)
        rec.update(test=self.name, avg_ns=int(statistics.fmean(self.samples_ns)),
                   stddev_ns=int(statistics.stdev(self.samples_ns)) if len(self.samples_ns) > 1 else 0,
                   avg_ts=statistics.fmean(ts), stddev_ts=statistics.stdev(ts) if len(ts) > 1 else 0.0,
                   samples_ts=ts)
        return rec


def _model_type(meta: dict, n_params: int) -> str:
    """llama-bench's model description: architecture, size label, file type."""
    import gguf

    arch = meta.get("general.architecture", "?")
    size = meta.get("general.size_label") or (f"{n_params / 1e9:.1f}B" if n_params >= 1e9 else f"{n_params / 1e6:.0f}M")
    try:
        ftype = gguf.LlamaFileType(int(meta["general.file_type"])).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (KeyError, ValueError):
        ftype = "?"
    return f"{arch} {size} {ftype}"


def _gpu_used(model: NativeModel) -> int | None:
    mem = model.device_memory()
    return None if mem is None else mem[1] - mem[0]


def _run_test(ctx: NativeContext, model: NativeModel, rng: np.random.Generator, res: TestResult, reps: int,
              warmup: bool) -> None:
    n_vocab = ctx.n_vocab
    no_stop = np.empty(0, dtype=np.int32)

    def once() -> tuple[int, int]:
        ctx.reset()
        if res.n_depth:
            ctx.eval(rng.integers(0, n_vocab, res.n_depth), logits="none")
        host0 = ctx.timings().host_us
        t0 = time.perf_counter_ns()
        if res.n_prompt:
            ctx.eval(rng.integers(0, n_vocab, res.n_prompt), logits="none")
        if res.n_gen:
            ctx.generate(int(rng.integers(0, n_vocab)), res.n_gen, GREEDY.to_c(), no_stop,
                         np.zeros(res.n_gen, dtype=np.float32), no_stop)
        return time.perf_counter_ns() - t0, ctx.timings().host_us - host0

    if warmup:
        once()
    host_us = 0
    for _ in range(reps):
        ns, host = once()
        res.samples_ns.append(ns)
        host_us += host
    res.host_us_per_token = host_us / (reps * (res.n_prompt + res.n_gen))
    res.device_mem_bytes = _gpu_used(model)


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def _strs(text: str) -> list[str]:
    return [v for v in text.split(",") if v]


def _pairs(text: str) -> list[tuple[int, int]]:
    vals = _ints(text)
    if len(vals) % 2:
        raise argparse.ArgumentTypeError(f"-pg takes pairs pp,tg; got {text!r}")
    return list(zip(vals[::2], vals[1::2]))


def _flatten(values: list[list]) -> list:
    return [v for vs in values for v in vs]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="pyqwen-bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", type=_strs, action="append", required=True, help="GGUF file(s)")
    ap.add_argument("-p", "--n-prompt", type=_ints, action="append", help="prompt sizes (default 512)")
    ap.add_argument("-n", "--n-gen", type=_ints, action="append", help="generated tokens (default 128)")
    ap.add_argument("-pg", type=_pairs, action="append", help="prompt+generation pairs, e.g. 512,128")
    ap.add_argument("-d", "--n-depth", type=_ints, action="append", help="context depth before the test (default 0)")
    ap.add_argument("-b", "--batch-size", type=_ints, action="append", help="tokens per prefill pass (default 512)")
    ap.add_argument("-ngl", "--n-gpu-layers", type=_ints, action="append", help="layers on the GPU (default -1: all)")
    ap.add_argument("-fa", "--flash-attn", type=_strs, action="append",
                    help="flash attention: pyqwen always uses it (1/on/auto; 0 is refused)")
    ap.add_argument("-ctk", "--cache-type-k", type=_strs, action="append", help="K cache type (default f16)")
    ap.add_argument("-ctv", "--cache-type-v", type=_strs, action="append", help="V cache type (default f16)")
    ap.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: all cores)")
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("-o", "--output", choices=("md", "csv", "json", "jsonl"), default="md")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--seed", type=int, default=1234, help="seed of the random prompts")
    a = ap.parse_args(argv)
    a.model = _flatten(a.model)
    a.n_prompt = _flatten(a.n_prompt) if a.n_prompt else [512]
    a.n_gen = _flatten(a.n_gen) if a.n_gen else [128]
    a.pg = _flatten(a.pg) if a.pg else []
    a.n_depth = _flatten(a.n_depth) if a.n_depth else [0]
    a.batch_size = _flatten(a.batch_size) if a.batch_size else [512]
    a.n_gpu_layers = _flatten(a.n_gpu_layers) if a.n_gpu_layers else [-1]
    fa = _flatten(a.flash_attn) if a.flash_attn else ["1"]
    a.cache_type_k = _flatten(a.cache_type_k) if a.cache_type_k else ["f16"]
    a.cache_type_v = _flatten(a.cache_type_v) if a.cache_type_v else ["f16"]
    if any(v.lower() not in ("1", "on", "auto") for v in fa):
        ap.error("pyqwen always runs flash attention; -fa 0/off is not available")
    for t in a.cache_type_k + a.cache_type_v:
        if t not in CACHE_TYPES:
            ap.error(f"cache type {t!r} is not one of {', '.join(CACHE_TYPES)}")
    if a.repetitions < 1:
        ap.error("-r must be at least 1")
    for name in ("n_prompt", "n_gen", "n_depth"):
        if any(v < 0 for v in getattr(a, name)):
            ap.error(f"{name} values must be >= 0")
    if any(v <= 0 for v in a.batch_size):
        ap.error("-b values must be positive")
    for m in a.model:
        try:
            _check_model_path(m)
        except (OSError, ValueError) as e:
            ap.error(str(e))
    return a


def _tests(a) -> list[tuple[int, int]]:
    """(n_prompt, n_gen) per test, in llama-bench's order: prompts, generations, pairs."""
    return [(p, 0) for p in a.n_prompt if p] + [(0, n) for n in a.n_gen if n] + [pg for pg in a.pg if pg[0] or pg[1]]


def run(a) -> Iterator[TestResult]:
    rng = np.random.default_rng(a.seed)
    for path in a.model:
        meta = read_metadata(path)
        for ngl in a.n_gpu_layers:
            model = NativeModel(path, n_gpu_layers=ngl, n_threads=a.threads, verbose=False)
            try:
                info = model.info
                for n_batch, ctk, ctv, depth, (n_prompt, n_gen) in itertools.product(
                        a.batch_size, a.cache_type_k, a.cache_type_v, a.n_depth, _tests(a)):
                    res = TestResult(path, _model_type(meta, info.n_params), info.size_bytes, info.n_params,
                                     backend_name(), info.n_gpu_layers, n_batch, ctk, ctv, 1, "off",
                                     n_prompt, n_gen, depth, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
                    ctx = NativeContext(model, n_ctx=max(depth + n_prompt + n_gen, 1), n_batch=n_batch,
                                        type_k=ctk, type_v=ctv)
                    try:
                        _run_test(ctx, model, rng, res, a.repetitions, not a.no_warmup)
                    finally:
                        ctx.close()
                    yield res
            finally:
                model.close()


MD_COLUMNS = [("model", -30), ("size", 10), ("params", 10), ("backend", -10), ("ngl", 3), ("n_batch", 7),
              ("type_k", 6), ("type_v", 6), ("fa", 3), ("mtp", 4), ("test", 15), ("t/s", 20),
              ("host us/tok", 11), ("GPU MiB", 8)]


def _md_cells(r: TestResult) -> dict[str, str]:
    rec = r.record()
    size = r.model_size / 2**30
    params = r.model_n_params / 1e9
    return {"model": r.model_type, "size": f"{size:.2f} GiB", "params": f"{params:.2f} B", "backend": r.backend,
            "ngl": str(r.n_gpu_layers), "n_batch": str(r.n_batch), "type_k": r.type_k, "type_v": r.type_v,
            "fa": str(r.flash_attn), "mtp": r.mtp, "test": r.name,
            "t/s": f"{rec['avg_ts']:.2f} ± {rec['stddev_ts']:.2f}", "host us/tok": f"{r.host_us_per_token:.1f}",
            "GPU MiB": "-" if r.device_mem_bytes is None else str(r.device_mem_bytes >> 20)}


def _md_columns(a) -> list[tuple[str, int]]:
    """llama-bench shows a parameter only when it differs from its default."""
    hidden = set()
    if a.batch_size == [512]:
        hidden.add("n_batch")
    if a.cache_type_k == ["f16"]:
        hidden.add("type_k")
    if a.cache_type_v == ["f16"]:
        hidden.add("type_v")
    return [(c, w) for c, w in MD_COLUMNS if c not in hidden]


def _md_row(cells: list[str], cols: list[tuple[str, int]]) -> str:
    return "| " + " | ".join(f"{c:<{-w}}" if w < 0 else f"{c:>{w}}" for c, (_, w) in zip(cells, cols)) + " |"


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    out = sys.stdout
    cols = _md_columns(a)
    results = []
    if a.output == "md":
        print(_md_row([c for c, _ in cols], cols), file=out)
        print("| " + " | ".join(("-" * (abs(w) - 1) + ":") if w > 0 else "-" * abs(w) for _, w in cols) + " |", file=out)
    writer = None
    try:
        for r in run(a):
            results.append(r)
            rec = r.record()
            if a.output == "md":
                cells = _md_cells(r)
                print(_md_row([cells[c] for c, _ in cols], cols), file=out, flush=True)
            elif a.output == "jsonl":
                print(json.dumps(rec), file=out, flush=True)
            elif a.output == "csv":
                if writer is None:
                    writer = csv.DictWriter(out, fieldnames=list(rec))
                    writer.writeheader()
                writer.writerow(rec)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"pyqwen-bench: {e}", file=sys.stderr)
        return 1
    if a.output == "json":
        json.dump([r.record() for r in results], out, indent=2)
        print(file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
