"""A model's chat template rendered with jinja2 as transformers' ``apply_chat_template`` does.

The template is the Jinja string a GGUF file keeps under ``tokenizer.chat_template``; a file
may keep others by name under ``tokenizer.chat_template.<name>`` (llama.cpp's converter writes
a model's ``tool_use`` or ``rag`` template there). Several templates are held as transformers
holds them, a dict by name with the file's own under ``default``, and one is chosen per request
by transformers' rule (``get_chat_template``).
Models are tuned on the exact text their template writes, so it has to come out byte for
byte as transformers renders it (``tokenize=False``): the same sandbox and whitespace
rules, the same globals and ``tojson`` filter, and the same preparation of the messages,
tools and extra variables. Nothing here imports torch or transformers.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from paged_llm.engine.errors import InvalidArgument, ModelLoadError
from paged_llm.extras import ENGINE_EXTRA

# Where a GGUF file keeps its template, and its other templates by name after the dot.
GGUF_KEY: Final = "tokenizer.chat_template"
NAMED_PREFIX: Final = GGUF_KEY + "."
# transformers' names: the template used unless another is named, and the one for tools.
DEFAULT: Final = "default"
TOOL_USE: Final = "tool_use"
# The named special tokens transformers hands every template as variables.
SPECIAL_TOKEN_NAMES: Final = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# Names a message's reasoning goes under; templates read the first, gpt-oss's "thinking".
_REASONING_FIELDS: Final = ("reasoning_content", "thinking", "reasoning")
# Appended to the message being continued, then found and cut off again after rendering,
# so whatever the template writes after that message (an end-of-turn token) goes too.
_CONTINUE_TAG: Final = "CONTINUE_FINAL_MESSAGE_TAG "


class TemplateRaised(jinja2.TemplateError):
    """The template called ``raise_exception``: it refuses these messages on purpose."""


class _Generation(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}``: renders its body as it is.

    transformers marks the assistant's text with it to build a training mask; rendering
    is unchanged by it, but a template using it must still compile.
    """

    tags = {"generation"}  # noqa: RUF012 (jinja2 declares it as a plain class attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        """Parse the block into a call of its body, scoped as transformers scopes it."""
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        """The block's text."""
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """``namespace()`` that refuses underscore names, which would reach Python internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        """Take the attributes as ``dict()`` would, after checking their names."""
        # jinja2's own signature trick: ``self`` is not named, so ``namespace(self=1)`` works.
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        """Set an attribute (``{% set ns.x = … %}``) after checking its name."""
        _check_name(name)
        super().__setitem__(name, value)


def _check_name(name: object) -> None:
    """Refuse an underscore name on a namespace."""
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(
            f"a chat template cannot store {name!r} on a namespace (names may not start with _)"
        )


class _Dict:
    """``dict`` for templates: builds dicts, but offers no class to climb through."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        """A new dict, as ``dict(...)``."""
        return dict(*args, **kwargs)

    def fromkeys(self, keys: Any, value: Any = None) -> dict[Any, Any]:
        """A new dict from keys, as ``dict.fromkeys``."""
        return dict.fromkeys(keys, value)


def _raise_exception(message: object) -> NoReturn:
    """The template's own refusal, carried out as an exception."""
    raise TemplateRaised(str(message))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """``json.dumps`` with transformers' defaults: no HTML escaping, non-ASCII kept as is.

    The parameters are positional in the same order as transformers' filter, so a template
    writing ``x|tojson(2)`` gets what it gets there (``ensure_ascii=2``, not an indent).
    """
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _environment(clock: Callable[[], datetime]) -> ImmutableSandboxedEnvironment:
    """A sandbox set up as transformers sets up its own for chat templates."""

    def strftime_now(format: str) -> str:
        """The current local time, formatted (templates print today's date with it)."""
        return clock().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = _Dict()
    env.globals["namespace"] = _Namespace
    return env


def _plain(value: Any) -> Any:
    """``value`` rebuilt from plain JSON types, tuples kept, anything else a placeholder.

    Whatever a template can see could be a way out of the sandbox (an object's methods);
    transformers rebuilds the inputs the same way, so a template sees the same values.
    """
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):  # subclasses (enums) lose their extra methods
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return f"<{type(value).__name__}>"


def _messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages as the template sees them: fresh plain dicts, None values dropped."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidArgument("messages", "messages must be a list of message objects")
    if not messages:
        raise InvalidArgument("messages", "messages is empty: a chat needs at least one message")
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidArgument(
                "messages", f"messages[{index}] is {type(message).__name__}, not an object"
            )
        # APIs send "content": null or "tool_calls": null; templates handle a missing key
        # but would print "None" or fail on a null one.
        plain = _plain({key: item for key, item in message.items() if item is not None})
        reasoning = next((plain[k] for k in _REASONING_FIELDS if plain.get(k) is not None), None)
        if reasoning is not None:
            # Every template finds the reasoning under the name it reads; the key order is
            # transformers' (a template may loop over a message's items).
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        out.append(plain)
    return out


