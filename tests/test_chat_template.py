"""pyqwen.chat.render_chat against transformers' apply_chat_template, and its sandbox."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from pyqwen.chat import ChatTemplateError, render_chat
from tiny_vocab import write_tiny_tokenizer

TEMPLATE = (Path(__file__).resolve().parents[1] / "pyqwen" / "data" / "qwen35_chat_template.jinja").read_text(
    encoding="utf-8"
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city — «quoted» & <escaped?>",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system_user": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "multi_turn": [
        {"role": "system", "content": "  Be brief.  "},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nThe user greets.\n</think>\n\nHello! How can I help?"},
        {"role": "user", "content": "Tell me a joke about 日本語 and emoji 🦙"},
        {"role": "assistant", "content": "Why did the llama cross the road?", "reasoning_content": "Pick a joke."},
        {"role": "user", "content": "Another one"},
    ],
    "ends_with_assistant": [
        {"role": "user", "content": "Say hi"},
        {"role": "assistant", "content": "Hi!", "reasoning_content": "Easy."},
    ],
    "content_parts": [
        {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image"}, {"type": "text", "text": "?"}]},
    ],
    "tools": [
        {"role": "system", "content": "Use tools when useful."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}},
                {"function": {"name": "get_weather", "arguments": {"city": "Lyon", "opts": {"units": "C"}}}},
            ],
        },
        {"role": "tool", "content": '{"temp": 21}'},
        {"role": "tool", "content": '{"temp": 19}'},
        {"role": "assistant", "content": "21°C in Paris, 19°C in Lyon.", "tool_calls": None},
        {"role": "user", "content": "Thanks"},
    ],
}


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    d = write_tiny_tokenizer(tmp_path_factory.mktemp("tiny_chat"))
    tok = transformers.AutoTokenizer.from_pretrained(str(d))
    assert tok.chat_template == TEMPLATE
    return tok


def _hf_render(hf, messages, *, add_generation_prompt, enable_thinking, tools=None, template=None, **kw):
    extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    return hf.apply_chat_template(
        messages, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt,
        **extra, **kw,
    )


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("enable_thinking", [None, True, False])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_matches_transformers(hf, name, enable_thinking, add_generation_prompt):
    messages = CONVERSATIONS[name]
    tools = [WEATHER_TOOL] if name == "tools" else None
    got = render_chat(
        TEMPLATE, messages, add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking, tools=tools
    )
    want = _hf_render(hf, messages, add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking,
                      tools=tools)
    assert got == want


def test_thinking_switch():
    m = CONVERSATIONS["system_user"]
    on = render_chat(TEMPLATE, m, enable_thinking=True)
    off = render_chat(TEMPLATE, m, enable_thinking=False)
    assert on.endswith("<|im_start|>assistant\n<think>\n")
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render_chat(TEMPLATE, m) == on  # this template thinks unless told not to
    assert not render_chat(TEMPLATE, m, add_generation_prompt=False).endswith("assistant\n")
    assert on.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")


def test_messages_not_modified():
    m = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "reasoning": "r", "tool_calls": None}]
    before = repr(m)
    render_chat(TEMPLATE, m + [{"role": "user", "content": "z"}])
    assert repr(m) == before


CUSTOM = (
    "{{ bos_token }}{% for m in messages %}{{ m | tojson }}|{{ m.content | tojson(indent=2, sort_keys=True) }}"
    "|{{ m.keys() | list | sort | join(',') }}\n"
    "{% endfor %}{% if tools %}{{ tools | tojson(separators=(',', ':')) }}{% endif %}"
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.n = ns.n + 1 %}"
    "{% endif %}{% if loop.index > 5 %}{% break %}{% endif %}{% endfor %}users={{ ns.n }}"
    "{% set d = dict(a=1, b='é') %}{{ d | tojson }}{{ dict.fromkeys(['k'], 0) | tojson }}"
    "{% generation %}[gen {{ messages | length }}]{% endgeneration %}"
    "{% if add_generation_prompt %}<gen>{% endif %}{{ eos_token }}{{ custom_var | default('-') }}\n"
    "    {% if true %}\n        indented\n    {% endif %}\n"
)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_custom_template_matches_transformers(hf, add_generation_prompt):
    # tojson semantics (no HTML escaping, kwargs), namespace, dict, loopcontrols,
    # {% generation %}, trim_blocks/lstrip_blocks, extra variables
    messages = [
        {"role": "user", "content": "<b>\"quotes\" & 'amp' é 🦙</b>"},
        {"role": "assistant", "content": {"nested": [1, 2.5, None, True]}},
        {"role": "assistant", "content": "ok", "tool_calls": None, "reasoning": "hmm"},
        {"role": "user", "content": "bye"},
    ]
    got = render_chat(CUSTOM, messages, add_generation_prompt=add_generation_prompt, tools=[WEATHER_TOOL],
                      bos_token="<s>", eos_token="<|im_end|>", custom_var=7)
    want = _hf_render(hf, messages, add_generation_prompt=add_generation_prompt, enable_thinking=None,
                      tools=[WEATHER_TOOL], template=CUSTOM, bos_token="<s>", custom_var=7)
    assert got == want
    assert '"<b>\\"quotes\\" & \'amp\' é 🦙</b>"' in got  # not HTML-escaped, not ASCII-escaped


def test_strftime_now():
    year = datetime.datetime.now().year
    out = render_chat("{{ strftime_now('%Y') }}", [{"role": "user", "content": "x"}])
    assert out in (str(year), str(year + 1))


def test_raise_exception_is_value_error():
    with pytest.raises(ValueError, match="No messages provided"):
        render_chat(TEMPLATE, [])
    with pytest.raises(ValueError, match="System message must be at the beginning"):
        render_chat(TEMPLATE, [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}])
    with pytest.raises(ChatTemplateError, match="custom failure"):
        render_chat("{{ raise_exception('custom failure') }}", [{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{{ c.__name__ }}{% endfor %}",
        "{{ messages.__class__.__base__.__subclasses__() }}",
        "{{ raise_exception.__globals__['__builtins__']['__import__']('os').system('echo pwned') }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        "{{ lipsum.__globals__['os'].getcwd() }}",
        "{{ (messages|first).items.__self__.__class__.__subclasses__() }}",
        "{% set ns = namespace(__class__=1) %}{{ ns }}",
        "{% set ns = namespace(a=1) %}{% set ns._x = 2 %}{{ ns._x }}",
        "{{ messages.append({'role': 'user'}) }}",
        "{{ messages[0].update({'role': 'x'}) }}",
        "{{ dict.__class__.__init__.__globals__ }}",
        "{{ ''.format.__self__.__class__ }}{{ ''.__class__.__mro__ | list }}",
        "{{ range(10**9) | list | length }}",
        "{{ ''.__class__ }}",
        "{{ messages[0].content.__len__() }}",
    ],
)
def test_sandbox_escapes_raise(template, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as err:
        render_chat(template, [{"role": "user", "content": "x"}])
    assert isinstance(err.value, ChatTemplateError)
    assert "chat template" in str(err.value)


def test_syntax_error_is_value_error():
    with pytest.raises(ValueError, match="syntax error"):
        render_chat("{% if %}", [{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="syntax error"):
        render_chat("{% for m in messages %}", [{"role": "user", "content": "x"}])


def test_unsafe_objects_become_placeholders():
    class Thing:
        def __str__(self):
            return "secret"

    out = render_chat("{{ messages[0].content }}|{{ obj }}", [{"role": "user", "content": Thing()}], obj=Thing())
    assert out == "<Thing>|<Thing>"


def test_bad_arguments():
    with pytest.raises(ValueError):
        render_chat(TEMPLATE, [["not", "a", "dict"]])
    with pytest.raises(ValueError):
        render_chat(TEMPLATE, "hello")
    with pytest.raises(ValueError):
        render_chat(None, [{"role": "user", "content": "x"}])
    with pytest.raises(ValueError):
        render_chat(TEMPLATE, [{"role": "user", "content": "x"}], tools=[print])
