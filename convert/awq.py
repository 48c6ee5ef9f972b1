"""AWQ checkpoints in the GEMM layout (`quant_method: "awq"`, `version: "gemm"`; AutoAWQ).

Per quantized module `P`: `P.qweight` I32 [K, N/8] packed along N, nibble p of
word c holding column 8c + [0, 2, 4, 6, 1, 3, 5, 7][p]; `P.qzeros` I32
[K/G, N/8] in the same order; `P.scales` F16 [K/G, N]. W[n, k] = (u - z) * s.
"""

from __future__ import annotations

from typing import Any

from .errors import ConversionError
from .gptq import packed_int_module, packed_int_tensors
from .layouts import SourceTensor
from .safetensors_reader import TensorRef

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


class AWQLayout:
    name = "awq (gemm)"

    def matches(self, q: dict[str, Any] | None, stored: dict[str, TensorRef]) -> bool:
        return bool(q) and q.get("quant_method") == "awq"

    def logical_tensors(self, stored: dict[str, TensorRef], q: dict[str, Any]) -> dict[str, SourceTensor]:
        version = str(q.get("version", "gemm")).lower()
        if version != "gemm":
            raise ConversionError(f"quantization_config.version={q.get('version')!r}: only AWQ's GEMM layout is supported")
        if q.get("bits", q.get("w_bit", 4)) != 4:
            raise ConversionError(f"quantization_config.bits={q.get('bits', q.get('w_bit'))!r}: AWQ GEMM is 4-bit")
        if q.get("zero_point", True) is not True:
            raise ConversionError("quantization_config.zero_point=false: AWQ GEMM without zero points is not supported")
        return packed_int_tensors(stored, "AWQ", lambda module, refs: packed_int_module(
            module, refs, 4, False, 0, "awq gemm", AWQ_ORDER, along_k=False))
