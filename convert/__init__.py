"""pyqwen-convert: Hugging Face Qwen3.5 / Qwen3.5-MoE / Qwen3-Next checkpoints
-> GGUF (llama.cpp `qwen35` / `qwen35moe` / `qwen3next`).

    from pyqwen.convert import convert
    res = convert("Qwen3.5-9B-W4A8", "qwen3.5-9b.gguf")   # outtype="auto"
    [r.line() for r in res.reports]                       # per tensor: exact, or max/RMS error

Inputs: float safetensors, FP8 (block-scaled), GPTQ, AWQ (GEMM) and
compressed-tensors (int-quantized, pack-quantized, float-quantized), see
layouts.py. The output is what llama.cpp's convert_hf_to_gguf.py writes for
the same (dequantized) checkpoint (tensors, transforms, metadata), except the
types: `auto` keeps quantized weights in their lossless ggml type, and q4_0 /
q4_k / q6_k are extra. `pyqwen.converter.*` keys add the converter version and
the per-tensor report.
"""

from __future__ import annotations

from .core import CONVERTER_VERSION, REPORT_KEYS, VERSION_KEY, ConvertResult, convert, plan_model
from .errors import ConversionError
from .plan import OUTTYPES, Report

__all__ = ["convert", "plan_model", "ConversionError", "ConvertResult", "Report", "OUTTYPES",
           "CONVERTER_VERSION", "VERSION_KEY", "REPORT_KEYS"]
