"""An OpenAI-compatible chat client on a caller's aiohttp session: SSE streams, models, test."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .errors import (
    AuthenticationError,
    CannotConnectError,
    ClientError,
    RequestError,
    ServerError,
)

DEFAULT_TIMEOUT_S = 60.0
# Servers that do not schedule by priority (vLLM without --scheduling-policy priority)
# refuse a non-zero one; such a server gets none after its first refusal.
_PRIORITY_REFUSED = "priority"


@dataclass(slots=True, frozen=True)
class ModelInfo:
    """One entry of ``/v1/models``; ``max_model_len`` where the server tells it (vLLM does)."""

    id: str
    owned_by: str | None = None
    max_model_len: int | None = None


@dataclass(slots=True, frozen=True)
class ToolCall:
    """A complete tool call from a stream: arguments as the JSON text the server sent."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True, frozen=True)
class Usage:
    """Token counts of a finished request."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """A generated token's log probability and its top alternatives, as OpenAI's chat sends."""

    token: str
    logprob: float
    # The token's UTF-8 bytes where the server sent them (OpenAI's ``bytes``), else None.
    bytes: tuple[int, ...] | None = None
    # (token, log probability) pairs, most likely first.
    top: tuple[tuple[str, float], ...] = ()


@dataclass(slots=True)
class ChatChunk:
    """One piece of a streamed answer: text, reasoning, and at the end the totals."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None
    # This piece's tokens' log probabilities, when the request asked (chat_request logprobs).
    logprobs: list[TokenLogprob] = field(default_factory=list)


def parse_logprobs(value: Any) -> list[TokenLogprob]:
    """The tokens of a chat choice's ``logprobs`` object (``{"content": [...]}``), if any."""
    if not isinstance(value, Mapping):
        return []
    out = []
    for entry in value.get("content") or ():
        if not isinstance(entry, Mapping):
            continue
        raw = entry.get("bytes")
        top = tuple(
            (str(alt.get("token", "")), float(alt.get("logprob", 0.0)))
            for alt in entry.get("top_logprobs") or ()
            if isinstance(alt, Mapping)
        )
        out.append(
            TokenLogprob(
                token=str(entry.get("token", "")),
                logprob=float(entry.get("logprob", 0.0)),
                bytes=tuple(int(b) for b in raw) if isinstance(raw, list) else None,
                top=top,
            )
        )
    return out


def chat_request(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    seed: int | None = None,
    stop: Sequence[str] = (),
    priority: int | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_grammar: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    response_format: Mapping[str, Any] | None = None,
    stream: bool = True,
    repetition_penalty: float | None = None,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    logprobs: bool = False,
    top_logprobs: int | None = None,
) -> dict[str, Any]:
    """The body of a chat completion request; fields left at None are not sent.

    ``logprobs`` asks for each token's log probability, ``top_logprobs`` (0..20) for that
    many alternatives too (OpenAI's fields; this server and vLLM answer both).
    """
    body: dict[str, Any] = {"model": model, "messages": list(messages), "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    optional: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        # OpenAI itself has no top_k; send it only when it does something.
        "top_k": top_k or None,
        # vLLM's and llama.cpp's, not OpenAI's: sent only when it filters.
        "min_p": min_p or None,
        "seed": seed,
        "stop": list(stop) or None,
        "priority": priority,
        "response_format": dict(response_format) if response_format else None,
        # vLLM's and this engine's: the chat template's variables (enable_thinking).
        "chat_template_kwargs": dict(chat_template_kwargs) if chat_template_kwargs else None,
        # Unsent, the server applies the model's own (this engine and vLLM both do).
        "repetition_penalty": repetition_penalty,
        "frequency_penalty": frequency_penalty or None,
        "presence_penalty": presence_penalty or None,
        "logprobs": True if logprobs or top_logprobs is not None else None,
        "top_logprobs": top_logprobs,
    }
    body.update({key: value for key, value in optional.items() if value is not None})
    if tools:
        body["tools"] = list(tools)
        body["tool_choice"] = "auto"
        # paged-llm serve's extension (vLLM ignores it): narrower schemas for decoding only
        if tool_grammar and list(tool_grammar) != list(tools):
            body["tool_grammar"] = list(tool_grammar)
    return body


def _error_message(status: int, text: str) -> tuple[str, str | None, str | None]:
    """Message, param and code of an error answer (OpenAI's JSON, or whatever text came)."""
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict):
        return str(error.get("message") or text), error.get("param"), error.get("code")
    if isinstance(error, str):
        return error, None, None
    return (text.strip()[:500] or f"HTTP {status}"), None, None


