"""Minimal safetensors reader: validated header, one tensor (or row range) at a time.

Format: u64 little-endian header length N, N bytes of JSON
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`,
then the data; offsets are relative to the end of the header.

Reads go through `readinto` into a fresh buffer rather than mmap, so a
tensor's bytes count against RSS only while the caller holds the array.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ConversionError

# safetensors dtype -> (numpy storage dtype, bytes per element)
DTYPES: dict[str, tuple[np.dtype, int]] = {
    "F64": (np.dtype("<f8"), 8),
    "F32": (np.dtype("<f4"), 4),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),  # widened to f32 by read_float
    "I64": (np.dtype("<i8"), 8),
    "I32": (np.dtype("<i4"), 4),
    "I16": (np.dtype("<i2"), 2),
    "I8": (np.dtype("i1"), 1),
    "U64": (np.dtype("<u8"), 8),
    "U32": (np.dtype("<u4"), 4),
    "U16": (np.dtype("<u2"), 2),
    "U8": (np.dtype("u1"), 1),
    "BOOL": (np.dtype("u1"), 1),
    "F8_E4M3": (np.dtype("u1"), 1),  # raw bytes; a quantized layout decodes them
    "F8_E5M2": (np.dtype("u1"), 1),
}
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")

_MAX_HEADER = 512 << 20


@dataclass(frozen=True)
class TensorRef:
    """Where one stored tensor lives. `offset` is absolute in `file`."""

    file: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def row_nbytes(self) -> int:
        return self.nbytes // self.shape[0] if self.shape and self.shape[0] else self.nbytes


def _bad(path: Path, why: str) -> ConversionError:
    return ConversionError(f"corrupt safetensors header in {path}: {why}")


def _header_json(path: Path) -> tuple[dict, int, int]:
    """The header object of `path`, its length and the file size."""

    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise _bad(path, f"file is {size} bytes, too short for a header")
            n = int.from_bytes(head, "little")
            if n > _MAX_HEADER or 8 + n > size:
                raise _bad(path, f"header length {n} does not fit in a {size}-byte file")
            raw = f.read(n)
    except OSError as e:
        raise ConversionError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad(path, f"header is not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise _bad(path, "header is not a JSON object")
    return meta, n, size


def read_metadata(path: Path) -> dict[str, str]:
    """The `__metadata__` string map of the header of `path` (empty if none)."""
    meta = _header_json(path)[0].get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise _bad(path, "__metadata__ is not a map of strings")
    return meta


def read_header(path: Path) -> dict[str, TensorRef]:
    """Parse and validate the header of `path`; tensors sorted by name (as
    safetensors and llama.cpp's converter iterate them)."""

    meta, n, size = _header_json(path)
    data_start = 8 + n
    data_size = size - data_start
    out: dict[str, TensorRef] = {}
    for name, m in meta.items():
        if name == "__metadata__":
            continue
        if not isinstance(m, dict):
            raise _bad(path, f"entry {name!r} is not an object")
        dtype, shape, offs = m.get("dtype"), m.get("shape"), m.get("data_offsets")
        if dtype not in DTYPES:
            raise _bad(path, f"tensor {name!r} has unknown dtype {dtype!r}")
        if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise _bad(path, f"tensor {name!r} has invalid shape {shape!r}")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)
                and 0 <= offs[0] <= offs[1] <= data_size):
            raise _bad(path, f"tensor {name!r} has data_offsets {offs!r} outside the {data_size}-byte data section")
        nbytes = math.prod(shape) * DTYPES[dtype][1]
        if offs[1] - offs[0] != nbytes:
            raise _bad(path, f"tensor {name!r}: {dtype} {shape} needs {nbytes} bytes, data_offsets span {offs[1] - offs[0]}")
        out[name] = TensorRef(path, name, dtype, tuple(shape), data_start + offs[0], nbytes)
    return dict(sorted(out.items()))


def read_raw(ref: TensorRef, rows: tuple[int, int] | None = None) -> np.ndarray:
    """The stored elements of `ref` (or of rows [r0, r1) of its first axis), in
    the storage dtype of DTYPES."""
    shape = ref.shape
    offset, nbytes = ref.offset, ref.nbytes
    if rows is not None:
        r0, r1 = rows
        offset += r0 * ref.row_nbytes
        nbytes = (r1 - r0) * ref.row_nbytes
        shape = (r1 - r0, *shape[1:])
    buf = np.empty(nbytes, dtype=np.uint8)
    try:
        with open(ref.file, "rb") as f:
            f.seek(offset)
            got = f.readinto(memoryview(buf))
    except OSError as e:
        raise ConversionError(f"cannot read tensor {ref.name!r} from {ref.file}: {e.strerror or e}") from None
    if got != nbytes:
        raise ConversionError(f"{ref.file}: truncated data for tensor {ref.name!r} ({got} of {nbytes} bytes)")
    return buf.view(DTYPES[ref.dtype][0]).reshape(shape)


def read_float(ref: TensorRef, rows: tuple[int, int] | None = None) -> np.ndarray:
    """A float tensor as llama.cpp's converter computes with it: F32 and F16
    stay as they are, BF16 and F64 become F32."""
    a = read_raw(ref, rows)
    if ref.dtype == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    if ref.dtype == "F64":
        return a.astype(np.float32)
    if ref.dtype in ("F32", "F16"):
        return a
    raise ConversionError(f"tensor {ref.name!r} in {ref.file} has dtype {ref.dtype}, not a float type")
