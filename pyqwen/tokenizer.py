"""Byte-level BPE tokenizer built from GGUF tokenizer fields.

The BPE itself runs in the `tokenizers` package; this module only translates
the GGUF vocabulary (as llama.cpp's converter writes it) into that package's
objects and reproduces llama.cpp's rules around it:

- pre-tokenizer regex chosen by `tokenizer.ggml.pre` ("qwen35" or "qwen2");
- CONTROL/UNKNOWN tokens (e.g. "<|im_start|>") are recognised in the input
  only when `parse_special=True`; USER_DEFINED tokens (e.g. "<think>") are
  always recognised, as in llama.cpp and transformers;
- no whole-word shortcut (`ignore_merges` is off for these pre-tokenizers);
- decode is exact bytes: NORMAL tokens through the GPT-2 byte map,
  CONTROL/USER_DEFINED tokens as their UTF-8 text, UNUSED tokens as nothing.

One deliberate difference from llama.cpp: text is NFC-normalised before BPE,
as the Qwen tokenizer.json (and Qwen's own tiktoken encoder) do; llama.cpp
skips that step, so it differs only on non-NFC input.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers.models import BPE

__all__ = [
    "Tokenizer",
    "TOKEN_TYPE_NORMAL",
    "TOKEN_TYPE_UNKNOWN",
    "TOKEN_TYPE_CONTROL",
    "TOKEN_TYPE_USER_DEFINED",
    "TOKEN_TYPE_UNUSED",
    "TOKEN_TYPE_BYTE",
]

# gguf TokenType / llama.cpp token attributes
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

# pre-tokenizer regexes, as in each model's tokenizer.json (llama-vocab.cpp)
PRE_REGEX = {
    "qwen35": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
        r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
    "qwen2": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    ),
}

# tokens llama.cpp treats as end-of-generation by their text
_EOG_TEXTS = ("<|im_end|>", "<|endoftext|>")

_KEY = "tokenizer.ggml."


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_ENCODER: dict[int, str] = _bytes_to_unicode()
BYTE_DECODER: dict[str, int] = {c: b for b, c in BYTE_ENCODER.items()}
# str.translate table: byte-level char -> latin-1 char of that byte; any
# other char below 256 -> U+FFFF so that .encode("latin-1") rejects it
_DECODE_TABLE = {ord(c): b for c, b in BYTE_DECODER.items()}
_DECODE_TABLE.update({i: 0xFFFF for i in range(256) if i not in _DECODE_TABLE})


def _field(fields: Mapping[str, Any], name: str, default: Any = ..., kind: type | tuple[type, ...] | None = None) -> Any:
    key = _KEY + name
    if key not in fields or fields[key] is None:
        if default is ...:
            raise ValueError(f"GGUF tokenizer field {key!r} is missing")
        return default
    value = fields[key]
    if kind is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        raise ValueError(f"GGUF tokenizer field {key!r} has type {type(value).__name__}, expected {kind}")
    return value


class Tokenizer:
    """Qwen byte-level BPE tokenizer (llama.cpp "gpt2" model) on `tokenizers`.

    Build it with `Tokenizer.from_gguf_fields(fields)`. Ids are GGUF ids.
    Thread-safe for concurrent encode/decode (no mutable state after init).
    """

    def __init__(
        self,
        tokens: list[str],
        token_types: list[int],
        merges: list[str],
        *,
        pre: str = "qwen35",
        eos_id: int | None = None,
        bos_id: int | None = None,
        pad_id: int | None = None,
        eot_id: int | None = None,
        eom_id: int | None = None,
        add_bos: bool = False,
        add_eos: bool = False,
    ) -> None:
        if pre not in PRE_REGEX:
            raise ValueError(f"unsupported tokenizer pre-type {pre!r} (supported: {', '.join(PRE_REGEX)})")
        n = len(tokens)
        if n == 0:
            raise ValueError("token list is empty")
        if len(token_types) != n:
            raise ValueError(f"token_type has {len(token_types)} entries, token list has {n}")
        if not merges:
            raise ValueError("merges are empty: a byte-level BPE vocab needs its merges")
        for name, tid in (("eos", eos_id), ("bos", bos_id), ("pad", pad_id), ("eot", eot_id), ("eom", eom_id)):
            if tid is not None and not 0 <= tid < n:
                raise ValueError(f"{name} token id {tid} out of range [0, {n})")
        if add_bos and bos_id is None:
            raise ValueError("add_bos_token is set but the vocab has no bos token id")
        if add_eos and eos_id is None:
            raise ValueError("add_eos_token is set but the vocab has no eos token id")

        self._tokens = list(tokens)
        self._types = [int(t) for t in token_types]
        self._pre = pre
        self._eos_id = eos_id
        self._bos_id = bos_id
        self._pad_id = pad_id
        self._add_bos = bool(add_bos)
        self._add_eos = bool(add_eos)

        vocab: dict[str, int] = {}
        for i, text in enumerate(self._tokens):
            if not isinstance(text, str):
                raise ValueError(f"token {i} is {type(text).__name__}, expected str")
            if text in vocab:
                raise ValueError(f"duplicate token text {text!r} at ids {vocab[text]} and {i}")
            vocab[text] = i

        added_special = []   # CONTROL / UNKNOWN: only with parse_special
        added_plain = []     # USER_DEFINED: always
        normal_text = []
        for i, (text, t) in enumerate(zip(self._tokens, self._types)):
            if t in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN):
                added_special.append(i)
            elif t == TOKEN_TYPE_USER_DEFINED:
                added_plain.append(i)
            elif t == TOKEN_TYPE_NORMAL:
                normal_text.append(text)
            elif t not in (TOKEN_TYPE_UNUSED, TOKEN_TYPE_BYTE):
                raise ValueError(f"token {i} ({text!r}) has unknown token type {t}")
        bad = set("".join(normal_text)) - BYTE_DECODER.keys()
        if bad:
            c = min(bad)
            raise ValueError(f"normal token contains {c!r} (U+{ord(c):04X}), not a GPT-2 byte-level character")
        for c in BYTE_ENCODER.values():
            if c not in vocab:
                raise ValueError(f"byte-level vocab lacks the single-byte token {c!r}")

        pairs: list[tuple[str, str]] = []
        for k, m in enumerate(merges):
            if not isinstance(m, str):
                raise ValueError(f"merge {k} is {type(m).__name__}, expected str")
            sp = m.find(" ", 1)  # llama.cpp: first space after position 0
            if sp < 0:
                raise ValueError(f"merge {k} {m!r} is not of the form 'a b'")
            a, b = m[:sp], m[sp + 1 :]
            if a not in vocab or b not in vocab or a + b not in vocab:
                raise ValueError(f"merge {k} {m!r} refers to a token missing from the vocab")
            pairs.append((a, b))

        model = BPE(vocab=vocab, merges=pairs, unk_token=None, fuse_unk=False, byte_fallback=False, ignore_merges=False)
        self._specials = frozenset(added_special)
        self._user_defined = frozenset(added_plain)
        self._hf = self._build(model, pre, added_special, added_plain, encode_special=False)
        self._hf_plain = self._build(model, pre, added_special, added_plain, encode_special=True)

        self._bytes: list[bytes | None] = [None] * n
        eog = {i for i in (eos_id, eot_id, eom_id) if i is not None}
        for text in _EOG_TEXTS:
            i = vocab.get(text)
            if i is not None and self._types[i] != TOKEN_TYPE_UNUSED:
                eog.add(i)
        self._eog = frozenset(eog)
        self._vocab = vocab

    def _build(self, model: BPE, pre: str, special: list[int], plain: list[int], *, encode_special: bool) -> _HFTokenizer:
        tok = _HFTokenizer(model)
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(PRE_REGEX[pre]), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ]
        )
        tok.decoder = decoders.ByteLevel()

        def added(ids: list[int], is_special: bool) -> list[AddedToken]:
            return [
                AddedToken(self._tokens[i], single_word=False, lstrip=False, rstrip=False, normalized=False, special=is_special)
                for i in ids
                if self._tokens[i]
            ]

        # the texts are already in the model vocab, so the added tokens keep their GGUF ids
        tok.add_special_tokens(added(special, True))
        tok.add_tokens(added(plain, False))
        tok.encode_special_tokens = encode_special
        return tok

    @classmethod
    def from_gguf_fields(cls, fields: Mapping[str, Any]) -> "Tokenizer":
        """Build from GGUF metadata given as plain Python values.

        Reads tokenizer.ggml.{model, pre, tokens, token_type, merges,
        eos_token_id, bos_token_id, padding_token_id, eot_token_id,
        eom_token_id, add_bos_token, add_eos_token}. Raises ValueError on an
        unsupported model/pre or malformed fields.
        """
        if not isinstance(fields, Mapping):
            raise ValueError(f"fields must be a mapping, got {type(fields).__name__}")
        model = _field(fields, "model", kind=str)
        if model != "gpt2":
            raise ValueError(f"unsupported tokenizer model {model!r} (only 'gpt2' byte-level BPE)")
        pre = _field(fields, "pre", kind=str)
        if pre not in PRE_REGEX:
            raise ValueError(f"unsupported tokenizer pre-type {pre!r} (supported: {', '.join(PRE_REGEX)})")
        tokens = _field(fields, "tokens", kind=(list, tuple))
        types = _field(fields, "token_type", kind=(list, tuple))
        if any(isinstance(t, bool) or not isinstance(t, int) for t in types):
            raise ValueError(f"GGUF tokenizer field {_KEY + 'token_type'!r} must hold integers")
        merges = _field(fields, "merges", default=None, kind=(list, tuple))
        if not merges:
            raise ValueError(f"GGUF tokenizer field {_KEY + 'merges'!r} is missing or empty")
        return cls(
            list(tokens),
            list(types),
            list(merges),
            pre=pre,
            eos_id=_field(fields, "eos_token_id", kind=int),
            bos_id=_field(fields, "bos_token_id", None, kind=int),
            pad_id=_field(fields, "padding_token_id", None, kind=int),
            eot_id=_field(fields, "eot_token_id", None, kind=int),
            eom_id=_field(fields, "eom_token_id", None, kind=int),
            add_bos=_field(fields, "add_bos_token", False, kind=bool),
            add_eos=_field(fields, "add_eos_token", False, kind=bool),
        )

    # -- encode / decode -------------------------------------------------

    def encode(self, text: str | bytes, add_special: bool = False, parse_special: bool = False) -> list[int]:
        """Text -> token ids.

        bytes are decoded as UTF-8 with errors="replace" (invalid bytes become
        U+FFFD, as they cannot be represented in the BPE input). add_special
        adds BOS (and EOS) only where the vocab says add_bos_token
        (add_eos_token). parse_special=True turns control-token text such as
        "<|im_start|>" into its id; False tokenizes it as plain text.
        """
        if isinstance(text, (bytes, bytearray, memoryview)):
            text = bytes(text).decode("utf-8", errors="replace")
        elif not isinstance(text, str):
            raise TypeError(f"text must be str or bytes, got {type(text).__name__}")
        hf = self._hf if parse_special else self._hf_plain
        ids = hf.encode(text, add_special_tokens=False).ids if text else []
        if add_special:
            if self._add_bos:
                ids.insert(0, self._bos_id)
            if self._add_eos:
                ids.append(self._eos_id)
        return ids

    def token_to_bytes(self, token_id: int, special: bool = True) -> bytes:
        """Exact bytes of one token. special=False renders control tokens as b""."""
        if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < len(self._tokens):
            raise ValueError(f"token id {token_id!r} out of range [0, {len(self._tokens)})")
        if not special and token_id in self._specials:
            return b""
        b = self._bytes[token_id]
        if b is None:
            b = self._piece(token_id)
            self._bytes[token_id] = b
        return b

    def _piece(self, i: int) -> bytes:
        text, t = self._tokens[i], self._types[i]
        if t == TOKEN_TYPE_NORMAL:
            return text.translate(_DECODE_TABLE).encode("latin-1")
        if t in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_USER_DEFINED):
            return text.encode("utf-8")
        if t == TOKEN_TYPE_BYTE and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            return bytes([int(text[3:5], 16)])
        return b""  # UNUSED (padding) tokens render as nothing, as in llama.cpp

    def decode(self, ids: Iterable[int], special: bool = True) -> bytes:
        """Token ids -> exact bytes (no UTF-8 clean-up).

        special=False drops control tokens (llama.cpp's unparse_special=False).
        Raises ValueError naming the first out-of-range id.
        """
        return b"".join([self.token_to_bytes(i, special) for i in ids])

    # -- vocab info ------------------------------------------------------

    def token_to_id(self, text: str) -> int | None:
        """GGUF id of a token given its vocab text (byte-level form for normal tokens)."""
        return self._vocab.get(text)

    def token_text(self, token_id: int) -> str:
        """The token's text as stored in the vocab."""
        self.token_to_bytes(token_id)  # range check
        return self._tokens[token_id]

    def token_type(self, token_id: int) -> int:
        self.token_to_bytes(token_id)
        return self._types[token_id]

    @property
    def n_vocab(self) -> int:
        return len(self._tokens)

    @property
    def pre(self) -> str:
        return self._pre

    @property
    def eos_id(self) -> int | None:
        return self._eos_id

    @property
    def bos_id(self) -> int | None:
        return self._bos_id

    @property
    def pad_id(self) -> int | None:
        return self._pad_id

    @property
    def add_bos(self) -> bool:
        return self._add_bos

    @property
    def eog_ids(self) -> frozenset[int]:
        """End-of-generation ids: eos (eot, eom) plus <|im_end|> and <|endoftext|> when present."""
        return self._eog

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of control/unknown tokens (recognised only with parse_special) and user-defined ones."""
        return self._specials | self._user_defined

    @property
    def control_ids(self) -> frozenset[int]:
        """Ids of control/unknown tokens only."""
        return self._specials

    def __repr__(self) -> str:
        return f"Tokenizer(n_vocab={self.n_vocab}, pre={self._pre!r}, eos_id={self._eos_id}, bos_id={self._bos_id})"