def _seconds(retry_after: str | None) -> float | None:
    """A Retry-After header's seconds (None when absent or an HTTP date)."""
    try:
        return float(retry_after) if retry_after else None
    except ValueError:
        return None


def status_error(status: int, text: str, retry_after: str | None = None) -> ClientError:
    """The error for an HTTP error status and its body."""
    message, param, code = _error_message(status, text)
    if status in (401, 403):
        return AuthenticationError(message)
    if status >= 500:
        return ServerError(status, message, retry_after=_seconds(retry_after), code=code)
    return RequestError(status, message, param=param, code=code)


def unreachable(url: str, err: BaseException) -> CannotConnectError:
    """A failed connection in plain words (the library's text stays in the chain)."""
    if isinstance(err, aiohttp.ClientConnectorDNSError):
        why = "its host name is not known"
    elif isinstance(err, aiohttp.ClientConnectorError):
        why = "nothing accepts connections there (is it running?)"
    elif isinstance(err, (aiohttp.ServerTimeoutError, TimeoutError)):
        why = "it did not answer in time"
    elif isinstance(err, aiohttp.ServerDisconnectedError):
        why = "it closed the connection"
    else:
        why = "the connection failed"
    return CannotConnectError(f"no answer from {url}: {why}")


class _ToolCallAccumulator:
    """Joins streamed tool-call fragments (by index) into whole calls."""

    def __init__(self) -> None:
        self._calls: dict[int, dict[str, str]] = {}

    def feed(self, fragments: list[dict[str, Any]]) -> None:
        """Add one delta's fragments."""
        for fragment in fragments:
            call = self._calls.setdefault(
                int(fragment.get("index", len(self._calls))), {"id": "", "name": "", "args": ""}
            )
            call["id"] = fragment.get("id") or call["id"]
            function = fragment.get("function") or {}
            call["name"] += function.get("name") or ""
            arguments = function.get("arguments")
            call["args"] += arguments if isinstance(arguments, str) else json.dumps(arguments or {})

    def calls(self) -> list[ToolCall]:
        """The calls so far, in index order."""
        return [
            ToolCall(id=c["id"] or f"call_{i}", name=c["name"], arguments=c["args"] or "{}")
            for i, c in sorted(self._calls.items())
        ]


