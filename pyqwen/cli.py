"""The `pyqwen` command: generate, chat, convert, synth."""
from __future__ import annotations

import argparse
import sys
import warnings
from importlib import resources
from pathlib import Path

DEFAULT_MODEL = "default.gguf"


def default_model_path() -> Path:
    return Path(str(resources.files("pyqwen") / "models" / DEFAULT_MODEL))


def _add_model_args(p: argparse.ArgumentParser, *, model_required: bool) -> None:
    p.add_argument("-m", "--model", required=model_required,
                   help="GGUF model file" + ("" if model_required else " (default: the small model shipped with pyqwen)"))
    p.add_argument("-c", "--ctx-size", type=int, default=None,
                   help="context size in tokens (default 4096, or the model's training context where that is shorter)")
    p.add_argument("-b", "--batch-size", type=int, default=512, help="prompt tokens per forward pass (default 512)")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="layers to offload to the GPU (-1: all)")
    p.add_argument("-s", "--seed", type=int, default=None, help="random seed (default, or -1: a fresh one each run)")
    p.add_argument("--temp", type=float, default=0.8, help="temperature; 0 is greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=40, help="top-k, 0 = off (default 40)")
    p.add_argument("--top-p", type=float, default=0.95, help="top-p, 1 = off (default 0.95)")
    p.add_argument("--min-p", type=float, default=0.05, help="min-p, 0 = off (default 0.05)")
    p.add_argument("--repeat-penalty", type=float, default=1.0, help="repetition penalty, 1 = off (default 1.0)")
    p.add_argument("-v", "--verbose", action="store_true", help="show ggml's log")


def _load(args):
    from ._native import Sampling
    from .llama import Llama

    # bad sampling options fail here, before a model of many GB loads (Llama checks the seed before it loads)
    Sampling(args.temp, args.top_k, args.top_p, args.min_p, args.repeat_penalty)
    path = args.model or default_model_path()
    return Llama(path, n_ctx=args.ctx_size, n_batch=args.batch_size, n_threads=args.threads,
                 n_gpu_layers=args.n_gpu_layers, seed=args.seed, verbose=args.verbose)


def _sampling(args) -> dict:
    return dict(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                repeat_penalty=args.repeat_penalty, seed=args.seed)


def cmd_generate(args) -> int:
    with _load(args) as llm:
        if args.model is None:
            print("(pyqwen: using the small built-in model, 19M parameters trained on Python docs and code; "
                  "pass -m MODEL.gguf for a real one)", file=sys.stderr)
        room = llm.n_ctx() - len(llm.tokenize(args.prompt))  # the most tokens a completion can add
        if 0 < room < args.n_predict:
            print(f"(pyqwen: the context of {llm.n_ctx()} tokens (-c) leaves room for {room} of the {args.n_predict} "
                  "tokens asked)", file=sys.stderr)
        chunks = llm.create_completion(args.prompt, max_tokens=args.n_predict, stream=True, **_sampling(args))
        sys.stdout.write(args.prompt)
        for chunk in chunks:
            sys.stdout.write(chunk["choices"][0]["text"])
            sys.stdout.flush()
        sys.stdout.write("\n")
    return 0


def _fit_conversation(llm, messages: list[dict], reserve: int, think: bool | None) -> list[dict] | None:
    """`messages` without as many of its oldest exchanges (a user turn and its reply) as it takes for the prompt
    and `reserve` reply tokens to fit the context; the system prompt and the newest turn always stay. None when
    the newest turn does not fit even alone."""
    head = messages[:1] if messages[0]["role"] == "system" else []
    turns = messages[len(head):]
    while True:
        n_prompt = len(llm.chat_prompt_tokens(head + turns, enable_thinking=think))
        if n_prompt + reserve <= llm.n_ctx() or len(turns) <= 1:
            return head + turns if n_prompt < llm.n_ctx() else None
        turns = turns[2:]


def cmd_chat(args) -> int:
    with _load(args) as llm:
        messages = [{"role": "system", "content": args.system}] if args.system else []
        # room kept for a reply when old turns must go: -n, at most half the context
        reserve = min(args.n_predict, llm.n_ctx() // 2) if args.n_predict > 0 else llm.n_ctx() // 2
        print("pyqwen chat: an empty line or Ctrl-D ends the session.", file=sys.stderr)
        while True:
            try:
                line = input("> ")
            except EOFError:
                break
            if not line.strip():
                break
            fitted = _fit_conversation(llm, messages + [{"role": "user", "content": line}], reserve, args.think)
            if fitted is None:
                print(f"pyqwen: that message does not fit the context of {llm.n_ctx()} tokens (-c); "
                      "send a shorter one or start with a larger -c", file=sys.stderr)
                continue
            dropped = len(messages) + 1 - len(fitted)
            if dropped:
                print(f"(pyqwen: the {dropped} oldest messages no longer fit the context of {llm.n_ctx()} tokens "
                      "and were dropped)", file=sys.stderr)
            messages = fitted
            reply = ""
            for chunk in llm.create_chat_completion(messages, max_tokens=args.n_predict, stream=True,
                                                    enable_thinking=args.think, **_sampling(args)):
                text = chunk["choices"][0]["delta"].get("content", "")
                reply += text
                sys.stdout.write(text)
                sys.stdout.flush()
            sys.stdout.write("\n")
            messages.append({"role": "assistant", "content": reply})
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyqwen", description="Fast local Qwen3.5 text generation.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="complete a prompt, streaming to stdout")
    _add_model_args(gen, model_required=False)
    gen.add_argument("-p", "--prompt", required=True, help="prompt text")
    gen.add_argument("-n", "--n-predict", type=int, default=128,
                     help="tokens to generate (default 128; 0 or less: until the context is full)")
    gen.set_defaults(func=cmd_generate)

    chat = sub.add_parser("chat", help="interactive chat with the model's chat template")
    _add_model_args(chat, model_required=False)
    chat.add_argument("-n", "--n-predict", type=int, default=1024,
                      help="max tokens per reply (default 1024); when the conversation and this much room for the "
                           "reply (at most half the context) outgrow -c, its oldest exchanges are dropped")
    chat.add_argument("--system", default=None, help="system prompt")
    chat.add_argument("--think", action=argparse.BooleanOptionalAction, default=None,
                      help="turn the template's thinking mode on or off")
    chat.set_defaults(func=cmd_chat)

    sub.add_parser("convert", help="Hugging Face checkpoint -> GGUF (same as pyqwen-convert)", add_help=False)
    sub.add_parser("synth", help="a real Qwen3.5 shape with random weights as GGUF, for benchmarks", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["convert"]:
        from .convert.__main__ import main as convert_main

        return convert_main(argv[1:])
    if argv[:1] == ["synth"]:
        from .synth import main as synth_main

        return synth_main(argv[1:])
    args = build_parser().parse_args(argv)
    warnings.formatwarning = lambda message, *_: f"pyqwen: warning: {message}\n"  # not the Python source line
    try:
        return args.func(args)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"pyqwen: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
