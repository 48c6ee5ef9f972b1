"""pyqwen.Llama: the Python API, in the spirit of llama-cpp-python's Llama."""
from __future__ import annotations

import os
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ._native import ContextOverflowError, ModelLoadError, NativeContext, NativeModel, Sampling, check_token_ids
from .chat import render_chat
from .gguf_header import read_header
from .tokenizer import Tokenizer

_METADATA_PREFIXES = ("tokenizer.", "general.")


def read_metadata(path: str) -> dict[str, Any]:
    """Tokenizer and general metadata of a GGUF file, as plain Python values."""
    try:
        return read_header(path, _METADATA_PREFIXES).metadata
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read the metadata of {path}: {e}") from e


def _check_model_path(model_path: str | os.PathLike) -> str:
    path = Path(model_path)
    if not path.exists():
        raise FileNotFoundError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelLoadError(f"{path} is not a file")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ModelLoadError(f"{path} is not a GGUF file (convert a Hugging Face checkpoint with pyqwen-convert)")
    return str(path)


class _Utf8Stream:
    """Turns token bytes into text without splitting multi-byte characters across chunks."""

    def __init__(self):
        self.pending = b""

    def push(self, data: bytes) -> str:
        self.pending += data
        for cut in range(len(self.pending), max(len(self.pending) - 4, -1), -1):
            try:
                text = self.pending[:cut].decode("utf-8")
            except UnicodeDecodeError:
                continue
            self.pending = self.pending[cut:]
            return text
        text = self.pending.decode("utf-8", "replace")
        self.pending = b""
        return text

    def flush(self) -> str:
        text, self.pending = self.pending.decode("utf-8", "replace"), b""
        return text


DEFAULT_N_CTX = 4096  # n_ctx of None: this, or the model's training context where that is shorter


def _check_seed(seed) -> int | None:
    """A seed as numpy takes it: None (a fresh random one) for None or -1 (llama.cpp's "random"), else a
    non-negative integer."""
    if seed is None or (type(seed) is int and seed == -1):
        return None
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, or None or -1 for a random one, got {seed!r}")
    return seed