def _tools(tools: Sequence[Mapping[str, Any]] | None) -> list[Any] | None:
    """The tools as the template sees them: OpenAI-style function dicts, rebuilt plain."""
    if tools is None:
        return None
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise InvalidArgument("tools", "tools must be a list of tool objects")
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise InvalidArgument(
                "tools", f"tools[{index}] is {type(tool).__name__}, not a JSON schema object"
            )
    plain: list[Any] = _plain(list(tools))
    return plain


def gguf_templates(metadata: Mapping[str, Any]) -> str | dict[str, str] | None:
    """A GGUF file's templates in the shape of transformers' ``tokenizer.chat_template``.

    The one template as a string when the file has no named ones; else a dict by name with
    ``tokenizer.chat_template`` (when there) as ``default``. None when the file has none.
    """
    named = {
        key.removeprefix(NAMED_PREFIX): value
        for key, value in metadata.items()
        if key.startswith(NAMED_PREFIX) and isinstance(value, str)
    }
    default = metadata.get(GGUF_KEY)
    if not named:
        return default if isinstance(default, str) else None
    return {DEFAULT: default, **named} if isinstance(default, str) else named


def _missing(model: str) -> ModelLoadError:
    """The error for a model without a template to render."""
    return ModelLoadError(
        f"{model} has no chat template ({GGUF_KEY} is missing or empty), and this path "
        f"renders only a model's own template; {ENGINE_EXTRA} (the torch path) runs it"
    )


