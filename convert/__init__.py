"""pyqwen-convert: Hugging Face Qwen3.5 checkpoints -> GGUF (llama.cpp `qwen35`).

    from pyqwen.convert import convert
    convert("Qwen3.5-9B", "qwen3.5-9b-q8_0.gguf", outtype="q8_0")

The output is what llama.cpp's convert_hf_to_gguf.py writes for the same
checkpoint (tensors, types, transforms, metadata), plus
`pyqwen.converter.version`, and an extra `--outtype q4_0`.
"""

from __future__ import annotations

from .core import CONVERTER_VERSION, VERSION_KEY, ConvertResult, convert, plan_model
from .errors import ConversionError
from .plan import OUTTYPES

__all__ = ["convert", "plan_model", "ConversionError", "ConvertResult", "OUTTYPES",
           "CONVERTER_VERSION", "VERSION_KEY"]
