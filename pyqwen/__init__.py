"""pyqwen: fast local Qwen3.x text generation from Python, on a patched ggml."""
from ._native import ContextOverflowError, ModelLoadError, __version__, backend_name
from .llama import Llama

__all__ = ["Llama", "ModelLoadError", "ContextOverflowError", "backend_name", "__version__"]
