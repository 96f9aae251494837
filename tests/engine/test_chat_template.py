"""Chat templates rendered without transformers, byte-identical to transformers' rendering.

transformers is the oracle here only: each real template (tests/engine/chat_templates/,
and SmolLM2's from the bundled GGUF) is rendered by ``apply_chat_template(...,
tokenize=False)`` and by ChatTemplate, and the two texts must be equal.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from paged_llm.engine.errors import InvalidArgument, ModelLoadError
from paged_llm.engine.model.gguf_metadata import MetadataReader
from paged_llm.engine.model.loader import bundled_gguf_path
from paged_llm.engine.tokenizer.chat_template import ChatTemplate, gguf_templates
from tests.helpers.support import tokenizer_dir
from tests.helpers.without_torch import run_without_torch

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = Path(__file__).parent / "chat_templates"
# Every render in this file sees this time: strftime_now must print the same date in both.
FROZEN = datetime(2025, 3, 9, 14, 30, 5)


class _FrozenDatetime(datetime):
    """transformers' ``datetime`` with ``now()`` pinned to FROZEN."""

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return FROZEN


@pytest.fixture(autouse=True)
def _freeze_transformers_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.utils import chat_template_utils

    monkeypatch.setattr(chat_template_utils, "datetime", _FrozenDatetime)


@pytest.fixture(scope="module")
def oracle() -> Any:
    """A transformers tokenizer (SmolLM2's, from the bundled GGUF) to render templates with."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir())


@pytest.fixture(scope="module")
def smollm2_metadata() -> dict[str, Any]:
    path = bundled_gguf_path("SmolLM2-135M-Instruct")
    return MetadataReader(path).values(keep_strings={"tokenizer.ggml.tokens"})


# --- inputs -----------------------------------------------------------------------------

SYSTEM = {"role": "system", "content": "You are a helpful assistant for a smart home."}
USER = {"role": "user", "content": "Turn on the kitchen lights, please."}
ASSISTANT = {"role": "assistant", "content": "Done: the kitchen lights are on."}
USER2 = {"role": "user", "content": "And what is the weather in Köln?"}
UNICODE_USER = {"role": "user", "content": "Grüße aus Köln! 東京の天気は？ 🌧️☔ Ça va? Straße, ÄÖÜ"}
UNICODE_ASSISTANT = {
    "role": "assistant",
    "content": "Es regnet in 東京 🌧️ — bring einen Schirm mit.",
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "light_turn_on",
            "description": "Turn on the lights of an area.",
            "parameters": {
                "type": "object",
                "properties": {
                    "area": {"type": "string", "description": "The area, e.g. Küche or 寝室"},
                    "brightness": {"type": "integer", "description": "Percent, 0 to 100"},
                    "color": {"type": "string", "enum": ["warm", "cold", "红色"]},
                },
                "required": ["area"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather now at a place.",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["location", "unit"],
            },
        },
    },
]
ARGUMENTS = {"area": "Küche", "brightness": 80, "color": "红色"}


def _tool_call(arguments: Any, content: str | None = None) -> dict[str, Any]:
    """An OpenAI-style assistant message calling light_turn_on (content null, as APIs send)."""
    call = {"name": "light_turn_on", "arguments": arguments}
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"id": "Ab3De6Gh9", "type": "function", "function": call}],
    }


TOOL_RESULT = {
    "role": "tool",
    "tool_call_id": "Ab3De6Gh9",
    "name": "light_turn_on",
    "content": '{"ok": true, "area": "Küche", "state": "an ✓"}',
}
TOOL_RESULT_DICT = {**TOOL_RESULT, "content": {"ok": True, "area": "Küche", "state": "an ✓"}}
AFTER_TOOL = {"role": "assistant", "content": "Die Küche ist jetzt hell. 💡"}

CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "plain": [USER],
    "system": [SYSTEM, USER],
    "multi_turn": [SYSTEM, USER, ASSISTANT, USER2],
    "multi_turn_no_system": [USER, ASSISTANT, USER2],
    "ends_with_assistant": [SYSTEM, USER, ASSISTANT],
    "unicode": [SYSTEM, UNICODE_USER, UNICODE_ASSISTANT, USER2],
    "unicode_no_system": [UNICODE_USER, UNICODE_ASSISTANT, USER2],
    "tool_call": [SYSTEM, USER, _tool_call(ARGUMENTS), TOOL_RESULT],
    "tool_call_json_args": [
        SYSTEM,
        USER,
        _tool_call(json.dumps(ARGUMENTS, ensure_ascii=False)),
        TOOL_RESULT,
    ],
    "tool_call_answered": [SYSTEM, USER, _tool_call(ARGUMENTS), TOOL_RESULT, AFTER_TOOL, USER2],
    "tool_result_dict": [SYSTEM, USER, _tool_call(ARGUMENTS), TOOL_RESULT_DICT],
    "reasoning": [
        USER,
        {"role": "assistant", "content": "Done.", "reasoning_content": "The user wants light."},
        USER2,
        {"role": "assistant", "content": "Rainy.", "reasoning_content": "Köln: 🌧️, 12 °C."},
    ],
    "text_blocks": [
        {"role": "system", "content": [{"type": "text", "text": "Be brief. "}]},
        {"role": "user", "content": [{"type": "text", "text": "  Hallo, Welt! 👋  "}]},
    ],
    "phi4_tools": [
        {**SYSTEM, "tools": json.dumps(TOOLS, ensure_ascii=False)},
        USER,
    ],
}
# Qwen3's template reads a tool call's content, so a null one (dropped) breaks it there too.
CONVERSATIONS |= {
    f"{name}_with_content": [
        _tool_call(m["tool_calls"][0]["function"]["arguments"], "") if m.get("tool_calls") else m
        for m in CONVERSATIONS[name]
    ]
    for name in ["tool_call", "tool_call_json_args", "tool_call_answered", "tool_result_dict"]
}
BASIC = ["plain", "system", "multi_turn", "ends_with_assistant", "unicode"]
TOOL_CASES = ["tool_call", "tool_call_json_args", "tool_call_answered", "tool_result_dict"]


@dataclass(frozen=True)
class Family:
    """One model family's real template and what to render with it."""

    name: str
    template: str  # a file in TEMPLATES, or "gguf" for the bundled SmolLM2 file's own
    source: str  # where the template comes from
    tokens: dict[str, str] = field(default_factory=dict)
    conversations: tuple[str, ...] = tuple(BASIC)
    tool_conversations: tuple[str, ...] = ()
    variables: dict[str, Any] = field(default_factory=dict)


