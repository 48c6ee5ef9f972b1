"""Qwen3.5-style tokenizers: the tiny one for tests, and the trainer behind it.

`train_qwen35_tokenizer(texts, vocab_size)` trains a byte-level BPE with the
Qwen3.5 pre-tokenizer (NFC + split regex + byte-level) and appends the
Qwen3.5 added tokens in their real order; `write_tokenizer(dst_dir, tok)`
writes tokenizer.json + tokenizer_config.json (with the Qwen3.5 chat
template) that `transformers.AutoTokenizer.from_pretrained(dst_dir)` loads.
`write_tiny_tokenizer(dst_dir)` does both on a built-in English/code corpus
(the shipped default model's vocabulary is trained with the same function
on its corpus: pyqwen/models/training/build_data.py).

Training is deterministic: same texts and vocab_size, same files (byte for byte).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

QWEN35_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3.5 added tokens in id order; False = added but not "special"
# (llama.cpp: user-defined, matched even when parse_special is off).
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
)

CHAT_TEMPLATE_PATH = Path(__file__).resolve().parents[1] / "pyqwen" / "data" / "qwen35_chat_template.jinja"

_ENGLISH = """\
The quick brown fox jumps over the lazy dog. A small language model reads one
token at a time and predicts the next one. Tokenizers split text into pieces;
byte-level BPE never fails, because every byte is a token of its own.
It's a long way to the top, but we're getting there: they'll see, you'd agree.
In 1969 the first people walked on the Moon; 2024 was a leap year with 366 days.
Hello, world! How are you today? I'm fine, thanks. What time is it? It is 10:45.
Once upon a time there was a little robot who loved to count: one, two, three,
four, five, six, seven, eight, nine, ten. The robot lived in a house by the sea.
Every morning it walked along the beach and collected shells of many colours:
red, orange, yellow, green, blue, indigo and violet. The sun was warm and bright.
Science is the art of asking good questions. Mathematics is the language of
nature. Music is the space between the notes. Writing is thinking on paper.
Please summarise the following paragraph in three sentences or fewer.
You are a helpful assistant. Answer the question as clearly as you can.
The weather in Paris is mild in spring, hot in summer and rainy in autumn.
Température, café, naïve, résumé, Zürich, São Paulo, façade, jalapeño.
"""

_CODE = '''\
def fibonacci(n: int) -> list[int]:
    """Return the first n Fibonacci numbers."""
    out = [0, 1]
    while len(out) < n:
        out.append(out[-1] + out[-2])
    return out[:n]


class Counter:
    def __init__(self, start=0):
        self.value = start

    def increment(self, step=1):
        self.value += step
        return self.value


for i in range(10):
    if i % 2 == 0:
        print(f"{i} is even")
    else:
        print(f"{i} is odd")

import json, os, sys
data = {"name": "pyqwen", "version": "0.1.0", "tags": ["llm", "ggml"]}
print(json.dumps(data, indent=2))

#include <stdio.h>
#include <stdint.h>
static int32_t add(int32_t a, int32_t b) { return a + b; }
int main(void) {
\tfor (int i = 0; i < 16; ++i) {
\t\tprintf("%d\\n", add(i, i * 2));
\t}
\treturn 0;
}

function greet(name) {
  const msg = `Hello, ${name}!`;
  console.log(msg);
  return msg.length;
}

SELECT id, name FROM users WHERE age >= 18 ORDER BY name ASC LIMIT 100;
$ git commit -m "fix: handle empty input" && git push origin main
'''


def corpus() -> list[str]:
    """The built-in training corpus, one string per line."""
    lines = (_ENGLISH + _CODE).splitlines(keepends=True)
    # a little deterministic variety so the trainer finds enough merges
    words = [w for w in _ENGLISH.split() if w.isalpha()]
    extra = []
    for i in range(400):
        a, b, c = words[i % len(words)], words[(i * 7 + 3) % len(words)], words[(i * 13 + 5) % len(words)]
        extra.append(f"{a} {b.lower()} {c}, {i * 37 % 1000} {b}_{c.lower()}({i});\n")
    return lines * 4 + extra


def train_qwen35_tokenizer(texts: Iterable[str], vocab_size: int, *, min_frequency: int = 0) -> Tokenizer:
    """Train a Qwen3.5-style byte-level BPE on `texts`; len(vocab) == vocab_size.

    Ids: 0..vocab_size-34 are BPE tokens (the first 256 are the bytes), the
    last 33 are the Qwen3.5 added tokens in order (<|endoftext|> first).
    """
    n_bpe = vocab_size - len(ADDED_TOKENS)
    if n_bpe < 256 + 16:
        raise ValueError(f"vocab_size {vocab_size} too small (need >= {256 + 16 + len(ADDED_TOKENS)})")
    tok = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN35_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = BpeTrainer(
        vocab_size=n_bpe,
        min_frequency=min_frequency,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(texts, trainer=trainer)
    got = tok.get_vocab_size(with_added_tokens=False)
    if got != n_bpe:
        raise RuntimeError(f"the corpus gave {got} BPE tokens, wanted {n_bpe}; lower vocab_size")
    for text, special in ADDED_TOKENS:
        t = AddedToken(text, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        if special:
            tok.add_special_tokens([t])
        else:
            tok.add_tokens([t])
    return tok


def build_tiny_tokenizer(vocab_size: int = 1024) -> Tokenizer:
    """Train the tiny tokenizer in memory on the built-in corpus; len(vocab) == vocab_size.
    The built-in corpus supports vocab_size up to about 1200 (RuntimeError beyond)."""
    return train_qwen35_tokenizer(corpus(), vocab_size)


def write_tokenizer(dst_dir, tok: Tokenizer) -> Path:
    """Write tokenizer.json + tokenizer_config.json for a tokenizer made by
    train_qwen35_tokenizer: eos = <|im_end|>, pad = <|endoftext|>, no BOS,
    the Qwen3.5 chat template. Returns dst_dir as Path."""
    dst = Path(dst_dir)
    dst.mkdir(parents=True, exist_ok=True)
    tok.save(str(dst / "tokenizer.json"), pretty=True)

    first = tok.get_vocab_size(with_added_tokens=True) - len(ADDED_TOKENS)
    added = {
        str(first + i): {
            "content": text,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for i, (text, special) in enumerate(ADDED_TOKENS)
    }
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE_PATH.read_text(encoding="utf-8"),
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen3_5Tokenizer",
        "unk_token": None,
    }
    (dst / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return dst


def write_tiny_tokenizer(dst_dir, vocab_size: int = 1024) -> Path:
    """write_tokenizer() of the tiny tokenizer (see build_tiny_tokenizer)."""
    return write_tokenizer(dst_dir, build_tiny_tokenizer(vocab_size))
