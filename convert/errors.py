"""The one exception pyqwen-convert raises for bad input."""

from __future__ import annotations


class ConversionError(Exception):
    """Input that cannot be converted: missing files, unknown architecture,
    shape mismatch, corrupt safetensors, unsupported quantization, ...

    The message names the offending thing; the CLI prints it as
    `pyqwen-convert: error: <msg>` and exits 1.
    """
