"""Chat-template rendering with the environment transformers gives templates.

Templates come from model files and are untrusted: they run in jinja2's
ImmutableSandboxedEnvironment, see only plain JSON-like data, and any error
(syntax, sandbox violation, raise_exception, type error) comes out as
ValueError. The environment matches transformers' apply_chat_template:
trim_blocks + lstrip_blocks, loopcontrols, a no-op {% generation %} block,
tojson without HTML escaping (ensure_ascii=False, indent/separators/sort_keys),
raise_exception, strftime_now, a dict() helper and a namespace() that refuses
underscore-prefixed names.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from datetime import datetime
from importlib import resources
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["render_chat", "default_chat_template", "ChatTemplateError"]

_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """A chat template failed to compile or render."""


class _GenerationBlock(jinja2.ext.Extension):
    # {% generation %}...{% endgeneration %} marks assistant text for training
    # masks in transformers; rendering just emits the body
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _DictHelper:
    # `dict(...)` / `dict.fromkeys(...)` inside templates without exposing the type itself
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


def _check_ns_name(name):
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed (leading underscore)")


class _Namespace(jinja2.utils.Namespace):
    def __init__(*args, **kwargs):  # noqa: N805 - same trick as jinja2.utils.Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _check_ns_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _check_ns_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


class _Sandbox(ImmutableSandboxedEnvironment):
    # jinja2 turns an unsafe attribute into an Undefined that only fails when
    # used further; printing it renders "". Fail at the access itself instead.
    def unsafe_undefined(self, obj, attribute):
        raise jinja2.exceptions.SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
        )


def _environment() -> ImmutableSandboxedEnvironment:
    env = _Sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _DictHelper()
    env.globals["namespace"] = _Namespace
    return env


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    return _environment().from_string(template)


def _plain(value: Any) -> Any:
    """Rebuild input as plain JSON-like data; anything else becomes "<TypeName>"."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    item = getattr(value, "item", None)
    if callable(item) and type(value).__module__ == "numpy":
        return _plain(item())
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return _plain(dump())
    return f"<{type(value).__name__}>"


def _prepare_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, (list, tuple)):
        raise ValueError(f"messages must be a list of dicts, got {type(messages).__name__}")
    out = []
    for m in messages:
        m = _plain(m)
        if not isinstance(m, dict):
            raise ValueError(f"each message must be a dict, got {m!r}")
        # None-valued keys are dropped (OpenAI-style content=None / tool_calls=None)
        m = {k: v for k, v in m.items() if v is not None}
        reasoning = next((m[k] for k in _REASONING_KEYS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


def render_chat(
    template: str,
    messages: list[dict],
    *,
    add_generation_prompt: bool = True,
    enable_thinking: bool | None = None,
    tools: list[dict] | None = None,
    bos_token: str = "",
    eos_token: str = "",
    **extra: Any,
) -> str:
    """Render `messages` with a (model-supplied, untrusted) Jinja chat template.

    Same output as transformers' `apply_chat_template(..., tokenize=False)`
    given the same variables. enable_thinking=None leaves the variable
    undefined, so the template's own default applies. tools must be JSON
    schemas (dicts). Extra keyword arguments become template variables.
    Raises ValueError (ChatTemplateError) on any template failure.
    """
    if not isinstance(template, str):
        raise ValueError(f"chat template must be a str, got {type(template).__name__}")
    if tools is not None:
        if not isinstance(tools, (list, tuple)) or not all(isinstance(t, Mapping) for t in tools):
            raise ValueError("tools must be a list of JSON-schema dicts")
        tools = _plain(list(tools))
    variables: dict[str, Any] = {"bos_token": bos_token, "eos_token": eos_token}
    variables.update(_plain(extra))
    if enable_thinking is not None:
        variables["enable_thinking"] = bool(enable_thinking)
    variables.setdefault("documents", None)
    messages = _prepare_messages(messages)
    try:
        compiled = _compile(template)
        return compiled.render(
            messages=messages,
            tools=tools,
            add_generation_prompt=bool(add_generation_prompt),
            **variables,
        )
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template syntax error (line {e.lineno}): {e.message}") from e
    except jinja2.exceptions.SecurityError as e:
        raise ChatTemplateError(f"chat template blocked by sandbox: {e}") from e
    except jinja2.exceptions.TemplateError as e:
        raise ChatTemplateError(f"chat template error: {e}") from e
    except RecursionError as e:
        raise ChatTemplateError("chat template error: recursion too deep") from e
    except Exception as e:  # a template can trip any Python error (TypeError, KeyError, ...)
        raise ChatTemplateError(f"chat template error: {type(e).__name__}: {e}") from e


def default_chat_template() -> str:
    """The Qwen3.5 chat template shipped with pyqwen."""
    return resources.files("pyqwen").joinpath("data", "qwen35_chat_template.jinja").read_text(encoding="utf-8")
