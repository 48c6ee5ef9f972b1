"""The interleaved GEMV layout (bench/gemv) checked on the CPU: the C++ program round-trips the
re-layout of random Q4_0/Q8_0/Q4_K/Q6_K/W4A8 weights and emulates the CUDA kernel lane by lane (the layout
header's index math and unpacking, the PTX mma fragment layouts) against a float64 reference, for
M = 1..8; the prefill's in-place tile moves (both ways) by the device kernel's index math; and W4A8's
inverse map and its expansion to Q8_0 for the prefill."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "bench" / "gemv" / "gemv_il_cpu_test.cpp"
LAYOUT_DIR = ROOT / "ggml-patches" / "src" / "src" / "ggml-cuda"  # gemv-il-layout.h


def test_gemv_il_layout_and_kernel_emulation(tmp_path):
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path / "gemv_il_cpu_test"
    subprocess.run([cxx, "-O2", "-std=c++17", "-pthread", f"-I{LAYOUT_DIR}", str(SRC), "-o", str(exe)], check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    last = run.stdout.strip().splitlines()[-1]
    assert run.returncode == 0 and last.endswith(" 0 failed"), run.stdout[-4000:] + run.stderr[-2000:]
    # every case ran: 6 shapes x (1 round trip + 2 in-place moves + 8 M x 4 splits) x 5 types, and W4A8's
    # inverse map and expansion
    assert int(last.split()[0]) >= 1062, last