class OpenAIClient:
    """Talks to one OpenAI-compatible server (this project's, vLLM, llama.cpp, Ollama's /v1)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        api_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Use ``session`` (not closed here) for a server at ``url``, with or without /v1."""
        root = url.strip().rstrip("/")
        self.root = root.removesuffix("/v1")
        self.api = f"{self.root}/v1"
        self._session = session
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = timeout
        self.sends_priority = True

    def _timeout(self) -> aiohttp.ClientTimeout:
        """No limit on a whole answer; a limit on connecting and on each silence."""
        return aiohttp.ClientTimeout(total=None, sock_connect=self.timeout, sock_read=self.timeout)

    async def _get(self, url: str) -> tuple[int, str]:
        """GET a URL: status and body text; connection failures raise CannotConnectError."""
        try:
            async with self._session.get(
                url, headers=self._headers, timeout=self._timeout()
            ) as resp:
                return resp.status, await resp.text()
        except (aiohttp.ClientError, TimeoutError) as err:
            raise unreachable(self.root, err) from err

    async def health(self) -> bool | None:
        """Whether the server is ready (``GET /health``: 200 yes, 503 not yet, loading).

        None when the server has no such endpoint (Ollama).
        """
        status, _ = await self._get(f"{self.root}/health")
        if status in (200, 503):
            return status == 200
        return None

    async def models(self) -> list[ModelInfo]:
        """The models the server offers (``GET /v1/models``)."""
        status, text = await self._get(f"{self.api}/models")
        if status != 200:
            raise status_error(status, text)
        try:
            entries = json.loads(text)["data"]
            return [
                ModelInfo(
                    id=str(entry["id"]),
                    owned_by=entry.get("owned_by"),
                    max_model_len=entry.get("max_model_len") or entry.get("context_length"),
                )
                for entry in entries
            ]
        except (ValueError, KeyError, TypeError) as err:
            raise CannotConnectError(
                f"{self.api}/models is not an OpenAI model list: {text[:200]}"
            ) from err

    async def metrics_text(self) -> str | None:
        """The server's Prometheus text (``GET /metrics``), or None when it has none."""
        status, text = await self._get(f"{self.root}/metrics")
        if status == 404:
            return None
        if status != 200:
            raise status_error(status, text)
        return text

    async def block_map(self) -> dict[str, Any] | None:
        """The KV block map of a Paged LLM server (``GET /block_map``); None from others."""
        status, text = await self._get(f"{self.root}/block_map")
        if status in (404, 405):
            return None
        if status != 200:
            raise status_error(status, text)
        try:
            data = json.loads(text)
        except ValueError:
            return None
        return data if isinstance(data, dict) and "cells" in data else None

    async def expect_interactive(self) -> bool | None:
        """Tell a Paged LLM server a voice query is coming (``POST /expect_interactive``).

        True when taken, False when the server has no such call (404 or 405: vLLM,
        llama.cpp, Ollama), None otherwise (unreachable, still loading, refused): the hint
        only shortens the server's steps, and the query itself reports a real outage.
        """
        try:
            async with self._session.post(
                f"{self.root}/expect_interactive", headers=self._headers, timeout=self._timeout()
            ) as resp:
                if resp.status in (404, 405):
                    return False
                return True if resp.status == 204 else None
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def count_tokens(self, model: str, text: str) -> int | None:
        """Tokens in ``text`` by the server's tokenizer (vLLM's ``/tokenize``); None without."""
        return await self._tokenize({"model": model, "prompt": text, "add_special_tokens": False})

    async def count_chat_tokens(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> int | None:
        """Prompt tokens of chat messages through the server's chat template; None without.

        vLLM's ``/tokenize`` takes messages as a chat completion does and renders them with
        the generation prompt, so the count is the request's prompt tokens.
        """
        body: dict[str, Any] = {
            "model": model,
            "messages": list(messages),
            "add_generation_prompt": True,
        }
        if tools:
            body["tools"] = list(tools)
        if chat_template_kwargs:
            body["chat_template_kwargs"] = dict(chat_template_kwargs)
        return await self._tokenize(body)

    async def _tokenize(self, body: Mapping[str, Any]) -> int | None:
        """The count ``/tokenize`` gives for ``body``; None where the server has no such call."""
        data = await self._tokenized(body)
        count = data.get("count") if data is not None else None
        return int(count) if isinstance(count, int) else None

    async def tokens(
        self,
        model: str,
        *,
        text: str | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int] | None:
        """Token ids by the server's ``/tokenize`` (vLLM's); None where it has none.

        ``text`` without special tokens, or chat ``messages`` through the server's template
        with the generation prompt, as a chat completion renders them.
        """
        body: dict[str, Any] = {"model": model}
        if messages is not None:
            body.update(messages=list(messages), add_generation_prompt=True)
            if chat_template_kwargs:
                body["chat_template_kwargs"] = dict(chat_template_kwargs)
        else:
            body.update(prompt=text, add_special_tokens=False)
        data = await self._tokenized(body)
        ids = data.get("tokens") if data is not None else None
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            return None
        return ids

    async def score_tail(
        self, model: str, prompt: Sequence[int], tail: int, priority: int | None = None
    ) -> list[float] | None:
        """Log probabilities of the last ``tail`` tokens of ``prompt`` (vLLM's prompt_logprobs).

        A ``tail`` of 0 only reads the prompt (into the server's prefix cache): [].

        A completion of one token; ``prompt_logprobs_from`` (this project's server) scores
        only the tail, so the rest may come from its prefix cache; vLLM ignores it. None
        where the server returns no prompt log probabilities.
        """
        body: dict[str, Any] = {
            "model": model,
            "prompt": list(prompt),
            "max_tokens": 1,
            "temperature": 0,
        }
        if tail:
            body.update(prompt_logprobs=0, prompt_logprobs_from=-tail)
        if priority is not None and self.sends_priority:
            body["priority"] = priority
        try:
            data = await self._post(f"{self.api}/completions", body)
        except RequestError as err:
            if "priority" not in body or _PRIORITY_REFUSED not in str(err).lower():
                raise
            self.sends_priority = False
            body.pop("priority")
            data = await self._post(f"{self.api}/completions", body)
        if not tail:
            return []  # only read into the server's prefix cache
        choices = data.get("choices") if isinstance(data, dict) else None
        scored = choices[0].get("prompt_logprobs") if choices else None
        if not isinstance(scored, list) or len(scored) != len(prompt):
            return None
        values: list[float] = []
        for token, entry in zip(prompt[-tail:], scored[-tail:], strict=True):
            found = entry.get(str(token)) if isinstance(entry, dict) else None
            if not isinstance(found, dict) or not isinstance(found.get("logprob"), int | float):
                return None
            values.append(float(found["logprob"]))
        return values

    async def _post(self, url: str, body: Mapping[str, Any]) -> Any:
        """POST ``body`` and read the JSON answer; raises the ClientError of a failure."""
        try:
            async with self._session.post(
                url, json=body, headers=self._headers, timeout=self._timeout()
            ) as resp:
                if resp.status != 200:
                    raise status_error(
                        resp.status, await resp.text(), resp.headers.get("Retry-After")
                    )
                return await resp.json()
        except (aiohttp.ClientError, TimeoutError) as err:
            raise unreachable(self.root, err) from err

    async def _tokenized(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """What ``/tokenize`` answers for ``body``; None where the server has no such call."""
        try:
            async with self._session.post(
                f"{self.root}/tokenize",
                json=body,
                headers=self._headers,
                timeout=self._timeout(),
            ) as resp:
                if resp.status != 200:
                    return None
                data = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    async def test_chat(self, model: str) -> None:
        """Ask for one token: raises the error a real request would meet."""
        async for _chunk in self.stream_chat(
            chat_request(model, [{"role": "user", "content": "Hi"}], max_tokens=1)
        ):
            pass

    async def stream_chat(self, body: Mapping[str, Any]) -> AsyncIterator[ChatChunk]:
        """Stream a chat completion (``body`` from chat_request); the last chunk has totals."""
        body = dict(body)
        if not self.sends_priority:
            body.pop("priority", None)
        try:
            async for chunk in self._stream(body):
                yield chunk
        except RequestError as err:
            if "priority" not in body or _PRIORITY_REFUSED not in str(err).lower():
                raise
            # Refused before anything streamed: ask again without, and from now on.
            self.sends_priority = False
            body.pop("priority")
            async for chunk in self._stream(body):
                yield chunk

    async def _stream(self, body: dict[str, Any]) -> AsyncIterator[ChatChunk]:
        """One streamed request, read as server-sent events."""
        url = f"{self.api}/chat/completions"
        tools = _ToolCallAccumulator()
        finish_reason: str | None = None
        usage: Usage | None = None
        try:
            async with self._session.post(
                url, json=body, headers=self._headers, timeout=self._timeout()
            ) as resp:
                if resp.status != 200:
                    raise status_error(
                        resp.status, await resp.text(), resp.headers.get("Retry-After")
                    )
                async for data in _sse_data(resp.content):
                    if data == "[DONE]":
                        break
                    event = _event(data)
                    if (usage_data := event.get("usage")) is not None:
                        usage = _usage(usage_data)
                    for choice in event.get("choices") or ():
                        delta = choice.get("delta") or {}
                        if fragments := delta.get("tool_calls"):
                            tools.feed(fragments)
                        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                        content = delta.get("content")
                        logprobs = parse_logprobs(choice.get("logprobs"))
                        if content or reasoning or logprobs:
                            yield ChatChunk(
                                content=content or "",
                                reasoning=reasoning or "",
                                logprobs=logprobs,
                            )
                        finish_reason = choice.get("finish_reason") or finish_reason
        except (aiohttp.ClientError, TimeoutError) as err:
            raise unreachable(self.root, err) from err
        if finish_reason is None and usage is None:
            raise CannotConnectError(f"{url}: the answer ended before it finished")
        yield ChatChunk(tool_calls=tools.calls(), finish_reason=finish_reason, usage=usage)


async def _sse_data(content: aiohttp.StreamReader) -> AsyncIterator[str]:
    """The ``data:`` payloads of an event stream, multi-line events joined."""
    lines: list[str] = []
    async for raw in content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if lines:
                yield "\n".join(lines)
                lines = []
        elif line.startswith("data:"):
            lines.append(line[5:].removeprefix(" "))
        # Comments (":") and other fields (event:, id:, retry:) carry nothing for chat.
    if lines:
        yield "\n".join(lines)


def _event(data: str) -> dict[str, Any]:
    """One event's JSON; an error event raises the error it reports."""
    try:
        event = json.loads(data)
    except ValueError as err:
        raise CannotConnectError(
            f"the server sent an event that is not JSON: {data[:200]}"
        ) from err
    if not isinstance(event, dict):
        raise CannotConnectError(f"the server sent an event that is not an object: {data[:200]}")
    if "error" in event:
        error = event["error"]
        code = error.get("code") if isinstance(error, dict) else None
        status = code if isinstance(code, int) and 400 <= code < 600 else 500
        raise status_error(status, json.dumps({"error": error}))
    return event


def _usage(data: Mapping[str, Any]) -> Usage:
    """Token counts from a usage object."""
    details = data.get("prompt_tokens_details") or {}
    return Usage(
        prompt_tokens=int(data.get("prompt_tokens") or 0),
        completion_tokens=int(data.get("completion_tokens") or 0),
        cached_tokens=int(details.get("cached_tokens") or 0),
    )