class ChatTemplate:
    """One model's chat templates, compiled once, one chosen and rendered per request."""

    def __init__(
        self,
        source: str | Mapping[str, str] | None,
        *,
        special_tokens: Mapping[str, str] | None = None,
        clock: Callable[[], datetime] = datetime.now,
        model: str = "the model",
    ) -> None:
        """Compile ``source``; ``special_tokens`` (``bos_token``…) become template variables.

        ``source`` is one template, or several by name as transformers keeps them (see
        ``gguf_templates``). ``clock`` gives the time ``strftime_now`` prints; ``model``
        names the model in errors. Raises ModelLoadError when there is no template or one
        does not compile.
        """
        if isinstance(source, Mapping):
            sources = {str(name): text for name, text in source.items()}
        else:
            sources = {DEFAULT: source} if isinstance(source, str) else {}
        empty = sorted(
            n for n, text in sources.items() if not (isinstance(text, str) and text.strip())
        )
        if not sources or DEFAULT in empty:
            raise _missing(model)
        if empty:
            raise ModelLoadError(
                f"the chat template {empty[0]!r} of {model} is empty ({NAMED_PREFIX}{empty[0]}); "
                f"{ENGINE_EXTRA} (the torch path) runs the model with its default template"
            )
        self.source = source
        self.sources: dict[str, str] = sources
        self.model = model
        self.special_tokens = {name: str(token) for name, token in (special_tokens or {}).items()}
        env = _environment(clock)
        self._templates: dict[str, jinja2.Template] = {}
        for name, text in sources.items():
            try:
                self._templates[name] = env.from_string(text)
            except jinja2.TemplateError as err:
                line = (
                    f" (line {err.lineno})" if isinstance(err, jinja2.TemplateSyntaxError) else ""
                )
                which = "the chat template"
                if isinstance(source, Mapping):
                    which = f"the {name!r} chat template"
                raise ModelLoadError(
                    f"{which} of {model} does not compile with jinja2{line}: {err}; "
                    f"{ENGINE_EXTRA} (the torch path) runs it"
                ) from err

    @classmethod
    def from_gguf(
        cls,
        metadata: Mapping[str, Any],
        *,
        clock: Callable[[], datetime] = datetime.now,
        model: str = "the model",
    ) -> ChatTemplate:
        """The template of a GGUF file from its metadata values (``MetadataReader.values``).

        The special tokens come from ``tokenizer.ggml.tokens`` when it is there as a list
        (``values(keep_strings={"tokenizer.ggml.tokens"})``), picked by the ids the file
        names for them, as transformers' GGUF tokenizer picks them.
        """
        tokens = metadata.get("tokenizer.ggml.tokens")
        special: dict[str, str] = {}
        if isinstance(tokens, list):
            for name, key in (
                ("bos_token", "tokenizer.ggml.bos_token_id"),
                ("eos_token", "tokenizer.ggml.eos_token_id"),
                ("unk_token", "tokenizer.ggml.unknown_token_id"),
                ("pad_token", "tokenizer.ggml.padding_token_id"),
            ):
                index = metadata.get(key)
                if isinstance(index, int) and 0 <= index < len(tokens):
                    special[name] = str(tokens[index])
        return cls(gguf_templates(metadata), special_tokens=special, clock=clock, model=model)

    def choose(self, chat_template: str | None = None, tools: object = None) -> str:
        """The name of the template a request renders with: transformers' choice.

        A name the caller gives; else ``tool_use`` when ``tools`` is given (not None, as
        transformers tests it) and the model has it; else ``default``. Unlike transformers,
        a name the model lacks is refused, not compiled as a template's own text: a request
        never runs Jinja code of its own.
        """
        if chat_template is not None:
            if chat_template in self.sources:
                return chat_template
            raise InvalidArgument(
                "chat_template",
                f"{self.model} has no chat template named {chat_template!r}; its templates: "
                f"{', '.join(sorted(self.sources))}",
            )
        if tools is not None and TOOL_USE in self.sources:
            return TOOL_USE
        if DEFAULT in self.sources:
            return DEFAULT
        raise InvalidArgument(
            "chat_template",
            f"{self.model} has no default chat template; name one of "
            f"{', '.join(sorted(self.sources))}",
        )

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool | str = False,
        chat_template: str | None = None,
        **variables: Any,
    ) -> str:
        """The prompt text for ``messages``, as transformers renders it with ``tokenize=False``.

        ``tools`` are OpenAI-style function dicts; ``variables`` (``enable_thinking``,
        ``date_string``, a special token to override) reach the template as they are.
        ``continue_final_message`` (True for ``content``, or a field's name) leaves the last
        message open for the model to go on; it needs ``add_generation_prompt=False``.
        ``chat_template`` names one of the model's templates (see ``choose``).
        Raises InvalidArgument when the inputs are malformed or the template refuses them.
        """
        if continue_final_message and add_generation_prompt:
            raise InvalidArgument(
                "continue_final_message",
                "continue_final_message and add_generation_prompt exclude each other: one "
                "continues the last message, the other opens a new assistant turn",
            )
        name = self.choose(chat_template, tools)
        chat = _messages(messages)
        tool_schemas = _tools(tools)
        if documents is not None and not all(isinstance(d, Mapping) for d in documents):
            raise InvalidArgument("documents", "documents must be objects with title and text")
        context = _plain({**self.special_tokens, **variables})
        continued = self._mark_continued(chat, continue_final_message, self.sources[name])
        try:
            text = self._templates[name].render(
                messages=chat,
                tools=tool_schemas,
                documents=_plain(documents),
                add_generation_prompt=add_generation_prompt,
                **context,
            )
        except TemplateRaised as err:
            raise InvalidArgument(
                "messages", f"the chat template of {self.model} refuses these messages: {err}"
            ) from err
        except Exception as err:
            # A template is a program run on the request's data; whatever it trips over (a
            # missing key, a type it cannot add) is a request this model cannot take.
            raise InvalidArgument(
                "messages",
                f"the chat template of {self.model} failed on these messages: "
                f"{type(err).__name__}: {err}",
            ) from err
        return text if continued is None else self._cut_continued(text, continued)

    def _mark_continued(
        self, chat: list[dict[str, Any]], field: bool | str, source: str
    ) -> str | None:
        """Tag the text to continue in the last message; return that text (None: no tag).

        ``source`` is the chosen template's text, which must read the field continued.
        """
        if not field:
            return None
        name = field if isinstance(field, str) else "content"
        last = chat[-1]
        final = last.get(name)
        if final is None:
            raise InvalidArgument(
                "continue_final_message", f"the last message has no {name!r} to continue"
            )
        names = [name]
        if name in _REASONING_FIELDS:
            # The reasoning went in under several names; tag each, whichever one is read.
            names = [n for n in _REASONING_FIELDS if last.get(n) == final]
        if not any(n in source for n in names):
            raise InvalidArgument(
                "continue_final_message", f"the chat template of {self.model} never reads {name!r}"
            )
        if isinstance(final, (list, tuple)):
            for block in reversed(final):
                if "text" in block:
                    text = block["text"]
                    block["text"] = text + _CONTINUE_TAG
                    return str(text)
            raise InvalidArgument(
                "continue_final_message", "the last message has no text block to continue"
            )
        for n in names:
            last[n] = last[n] + _CONTINUE_TAG
        return str(final)

    def _cut_continued(self, text: str, final: str) -> str:
        """``text`` cut right after the continued message, where the tag was put."""
        tag = _CONTINUE_TAG.strip()
        if final.strip() not in text or tag not in text:
            raise InvalidArgument(
                "continue_final_message",
                f"the chat template of {self.model} drops part of the message to continue",
            )
        at = text.rindex(tag)
        if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
            return text[:at]
        # The template trimmed the message's trailing space, so trim to match.
        return text[:at].rstrip()