class Llama:
    """A loaded Qwen3.5 model with one inference context.

    >>> with Llama("model.gguf", n_ctx=2048) as llm:
    ...     print(llm("The capital of France is", max_tokens=8)["choices"][0]["text"])

    n_ctx of None (the default) is DEFAULT_N_CTX tokens, or the model's training context where that is shorter; a
    larger one than the model was trained on works, with a warning.
    """

    _model: NativeModel | None = None  # class defaults keep close() safe after a failed __init__
    _ctx: NativeContext | None = None

    def __init__(self, model_path: str | os.PathLike, *, n_ctx: int | None = None, n_batch: int = 512,
                 n_threads: int | None = None, n_gpu_layers: int = 0, seed: int | None = None,
                 verbose: bool = False, type_k: str = "f16", type_v: str = "f16"):
        if n_ctx is not None and (not isinstance(n_ctx, int) or n_ctx <= 0):
            raise ValueError(f"n_ctx must be a positive integer or None, got {n_ctx!r}")
        if not isinstance(n_batch, int) or n_batch <= 0:
            raise ValueError(f"n_batch must be a positive integer, got {n_batch!r}")
        if n_threads is not None and (not isinstance(n_threads, int) or n_threads <= 0):
            raise ValueError(f"n_threads must be a positive integer or None, got {n_threads!r}")
        if not isinstance(n_gpu_layers, int):
            raise ValueError(f"n_gpu_layers must be an integer (-1 = all layers), got {n_gpu_layers!r}")
        seed = _check_seed(seed)
        self.model_path = _check_model_path(model_path)
        self.verbose = verbose
        self._model = NativeModel(self.model_path, n_gpu_layers=n_gpu_layers, n_threads=n_threads, verbose=verbose)
        try:
            self.metadata = read_metadata(self.model_path)
            self.tokenizer = Tokenizer.from_gguf_fields(self.metadata)
            if self.tokenizer.n_vocab > self._model.info.n_vocab:
                raise ModelLoadError(f"the vocabulary ({self.tokenizer.n_vocab} tokens) is larger than the "
                                     f"embedding ({self._model.info.n_vocab} rows)")
            n_ctx_train = self._model.info.n_ctx_train
            if n_ctx is None:
                n_ctx = min(DEFAULT_N_CTX, n_ctx_train) if n_ctx_train > 0 else DEFAULT_N_CTX
            elif n_ctx > n_ctx_train > 0:
                warnings.warn(f"n_ctx={n_ctx} is beyond the {n_ctx_train} tokens the model was trained on: "
                              "past them its output may degrade", stacklevel=2)
            self._ctx = NativeContext(self._model, n_ctx=n_ctx, n_batch=n_batch, type_k=type_k, type_v=type_v)
        except BaseException:
            self._model.close()
            raise
        self.n_batch = n_batch
        self._rng = np.random.default_rng(seed)
        self.chat_template = self.metadata.get("tokenizer.chat_template")

    # ---- lifetime ----
    def close(self) -> None:
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
        if self._model is not None:
            self._model.close()
            self._model = None

    def __enter__(self) -> "Llama":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()

    @property
    def _context(self) -> NativeContext:
        if self._ctx is None:
            raise RuntimeError("this Llama is closed")
        return self._ctx

    # ---- properties ----
    def n_ctx(self) -> int:
        return self._context.n_ctx

    def n_vocab(self) -> int:
        return self._context.n_vocab

    @property
    def info(self):
        return self._model.info

    def token_eos(self) -> int | None:
        return self.tokenizer.eos_id

    # ---- tokens ----
    def tokenize(self, text: str | bytes, add_special: bool = False, parse_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        return self.tokenizer.decode(tokens)

    # ---- evaluation ----
    def reset(self) -> None:
        self._context.reset()

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits at every position, [len(tokens), n_vocab] float32, from a fresh state."""
        ctx = self._context
        ctx.reset()
        out = ctx.eval(tokens, logits="all")
        ctx.reset()
        return out

    def generate(self, tokens: Sequence[int], *, temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, repeat_penalty: float = 1.0, repeat_last_n: int = 64,
                 seed: int | None = None) -> Iterator[int]:
        """Sampled token ids after the prompt tokens, until prompt + output fill n_ctx.

        The options and the prompt are checked at the call; the state is reset when the first id is asked
        for. Decoding and sampling run in the runtime (greedy as an argmax inside the graph), a few tokens
        per call: Python passes one random number per token and sees the tokens in chunks that grow from
        1 to 16 (a chunk ends early at an end-of-generation token), so the first token streams at once and
        a consumer that stops early wastes little.
        """
        c_sampling = Sampling(temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n).to_c()
        seed = _check_seed(seed)
        rng = np.random.default_rng(seed) if seed is not None else self._rng
        prompt = list(tokens)
        self._check_prompt(prompt)
        return self._sampled(prompt, c_sampling, rng, repeat_penalty, repeat_last_n)

    def _sampled(self, prompt: list[int], c_sampling, rng, repeat_penalty: float, repeat_last_n: int) -> Iterator[int]:
        ctx = self._context
        ctx.reset()
        if len(prompt) > 1:
            ctx.eval(prompt[:-1], logits="none")
        window = repeat_last_n if repeat_last_n > 0 else len(prompt) + ctx.n_ctx
        history = np.array(prompt[-window:], dtype=np.int32)
        stop = np.array(sorted(self.tokenizer.eog_ids), dtype=np.int32)
        last, chunk = prompt[-1], 1
        while ctx.n_past < ctx.n_ctx - 1:
            n = min(chunk, ctx.n_ctx - 1 - ctx.n_past)
            picked = ctx.generate(last, n, c_sampling, history, rng.random(n), stop)
            if repeat_penalty != 1.0:
                history = np.concatenate([history, picked])[-window:]
            yield from picked.tolist()
            last, chunk = int(picked[-1]), min(2 * chunk, 16)

    # ---- completions ----
    def _completion_tokens(self, prompt_tokens: list[int], *, max_tokens: int | None, stop: str | list[str] | None,
                           sampling_kwargs: dict, usage: dict) -> Iterator[tuple[str, str | None]]:
        """(text delta, finish_reason) pairs, finish_reason set on the last one; fills usage. The options are
        checked at the call, so that a stream fails before its first chunk."""
        if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)):
            raise ValueError(f"max_tokens must be an integer or None (None or <= 0: until the context is full), "
                             f"got {max_tokens!r}")
        stops = [stop] if isinstance(stop, str) else [] if stop is None else stop
        if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
            raise ValueError(f"stop must be a non-empty string or a list of them, got {stop!r}")
        tokens = self.generate(prompt_tokens, **sampling_kwargs)
        limit = self.n_ctx() - len(prompt_tokens) if max_tokens is None or max_tokens <= 0 else max_tokens
        return self._completion_pieces(tokens, len(prompt_tokens), limit, list(stops), usage)

    def _completion_pieces(self, tokens: Iterator[int], n_prompt: int, limit: int, stop: list[str],
                           usage: dict) -> Iterator[tuple[str, str | None]]:
        eog = self.tokenizer.eog_ids
        utf8 = _Utf8Stream()
        held = ""  # text that could still turn into a stop string
        n = 0
        finish, stopped_by_string = "length", False
        for tok in tokens:
            if tok in eog:
                finish = "stop"
                break
            n += 1
            held += utf8.push(self.tokenizer.token_to_bytes(tok, special=False))
            hit = min((held.find(s) for s in stop if s in held), default=-1)
            if hit >= 0:
                held, finish, stopped_by_string = held[:hit], "stop", True
                break
            keep = max((k for s in stop for k in range(len(s), 0, -1) if held.endswith(s[:k])), default=0)
            if len(held) > keep:
                yield held[:len(held) - keep], None
                held = held[len(held) - keep:]
            if n >= limit:
                break
        if not stopped_by_string:
            held += utf8.flush()
        usage.update(prompt_tokens=n_prompt, completion_tokens=n, total_tokens=n_prompt + n)
        yield held, finish

    def _check_prompt(self, prompt_tokens: list[int]) -> None:
        if not prompt_tokens:
            raise ValueError("the prompt is empty")
        check_token_ids(prompt_tokens, self.n_vocab())
        if len(prompt_tokens) >= self.n_ctx():
            raise ContextOverflowError(f"the prompt has {len(prompt_tokens)} tokens but n_ctx={self.n_ctx()}; "
                                       "use a larger n_ctx or a shorter prompt")

    def _sampling_kwargs(self, temperature, top_k, top_p, min_p, repeat_penalty, seed) -> dict:
        return dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                    repeat_penalty=repeat_penalty, seed=seed)

    def create_completion(self, prompt: str | Sequence[int], max_tokens: int | None = 16, temperature: float = 0.8,
                          top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0,
                          stop: str | list[str] | None = None, seed: int | None = None, stream: bool = False):
        """OpenAI-shaped text completion; stream=True returns a generator of chunks."""
        prompt_tokens = list(prompt) if not isinstance(prompt, (str, bytes)) else self.tokenize(prompt)
        usage: dict = {}
        pieces = self._completion_tokens(prompt_tokens, max_tokens=max_tokens, stop=stop, usage=usage,
                                         sampling_kwargs=self._sampling_kwargs(temperature, top_k, top_p, min_p, repeat_penalty, seed))
        cid, created = f"cmpl-{uuid.uuid4()}", int(time.time())
        model = self.model_path

        def chunk(text, finish):
            return {"id": cid, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}

        if stream:
            return (chunk(t, f) for t, f in pieces if t or f)
        text, finish = "", None
        for t, f in pieces:
            text += t
            finish = f or finish
        return {**chunk(text, finish), "usage": usage}

    __call__ = create_completion

    def chat_prompt_tokens(self, messages: list[dict], enable_thinking: bool | None = None) -> list[int]:
        """The tokens create_chat_completion feeds the model for `messages`: the model's chat template with the
        assistant's turn opened, tokenized with its special tokens."""
        if not self.chat_template:
            raise ValueError(f"{self.model_path} has no chat template (tokenizer.chat_template); use create_completion")
        tok = self.tokenizer
        prompt = render_chat(self.chat_template, messages, add_generation_prompt=True, enable_thinking=enable_thinking,
                             bos_token=tok.token_text(tok.bos_id) if tok.bos_id is not None else "",
                             eos_token=tok.token_text(tok.eos_id) if tok.eos_id is not None else "")
        return self.tokenize(prompt, parse_special=True)

    def create_chat_completion(self, messages: list[dict], max_tokens: int | None = None, temperature: float = 0.2,
                               top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0,
                               stop: str | list[str] | None = None, seed: int | None = None, stream: bool = False,
                               enable_thinking: bool | None = None):
        """OpenAI-shaped chat completion, rendered with the chat template stored in the model."""
        prompt_tokens = self.chat_prompt_tokens(messages, enable_thinking=enable_thinking)
        usage: dict = {}
        pieces = self._completion_tokens(prompt_tokens, max_tokens=max_tokens, stop=stop, usage=usage,
                                         sampling_kwargs=self._sampling_kwargs(temperature, top_k, top_p, min_p, repeat_penalty, seed))
        cid, created, model = f"chatcmpl-{uuid.uuid4()}", int(time.time()), self.model_path
        if stream:
            def chunks():
                yield {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
                for t, f in pieces:
                    if t or f:
                        yield {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                               "choices": [{"index": 0, "delta": {"content": t} if t else {}, "finish_reason": f}]}
            return chunks()
        text, finish = "", None
        for t, f in pieces:
            text += t
            finish = f or finish
        return {"id": cid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                             "finish_reason": finish}],
                "usage": usage}
