"""GGUF tokenizer metadata from a Hugging Face tokenizer directory.

`gguf_tokenizer_fields_from_hf(src_dir)` returns the tokenizer.* keys that
llama.cpp's convert_hf_to_gguf.py writes for a Qwen3.5 model (its
get_vocab_base + gguf.SpecialVocab path), as plain Python values, read
straight from tokenizer.json / tokenizer_config.json / chat_template.jinja
(/ config.json for fallback special ids) without transformers.

Differences from upstream, all irrelevant for Qwen vocabularies:
- the pre-tokenizer name is found by comparing the tokenizer.json split regex
  (upstream hashes the ids of a probe text);
- non-normalized added tokens are taken verbatim (upstream round-trips them
  through AutoTokenizer, a no-op for Qwen's ASCII added tokens).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["gguf_tokenizer_fields_from_hf", "TOKEN_TYPE"]

TOKEN_TYPE = {"normal": 1, "unknown": 2, "control": 3, "user_defined": 4, "unused": 5, "byte": 6}

# tokenizer.json split regexes -> llama.cpp pre-tokenizer names
_PRE_BY_REGEX = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen35",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
}

# SpecialVocab types that the GGUF writer has a key for
_SPECIAL_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "sep": "tokenizer.ggml.seperator_token_id",  # sic, as in gguf-py
    "pad": "tokenizer.ggml.padding_token_id",
    "mask": "tokenizer.ggml.mask_token_id",
}
_SPECIAL_TYPES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON: {e}") from None


def _looks_special(text: str) -> bool:
    # convert_hf_to_gguf.py does_token_look_special
    return (
        text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (text.startswith("<|") and text.endswith("|>"))
        or (text.startswith("<｜") and text.endswith("｜>"))
        or (text.startswith("<unused") and text.endswith(">"))
    )


def _split_regexes(pre: Any) -> list[str]:
    if not isinstance(pre, dict):
        return []
    if pre.get("type") == "Sequence":
        out: list[str] = []
        for p in pre.get("pretokenizers") or []:
            out += _split_regexes(p)
        return out
    if pre.get("type") == "Split":
        pattern = pre.get("pattern") or {}
        if "Regex" in pattern:
            return [pattern["Regex"]]
    return []


def _detect_pre(tokenizer: dict, path: Path) -> str:
    regexes = _split_regexes(tokenizer.get("pre_tokenizer"))
    for r in regexes:
        if r in _PRE_BY_REGEX:
            return _PRE_BY_REGEX[r]
    raise ValueError(
        f"{path}: unsupported pre-tokenizer (split regex {regexes[0]!r})" if regexes
        else f"{path}: no split-regex pre-tokenizer found (only Qwen byte-level BPE is supported)"
    )


def _merges(model: dict, path: Path) -> list[str]:
    merges = model.get("merges")
    if not isinstance(merges, list) or not merges:
        raise ValueError(f"{path}: model.merges is missing or empty (llama.cpp rejects a BPE vocab without merges)")
    if all(isinstance(m, str) for m in merges):
        return list(merges)
    out = []
    for m in merges:
        if not (isinstance(m, list) and len(m) == 2 and all(isinstance(s, str) for s in m)):
            raise ValueError(f"{path}: unknown merges entry {m!r}")
        # gguf-py: spaces inside a merge part are written as U+0120
        out.append(" ".join("".join(chr(ord(c) + 256) if c == " " else c for c in s) for s in m))
    return out


def _template_processing_add_bos(processor: dict, bos: str | None) -> bool | None:
    single = processor.get("single") or []
    if len(single) > 1:
        first = (single[0].get("SpecialToken") or {}).get("id")
        if first:
            return first == bos
    return None


def gguf_tokenizer_fields_from_hf(src_dir: str | Path, vocab_size: int | None = None) -> dict[str, Any]:
    """GGUF tokenizer.* fields for a Qwen3.5 (or Qwen2) HF tokenizer directory.

    vocab_size: the model's embedding rows (config vocab_size); ids below it
    that the tokenizer does not define become "[PAD{i}]" tokens of type
    UNUSED, as llama.cpp pads. Default: highest tokenizer id + 1.
    Raises ValueError naming the missing file or key on bad input.
    """
    src = Path(src_dir)
    if not src.is_dir():
        raise ValueError(f"{src}: not a directory")
    tok_path = src / "tokenizer.json"
    if not tok_path.is_file():
        raise ValueError(f"{src}: missing tokenizer.json")
    tokenizer = _read_json(tok_path)
    cfg_path = src / "tokenizer_config.json"
    tok_cfg: dict | None = _read_json(cfg_path) if cfg_path.is_file() else None
    if tok_cfg is not None and not isinstance(tok_cfg, dict):
        raise ValueError(f"{cfg_path}: expected a JSON object")
    model_cfg_path = src / "config.json"
    model_cfg = _read_json(model_cfg_path) if model_cfg_path.is_file() else None

    model = tokenizer.get("model") if isinstance(tokenizer, dict) else None
    if not isinstance(model, dict):
        raise ValueError(f"{tok_path}: missing key 'model'")
    if model.get("type", "BPE") != "BPE":
        raise ValueError(f"{tok_path}: model.type is {model.get('type')!r}, only byte-level 'BPE' is supported")
    base_vocab = model.get("vocab")
    if not isinstance(base_vocab, dict) or not base_vocab:
        raise ValueError(f"{tok_path}: missing key 'model.vocab'")
    pre = _detect_pre(tokenizer, tok_path)
    merges = _merges(model, tok_path)

    added = tokenizer.get("added_tokens") or []
    if not isinstance(added, list):
        raise ValueError(f"{tok_path}: 'added_tokens' must be a list")
    id_to_text: dict[int, str] = {}
    for text, i in base_vocab.items():
        if not isinstance(i, int) or i < 0:
            raise ValueError(f"{tok_path}: bad id {i!r} for token {text!r}")
        id_to_text[i] = text
    added_by_id: dict[int, dict] = {}
    for a in added:
        if not isinstance(a, dict) or not isinstance(a.get("id"), int) or not isinstance(a.get("content"), str):
            raise ValueError(f"{tok_path}: malformed added_tokens entry {a!r}")
        added_by_id[a["id"]] = a
        id_to_text[a["id"]] = a["content"]
    added_texts = {a["content"] for a in added}

    n_tok = max(id_to_text) + 1
    n_vocab = n_tok if vocab_size is None else int(vocab_size)
    if n_vocab < n_tok:
        raise ValueError(f"vocab_size {n_vocab} is smaller than the tokenizer's highest id + 1 ({n_tok})")

    tokens: list[str] = []
    types: list[int] = []
    for i in range(n_vocab):
        text = id_to_text.get(i)
        if text is None:
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_TYPE["unused"])
        elif text in added_texts:
            a = added_by_id.get(i, {})
            if a.get("special") or _looks_special(text):
                types.append(TOKEN_TYPE["control"])
            else:
                text = text.replace("\u2581", " ")  # upstream pre-normalizes user-defined spaces
                types.append(TOKEN_TYPE["user_defined"])
            tokens.append(text)
        else:
            tokens.append(text)
            types.append(TOKEN_TYPE["normal"])

    fields: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
    }

    # -- gguf.SpecialVocab: special ids, add_*_token, chat template --------
    cfg = dict(tok_cfg or {})

    def tok_str(key: str) -> str | None:
        v = cfg.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        return v if isinstance(v, str) else None

    add_special: dict[str, bool] = {}
    if not tok_str("bos_token") and tok_str("cls_token") and tok_cfg:
        cfg["bos_token"] = tok_str("cls_token")
    if not tok_str("eos_token") and tok_str("sep_token") and tok_cfg:
        cfg["eos_token"] = tok_str("sep_token")
    post = tokenizer.get("post_processor")
    if isinstance(post, dict):
        for proc in post.get("processors", [post]) if post.get("type") == "Sequence" else [post]:
            if not isinstance(proc, dict):
                continue
            if proc.get("type") == "ByteLevel":
                add_special.setdefault("bos", False)
                add_special.setdefault("eos", False)
            elif proc.get("type") == "TemplateProcessing":
                bos_added = _template_processing_add_bos(proc, tok_str("bos_token"))
                if bos_added is not None:
                    add_special["bos"] = bos_added

    ids: dict[str, int] = {}
    if tok_cfg:
        for typ in _SPECIAL_TYPES:
            entry = cfg.get(f"add_{typ}_token")
            if isinstance(entry, bool) and typ not in add_special:
                add_special[typ] = entry
            text = tok_str(f"{typ}_token")
            if text is None:
                continue
            tid = next((a["id"] for a in added if a["content"] == text), None)
            if isinstance(tid, int) and tid < n_vocab and typ not in ids:
                ids[typ] = tid
    if isinstance(model_cfg, dict):
        for typ in _SPECIAL_TYPES:
            tid = model_cfg.get(f"{typ}_token_id")
            if tid is None and isinstance(model_cfg.get("text_config"), dict):
                tid = model_cfg["text_config"].get(f"{typ}_token_id")
            if isinstance(tid, int) and not isinstance(tid, bool) and 0 <= tid < n_vocab and typ not in ids:
                ids[typ] = tid
    if "eos" not in ids:
        raise ValueError(f"{src}: no eos token (tokenizer_config.json 'eos_token' or config.json 'eos_token_id')")
    for typ, tid in ids.items():
        if typ in _SPECIAL_KEYS:
            fields[_SPECIAL_KEYS[typ]] = tid
    for typ in ("bos", "eos", "sep"):
        if typ in add_special:
            fields[f"tokenizer.ggml.add_{typ}_token"] = add_special[typ]

    template: Any = None
    if tok_cfg:
        alt = None
        if (src / "chat_template.jinja").is_file():
            alt = (src / "chat_template.jinja").read_text(encoding="utf-8")
        elif (src / "chat_template.json").is_file():
            ct = _read_json(src / "chat_template.json")
            alt = ct.get("chat_template") if isinstance(ct, dict) else None
        template = tok_cfg.get("chat_template", alt)
    if isinstance(template, list):
        named = {}
        for choice in template:
            if not isinstance(choice, dict):
                continue
            name = "".join(c if c.isascii() and c.isalnum() else "_" for c in str(choice.get("name", "")))
            if name and choice.get("template") is not None:
                named[name] = choice["template"]
        template = named.pop("default", None)
        for name, t in named.items():
            fields[f"tokenizer.chat_template.{name}"] = t
        if named:
            fields["tokenizer.chat_templates"] = list(named)
    if isinstance(template, str):
        fields["tokenizer.chat_template"] = template

    norm = tokenizer.get("normalizer")
    lower, strip = _normalizer_flags(norm)
    if lower is not None:
        fields["tokenizer.ggml.normalizer.lowercase"] = lower
    if strip is not None:
        fields["tokenizer.ggml.normalizer.strip_accents"] = strip
    return fields


def _normalizer_flags(norm: Any) -> tuple[bool | None, bool | None]:
    lower = strip = None
    if not isinstance(norm, dict):
        return lower, strip
    t = norm.get("type")
    if t == "Lowercase":
        lower = True
    elif t == "StripAccents":
        strip = True
    elif t == "BertNormalizer":
        lower = norm.get("lowercase", lower)
        strip = norm.get("strip_accents", strip)
    elif t == "Sequence":
        for n in norm.get("normalizers") or []:
            l2, s2 = _normalizer_flags(n)
            lower = l2 if l2 is not None else lower
            strip = s2 if s2 is not None else strip
    return lower, strip
