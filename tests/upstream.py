"""Upstream llama.cpp (CPU) as a peer: built once from the pinned sdist, cached, driven by a tiny C client.

The source is the same llama-cpp-python sdist that vendor/ggml comes from (vendor/ggml.pin),
found and verified by vendor/prepare_ggml.py's own functions, extracted pristine (no pyqwen
patches). Only libllama and its ggml libraries are built, then tests/upstream_driver.c is
linked against them. The build lives in $PYQWEN_UPSTREAM_CACHE (default ~/.cache/pyqwen),
in a directory named after the pin's sha256, so it is reused across runs and rebuilt only
when the pin changes (a few minutes on two cores).

Use from any test module:

    from upstream import upstream_llama  # noqa: F401  (the session fixture)

    def test_x(upstream_llama):
        res = upstream_llama.run(gguf_path, prompt_tokens, n_predict=8)
        assert res.ok, res.stderr            # res.logits [n_prompt, n_vocab], res.tokens
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DRIVER_SRC = Path(__file__).with_name("upstream_driver.c")
LLAMA_SUBDIR = "vendor/llama.cpp"  # in the sdist, next to the ggml subtree vendor/ggml is cut from

CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_OPENMP=OFF", "-DGGML_CCACHE=OFF",
    "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF",
]


def load_prepare_ggml():
    """vendor/prepare_ggml.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("prepare_ggml", ROOT / "vendor" / "prepare_ggml.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{(p.stdout + p.stderr)[-4000:]}")


def build_upstream(cache: Path | None = None) -> Path:
    """Build (or reuse) libllama from the pinned sdist and the driver; returns the driver's path."""
    pg = load_prepare_ggml()
    pin = pg.read_pin()
    cache = Path(cache or os.environ.get("PYQWEN_UPSTREAM_CACHE") or Path.home() / ".cache" / "pyqwen")
    top = cache / f"llama.cpp-{pin['sha256'][:16]}"
    top.mkdir(parents=True, exist_ok=True)
    driver = top / f"upstream_driver-{hashlib.sha256(DRIVER_SRC.read_bytes()).hexdigest()[:12]}"
    with open(top / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time; the others wait and reuse it
        if driver.is_file():
            return driver
        src, build, stamp = top / "src", top / "build", top / "libllama.done"
        if not stamp.is_file():
            sdist = pg.locate_sdist(pin)
            if pg.sha256(sdist) != pin["sha256"]:
                raise RuntimeError(f"{sdist} does not match the sha256 in vendor/ggml.pin")
            pg.extract(sdist, LLAMA_SUBDIR, src)
            shutil.rmtree(build, ignore_errors=True)
            _run(["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS])
            _run(["cmake", "--build", str(build), "--target", "llama", "-j", str(os.cpu_count() or 2)])
            stamp.write_text(pin["sha256"] + "\n")
        libs = [build / "src" / "libllama.a", build / "ggml" / "src" / "libggml.a",
                build / "ggml" / "src" / "libggml-cpu.a", build / "ggml" / "src" / "libggml-base.a"]
        missing = [str(p) for p in libs if not p.is_file()]
        if missing:
            raise RuntimeError(f"upstream build did not produce {', '.join(missing)}")
        obj = top / "upstream_driver.o"
        _run(["cc", "-O1", "-c", str(DRIVER_SRC), "-o", str(obj),
              "-I", str(src / "include"), "-I", str(src / "ggml" / "include")])
        tmp = driver.with_suffix(".tmp")
        _run(["c++", str(obj), *map(str, libs), "-o", str(tmp), "-lpthread", "-lm", "-ldl"])
        tmp.rename(driver)
    return driver


@dataclass
class UpstreamResult:
    returncode: int
    stderr: str
    tokens: list[int]
    logits: np.ndarray | None  # [n_prompt, n_vocab]

    @property
    def ok(self) -> bool:
        return self.returncode == 0


@dataclass
class Upstream:
    driver: Path

    def run(self, model: Path, prompt: list[int], n_predict: int = 1, timeout: int = 300) -> UpstreamResult:
        """Load `model` in upstream llama.cpp, evaluate `prompt`, decode `n_predict` greedy tokens.
        A crash (signal) is an error of the test, not a result: it raises."""
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "logits.bin"
            p = subprocess.run([str(self.driver), str(model), str(n_predict), str(out), *map(str, prompt)],
                               capture_output=True, text=True, timeout=timeout)
            if p.returncode < 0:
                raise AssertionError(f"upstream llama.cpp crashed (signal {-p.returncode}) on {model}:\n"
                                     f"{p.stderr[-3000:]}")
            logits = np.fromfile(out, dtype=np.float32).reshape(len(prompt), -1) if out.is_file() else None
        tokens = [int(t) for t in p.stdout.split()] if p.returncode == 0 else []
        return UpstreamResult(p.returncode, p.stderr, tokens, logits)


@pytest.fixture(scope="session")
def upstream_llama() -> Upstream:
    """Upstream llama.cpp built from the pinned sdist (the one slow step of the suite, cached)."""
    try:
        return Upstream(build_upstream())
    except (RuntimeError, OSError) as e:
        pytest.fail(f"cannot build upstream llama.cpp from the pinned sdist: {e}")