FAMILIES = [
    Family("smollm2", "gguf", "bundled SmolLM2-135M-Instruct GGUF"),
    Family(
        "qwen2.5",
        "Qwen-Qwen2.5-7B-Instruct.jinja",
        "Qwen/Qwen2.5-7B-Instruct",
        {"eos_token": "<|im_end|>"},
        (*BASIC, "multi_turn_no_system"),
        tuple(TOOL_CASES),
    ),
    *(
        Family(
            f"qwen3-thinking-{mode}",
            "Qwen-Qwen3-0.6B.jinja",
            "Qwen/Qwen3-0.6B",
            {"eos_token": "<|im_end|>"},
            (*BASIC, "reasoning"),
            tuple(f"{name}_with_content" for name in TOOL_CASES),
            {} if mode == "default" else {"enable_thinking": mode == "on"},
        )
        for mode in ("default", "on", "off")
    ),
    Family(
        "llama3.1",
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "meta-llama/Llama-3.1-8B-Instruct",
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        tool_conversations=tuple(TOOL_CASES),
    ),
    Family(
        "llama3.1-date-builtin",
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "meta-llama/Llama-3.1-8B-Instruct",
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        ("system",),
        ("tool_call",),
        {"date_string": "01 Feb 2026", "builtin_tools": ["brave_search"]},
    ),
    Family(
        "llama3.1-tools-in-system",
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "meta-llama/Llama-3.1-8B-Instruct",
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        ("system",),
        ("tool_call",),
        {"tools_in_user_message": False},
    ),
    Family(
        "llama3.2",
        "meta-llama-Llama-3.2-3B-Instruct.jinja",
        "meta-llama/Llama-3.2-3B-Instruct",
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        tool_conversations=tuple(TOOL_CASES),
    ),
    Family(
        "mistral-nemo",
        "mistralai-Mistral-Nemo-Instruct-2407.jinja",
        "mistralai/Mistral-Nemo-Instruct-2407",
        {"bos_token": "<s>", "eos_token": "</s>"},
        (*BASIC, "multi_turn_no_system"),
        tuple(TOOL_CASES),
    ),
    Family(
        "mistral-small-3.2",
        "Mistral-Small-3.2-24B-Instruct-2506.jinja",
        "mistralai/Mistral-Small-3.2-24B-Instruct-2506",
        {"bos_token": "<s>", "eos_token": "</s>"},
        (*BASIC, "multi_turn_no_system", "text_blocks"),
        tuple(TOOL_CASES),
    ),
    Family(
        "gemma2",
        "google-gemma-2-2b-it.jinja",
        "google/gemma-2-2b-it",
        {"bos_token": "<bos>", "eos_token": "<eos>"},
        ("plain", "multi_turn_no_system", "unicode_no_system"),
    ),
    Family(
        "gemma3",
        "google-gemma-3-1b-it.jinja",
        "google/gemma-3-1b-it",
        {"bos_token": "<bos>", "eos_token": "<eos>"},
        (*BASIC, "multi_turn_no_system", "text_blocks"),
    ),
    Family(
        "phi3.5-mini",
        "microsoft-Phi-3.5-mini-instruct.jinja",
        "microsoft/Phi-3.5-mini-instruct",
        {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    ),
    Family(
        "phi4-mini",
        "microsoft-Phi-4-mini-instruct.jinja",
        "microsoft/Phi-4-mini-instruct",
        {"eos_token": "<|endoftext|>"},
        (*BASIC, "phi4_tools"),
    ),
]


def _source(family: Family, metadata: dict[str, Any]) -> str:
    if family.template == "gguf":
        return str(metadata["tokenizer.chat_template"])
    return (TEMPLATES / family.template).read_text(encoding="utf-8")


def _ours(oracle: Any, source: str, tokens: dict[str, str], messages: Any, **kwargs: Any) -> str:
    """ChatTemplate's text, given the special tokens transformers' tokenizer would pass."""
    template = ChatTemplate(
        source, special_tokens={**oracle.special_tokens_map, **tokens}, clock=lambda: FROZEN
    )
    return template.render(messages, **kwargs)


def _theirs(oracle: Any, source: str, tokens: dict[str, str], messages: Any, **kwargs: Any) -> str:
    """transformers' text for the same inputs (its kwargs override the tokenizer's tokens)."""
    text = oracle.apply_chat_template(
        messages, chat_template=source, tokenize=False, **tokens, **kwargs
    )
    assert isinstance(text, str)
    return text


CASES = [
    pytest.param(family, name, tools, id=f"{family.name}-{name}")
    for family in FAMILIES
    for name, tools in [
        *((name, False) for name in family.conversations),
        *((name, True) for name in family.tool_conversations),
    ]
]


@pytest.mark.parametrize("add_generation_prompt", [True, False], ids=["gen", "nogen"])
@pytest.mark.parametrize(("family", "conversation", "with_tools"), CASES)
def test_renders_as_transformers(
    oracle: Any,
    smollm2_metadata: dict[str, Any],
    family: Family,
    conversation: str,
    with_tools: bool,
    add_generation_prompt: bool,
) -> None:
    source = _source(family, smollm2_metadata)
    messages = CONVERSATIONS[conversation]
    kwargs: dict[str, Any] = {
        "add_generation_prompt": add_generation_prompt,
        "tools": TOOLS if with_tools else None,
        **family.variables,
    }
    before = copy.deepcopy(messages)
    expected = _theirs(oracle, source, family.tokens, messages, **kwargs)
    assert _ours(oracle, source, family.tokens, messages, **kwargs) == expected
    assert messages == before  # the caller's messages are left as they were


def test_tools_reach_the_template_unescaped(oracle: Any) -> None:
    # tojson keeps non-ASCII as it is (ensure_ascii=False), as the models were tuned on.
    source = (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(encoding="utf-8")
    messages = CONVERSATIONS["tool_call"]
    text = _ours(oracle, source, {}, messages, tools=TOOLS)
    assert '"红色"' in text
    assert '"area": "Küche"' in text
    assert "\\u" not in text
    assert text == _theirs(oracle, source, {}, messages, tools=TOOLS, add_generation_prompt=True)


def test_strftime_now_prints_the_clock_date(oracle: Any) -> None:
    source = (TEMPLATES / "meta-llama-Llama-3.2-3B-Instruct.jinja").read_text(encoding="utf-8")
    text = _ours(oracle, source, {}, [USER])
    assert "Today Date: 09 Mar 2025\n" in text
    other = ChatTemplate(source, clock=lambda: datetime(2031, 12, 24)).render([USER])
    assert "Today Date: 24 Dec 2031\n" in other
    # Without a clock given, it is the machine's local time, as in transformers.
    now = ChatTemplate(source).render([USER])
    assert f"Today Date: {datetime.now().strftime('%d %b %Y')}\n" in now


def test_special_tokens_from_the_gguf_match_transformers(
    oracle: Any, smollm2_metadata: dict[str, Any]
) -> None:
    template = ChatTemplate.from_gguf(smollm2_metadata, model="SmolLM2-135M-Instruct")
    assert template.special_tokens == oracle.special_tokens_map
    messages = CONVERSATIONS["multi_turn"]
    source = smollm2_metadata["tokenizer.chat_template"]
    expected = oracle.apply_chat_template(
        messages, chat_template=source, tokenize=False, add_generation_prompt=True
    )
    assert template.render(messages) == expected


@pytest.mark.parametrize(
    ("template", "messages", "refusal"),
    [
        (
            "google-gemma-2-2b-it.jinja",
            [USER, USER2],
            "Conversation roles must alternate user/assistant/user/assistant/...",
        ),
        ("google-gemma-2-2b-it.jinja", [SYSTEM, USER], "System role not supported"),
        (
            "google-gemma-3-1b-it.jinja",
            [SYSTEM, USER, ASSISTANT, ASSISTANT],
            "Conversation roles must alternate user/assistant/user/assistant/...",
        ),
        (
            "mistralai-Mistral-Nemo-Instruct-2407.jinja",
            [USER, {**_tool_call(ARGUMENTS), "tool_calls": [{"id": "x", "function": {}}]}],
            "Tool call IDs should be alphanumeric strings with length 9!",
        ),
        (
            "meta-llama-Llama-3.1-8B-Instruct.jinja",
            [USER, {"role": "assistant", "tool_calls": [{"function": {}}, {"function": {}}]}],
            "This model only supports single tool-calls at once!",
        ),
    ],
)
def test_raise_exception_gives_a_clear_error(
    oracle: Any, template: str, messages: list[dict[str, Any]], refusal: str
) -> None:
    import jinja2

    source = (TEMPLATES / template).read_text(encoding="utf-8")
    with pytest.raises(jinja2.TemplateError, match=refusal.replace(".", r"\.")):
        _theirs(oracle, source, {}, messages)
    with pytest.raises(InvalidArgument, match="refuses these messages") as caught:
        ChatTemplate(source, model="gemma-or-other").render(messages)
    assert caught.value.argument == "messages"
    assert refusal in str(caught.value)
    assert "gemma-or-other" in str(caught.value)


def test_a_template_that_fails_gives_a_clear_error(smollm2_metadata: dict[str, Any]) -> None:
    # SmolLM2's template adds the content to a string: a tool call without content breaks it.
    template = ChatTemplate.from_gguf(smollm2_metadata, model="SmolLM2")
    with pytest.raises(InvalidArgument, match="chat template of SmolLM2 failed") as caught:
        template.render([USER, _tool_call(ARGUMENTS)])
    assert caught.value.argument == "messages"


@pytest.mark.parametrize(
    ("source", "problem"),
    [(None, "has no chat template"), ("", "has no chat template"), ("  \n", "no chat template")],
)
def test_a_missing_template_fails_to_load(source: str | None, problem: str) -> None:
    with pytest.raises(ModelLoadError, match=problem) as caught:
        ChatTemplate(source, model="tiny.gguf")
    assert "tiny.gguf" in str(caught.value)
    assert "paged-llm[engine]" in str(caught.value)


def test_a_gguf_without_template_fails_to_load(smollm2_metadata: dict[str, Any]) -> None:
    metadata = {k: v for k, v in smollm2_metadata.items() if k != "tokenizer.chat_template"}
    with pytest.raises(ModelLoadError, match=r"tokenizer\.chat_template"):
        ChatTemplate.from_gguf(metadata, model="tiny.gguf")


@pytest.mark.parametrize(
    "source",
    ["{% for m in messages %}{{ m }}", "{{ messages | no_such_filter }}", "{% endif %}"],
)
def test_a_template_that_does_not_compile_fails_to_load(source: str) -> None:
    with pytest.raises(ModelLoadError, match="does not compile") as caught:
        ChatTemplate(source, model="odd.gguf")
    assert "paged-llm[engine]" in str(caught.value)
    assert "odd.gguf" in str(caught.value)


@pytest.mark.parametrize(
    ("messages", "argument"),
    [
        ([], "messages"),
        ("hello", "messages"),
        (["hello"], "messages"),
    ],
)
def test_malformed_messages_are_refused(messages: Any, argument: str) -> None:
    template = ChatTemplate("{{ messages }}")
    with pytest.raises(InvalidArgument) as caught:
        template.render(messages)
    assert caught.value.argument == argument


def test_malformed_tools_are_refused() -> None:
    template = ChatTemplate("{{ tools }}")
    with pytest.raises(InvalidArgument) as caught:
        template.render([USER], tools=[print])  # type: ignore[list-item]
    assert caught.value.argument == "tools"


# Small templates that exercise the environment itself: filters, globals, whitespace.
ENVIRONMENT_TEMPLATES = {
    "tojson_options": (
        "{{ tools|tojson(indent=2) }}|{{ tools|tojson(separators=(',', ':'), sort_keys=true) }}"
        "|{{ messages|tojson(2) }}|{{ messages|tojson(ensure_ascii=true) }}|{{ '<&>'|tojson }}"
    ),
    "dict_namespace_loopcontrols": (
        "{%- set ns = namespace(n=0, seen=[]) %}\n"
        "{%- for m in messages %}{% if m.role == 'assistant' %}{% continue %}{% endif %}"
        "{% set ns.n = ns.n + 1 %}{% if loop.index > 3 %}{% break %}{% endif %}"
        "{{ dict(role=m.role, n=ns.n)|tojson }}\n{% endfor %}"
        "{{ dict.fromkeys(['a', 'b'], 1)|tojson }}"
    ),
    "trim_and_lstrip_blocks": (
        "<s>\n  {% for m in messages %}\n    {{ m.content }}\n  {% endfor %}\n"
        "{% if add_generation_prompt %}\n  <gen>\n{% endif %}\n"
    ),
    "undefined_and_defined": (
        "{{ missing }}[{{ tools is none }}][{{ documents is defined }}][{{ bos_token }}]"
        "[{{ eos_token }}][{{ custom|default('none') }}][{{ messages[0].nothing is defined }}]"
    ),
    "generation_tag": (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
        "{{ m.content }}{% set hidden = 1 %}{% endgeneration %}{% else %}{{ m.content }}"
        "{% endif %}{{ hidden is defined }}\n{% endfor %}"
    ),
    "reasoning_aliases": "{% for m in messages %}{{ m|tojson }}\n{% endfor %}",
    "string_methods": (
        "{% for m in messages %}{{ m.content.split(' ')[0].upper() }} "
        "{{ m.content.startswith('Turn') }} {{ m.content | trim | length }}\n{% endfor %}"
    ),
}


@pytest.mark.parametrize("name", list(ENVIRONMENT_TEMPLATES))
def test_environment_matches_transformers(oracle: Any, name: str) -> None:
    source = ENVIRONMENT_TEMPLATES[name]
    messages = [
        {"role": "user", "content": "Turn on the light ü 東京", "extra": None},
        {"role": "assistant", "content": "ok", "thinking": "because 🤔"},
        USER2,
        {"role": "assistant", "content": "fine", "reasoning": "second"},
        USER,
    ]
    for kwargs in [
        {"add_generation_prompt": True},
        {"add_generation_prompt": False, "tools": TOOLS, "custom": "x"},
    ]:
        expected = _theirs(oracle, source, {}, messages, **kwargs)
        assert _ours(oracle, source, {}, messages, **kwargs) == expected


@pytest.mark.parametrize(
    ("template", "field_name", "last"),
    [
        ("Qwen-Qwen2.5-7B-Instruct.jinja", True, {"role": "assistant", "content": "The lights "}),
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", True, {"role": "assistant", "content": "Es "}),
        ("google-gemma-3-1b-it.jinja", True, {"role": "assistant", "content": "Sure:  "}),
        (
            "Qwen-Qwen3-0.6B.jinja",
            "reasoning_content",
            {"role": "assistant", "content": "x", "reasoning_content": "Let me think"},
        ),
    ],
)
def test_continue_final_message_matches_transformers(
    oracle: Any, template: str, field_name: bool | str, last: dict[str, Any]
) -> None:
    source = (TEMPLATES / template).read_text(encoding="utf-8")
    messages = [USER, last]
    before = copy.deepcopy(messages)
    kwargs = {"add_generation_prompt": False, "continue_final_message": field_name}
    expected = _theirs(oracle, source, {}, messages, **kwargs)
    assert _ours(oracle, source, {}, messages, **kwargs) == expected
    assert messages == before


def test_continue_final_message_excludes_a_generation_prompt() -> None:
    template = ChatTemplate((TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text())
    with pytest.raises(InvalidArgument) as caught:
        template.render([USER, ASSISTANT], continue_final_message=True)
    assert caught.value.argument == "continue_final_message"


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{% set ns = namespace() %}{% set ns._x = 1 %}",
        "{{ namespace(_secret=1) }}",
        "{{ messages.append(1) }}",
    ],
)
def test_the_sandbox_holds(source: str) -> None:
    with pytest.raises(InvalidArgument, match="failed on these messages"):
        ChatTemplate(source).render([USER])


# Renders a template where torch and transformers cannot be imported.
PROBE = """
from paged_llm.engine.tokenizer.chat_template import ChatTemplate

text = ChatTemplate("{{ messages[0].content }}").render([{"role": "user", "content": "hi"}])
assert text == "hi", text
"""


def test_import_pulls_in_neither_torch_nor_transformers() -> None:
    run = run_without_torch(PROBE)
    assert run.returncode == 0, run.stderr[-3000:]


# --- several templates by name ------------------------------------------------------------

# A rag template of its own, reading documents: what a third name looks like.
RAG = (
    "{% for d in documents %}<doc {{ d.title }}>{{ d.text }}</doc>\n{% endfor %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DOCUMENTS = [{"title": "Küche", "text": "Die Lampe über dem Herd."}]


def _named(smollm2_metadata: dict[str, Any], *names: str) -> dict[str, str]:
    """Real templates by name: SmolLM2's own as default, Qwen2.5's (tools) as tool_use."""
    sources = {
        "default": str(smollm2_metadata["tokenizer.chat_template"]),
        "tool_use": (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(encoding="utf-8"),
        "rag": RAG,
    }
    return {name: sources[name] for name in names}


# (templates the model has, tools given, the name the caller gives)
CHOICES = [
    pytest.param(("default", "tool_use"), None, None, id="no-tools-default"),
    pytest.param(("default", "tool_use"), TOOLS, None, id="tools-tool_use"),
    pytest.param(("default", "tool_use"), [], None, id="empty-tools-tool_use"),
    pytest.param(("default", "rag"), TOOLS, None, id="tools-without-tool_use-default"),
    pytest.param(("default", "tool_use"), TOOLS, "default", id="named-default-with-tools"),
    pytest.param(("default", "tool_use"), None, "tool_use", id="named-tool_use-no-tools"),
    pytest.param(("default", "tool_use", "rag"), None, "rag", id="named-rag"),
    pytest.param(("tool_use", "rag"), TOOLS, None, id="no-default-tools"),
    pytest.param(("tool_use", "rag"), None, "rag", id="no-default-named"),
]


@pytest.mark.parametrize(("names", "tools", "chosen"), CHOICES)
def test_the_template_chosen_is_transformers_choice(
    oracle: Any,
    smollm2_metadata: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    names: tuple[str, ...],
    tools: Any,
    chosen: str | None,
) -> None:
    """Several templates: the one transformers' get_chat_template picks, rendered as it renders."""
    templates = _named(smollm2_metadata, *names)
    monkeypatch.setattr(oracle, "chat_template", templates)
    ours = ChatTemplate(templates, special_tokens=oracle.special_tokens_map, clock=lambda: FROZEN)
    messages = [SYSTEM, USER]
    kwargs: dict[str, Any] = {"tools": tools, "chat_template": chosen, "documents": DOCUMENTS}
    kwargs["add_generation_prompt"] = True
    assert templates[ours.choose(chosen, tools)] == oracle.get_chat_template(chosen, tools)
    expected = oracle.apply_chat_template(messages, tokenize=False, **kwargs)
    assert ours.render(messages, **kwargs) == expected


def test_several_templates_and_no_default_is_refused_as_transformers_refuses(
    oracle: Any, smollm2_metadata: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No tools, no name and no default: transformers raises, so does ChatTemplate (by name)."""
    templates = _named(smollm2_metadata, "tool_use", "rag")
    monkeypatch.setattr(oracle, "chat_template", templates)
    with pytest.raises(ValueError, match="no default"):
        oracle.get_chat_template(None, None)
    with pytest.raises(
        InvalidArgument, match="no default chat template; name one of rag, tool_use"
    ) as caught:
        ChatTemplate(templates, model="m.gguf").render([USER])
    assert caught.value.argument == "chat_template"


def test_a_name_the_model_lacks_is_refused() -> None:
    """transformers would compile an unknown name as a template's text; a request may not."""
    template = ChatTemplate({"default": "{{ messages[0].content }}", "tool_use": "tools"})
    with pytest.raises(InvalidArgument, match="no chat template named 'rag'") as caught:
        template.render([USER], chat_template="rag")
    assert "default, tool_use" in str(caught.value)
    single = ChatTemplate("{{ messages[0].content }}")
    with pytest.raises(InvalidArgument, match=re.escape("no chat template named '{{ 7 * 7 }}'")):
        single.render([USER], chat_template="{{ 7 * 7 }}")
    assert single.render([USER], chat_template="default") == USER["content"]


def test_named_templates_are_read_from_the_gguf(
    oracle: Any, smollm2_metadata: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """tokenizer.chat_template.<name> beside tokenizer.chat_template: a dict, default first."""
    templates = _named(smollm2_metadata, "default", "tool_use", "rag")
    metadata = {
        **smollm2_metadata,
        "tokenizer.chat_template.tool_use": templates["tool_use"],
        "tokenizer.chat_template.rag": RAG,
        "tokenizer.chat_templates": 2,  # llama.cpp's list of the names, read as its length
    }
    assert gguf_templates(metadata) == templates
    assert list(gguf_templates(metadata) or {}) == ["default", "tool_use", "rag"]
    only_named = {k: v for k, v in metadata.items() if k != "tokenizer.chat_template"}
    assert gguf_templates(only_named) == {"tool_use": templates["tool_use"], "rag": RAG}
    assert gguf_templates(smollm2_metadata) == templates["default"]
    assert gguf_templates({}) is None
    template = ChatTemplate.from_gguf(metadata, clock=lambda: FROZEN)
    monkeypatch.setattr(oracle, "chat_template", templates)
    for tools in (None, TOOLS):
        expected = oracle.apply_chat_template(
            [USER], tools=tools, tokenize=False, add_generation_prompt=True
        )
        assert template.render([USER], tools=tools) == expected


def test_a_named_template_that_is_empty_or_broken_fails_to_load() -> None:
    with pytest.raises(ModelLoadError, match=r"'tool_use' of m\.gguf is empty"):
        ChatTemplate({"default": "{{ 1 }}", "tool_use": " "}, model="m.gguf")
    with pytest.raises(ModelLoadError, match=r"'rag' chat template of m\.gguf does not compile"):
        ChatTemplate({"default": "{{ 1 }}", "rag": "{% if %}"}, model="m.gguf")
    with pytest.raises(ModelLoadError, match="has no chat template"):
        ChatTemplate({}, model="m.gguf")
    with pytest.raises(ModelLoadError, match="has no chat template"):
        ChatTemplate({"default": "", "tool_use": "{{ 1 }}"}, model="m.gguf")
