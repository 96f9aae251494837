"""The engine's log probabilities in OpenAI's shapes: chat's content list, the legacy lists.

Token texts are each token decoded alone (cached per request); ``bytes`` are that text's
UTF-8 bytes, as vLLM writes them, so a token holding part of a multi-byte character shows
U+FFFD, not its raw bytes. Log probabilities of -inf (a token the model rules out) become
-9999.0, as vLLM writes them: JSON has no infinity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paged_llm.engine.api import TokenLogprob

FLOOR = -9999.0


def _value(logprob: float) -> float:
    """A log probability JSON can carry."""
    return max(logprob, FLOOR)


@dataclass(slots=True)
class TokenTexts:
    """Each token id's text, decoded once per request with the engine's tokenizer."""

    tokenizer: Any
    _texts: dict[int, str] = field(default_factory=dict)

    def __call__(self, token_id: int) -> str:
        """The token's text, decoded alone."""
        text = self._texts.get(token_id)
        if text is None:
            text = str(self.tokenizer.decode([token_id]))
            self._texts[token_id] = text
        return text


def chat_content(records: list[TokenLogprob], texts: TokenTexts) -> list[dict[str, Any]]:
    """Chat's ``logprobs.content``: per token its text, logprob, bytes and top alternatives."""
    out = []
    for rec in records:
        text = texts(rec.token_id)
        top = [
            {"token": texts(tid), "logprob": _value(lp), "bytes": list(texts(tid).encode())}
            for tid, lp in rec.top
        ]
        out.append(
            {
                "token": text,
                "logprob": _value(rec.logprob),
                "bytes": list(text.encode()),
                "top_logprobs": top,
            }
        )
    return out


def completion_logprobs(
    records: list[TokenLogprob | None], texts: TokenTexts, offset: int = 0
) -> dict[str, Any]:
    """The legacy ``logprobs`` object for ``records`` (None: an unscored prompt token).

    ``top_logprobs`` maps token texts to logprobs: the top alternatives and, as vLLM does,
    the chosen token. ``text_offset`` counts characters from ``offset`` (the text so far).
    """
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for rec in records:
        if rec is None:
            raise ValueError("an unscored token needs its id: use prompt_records")
        text = texts(rec.token_id)
        tokens.append(text)
        values.append(_value(rec.logprob))
        top = {texts(tid): _value(lp) for tid, lp in rec.top}
        top.setdefault(text, _value(rec.logprob))
        tops.append(top)
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def echoed_logprobs(
    prompt_ids: list[int],
    prompt: list[TokenLogprob | None],
    records: list[TokenLogprob],
    texts: TokenTexts,
    echo_chars: int,
) -> dict[str, Any]:
    """The legacy object with echo: the prompt's tokens (the first unscored), then the rest.

    The generated tokens' offsets start at ``echo_chars``, the echoed prompt text's length.
    """
    head = completion_logprobs([r for r in prompt if r is not None], texts)
    unscored = [texts(t) for t, r in zip(prompt_ids, prompt, strict=True) if r is None]
    tail = completion_logprobs(list(records), texts, echo_chars)
    # Unscored prompt tokens (the first one) lead, with null values as OpenAI writes them.
    starts = []
    at = 0
    for text in unscored:
        starts.append(at)
        at += len(text)
    head["text_offset"] = starts + [o + at for o in head["text_offset"]]
    return {
        "tokens": unscored + head["tokens"] + tail["tokens"],
        "token_logprobs": [None] * len(unscored) + head["token_logprobs"] + tail["token_logprobs"],
        "top_logprobs": [None] * len(unscored) + head["top_logprobs"] + tail["top_logprobs"],
        "text_offset": head["text_offset"] + tail["text_offset"],
    }


def vllm_prompt_logprobs(
    prompt: list[TokenLogprob | None], texts: TokenTexts
) -> list[dict[str, dict[str, Any]] | None]:
    """The ``prompt_logprobs`` vLLM returns: per prompt token None or {id: logprob, rank, text}."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for rec in prompt:
        if rec is None:
            out.append(None)
            continue
        entry = {
            str(tid): {"logprob": _value(lp), "rank": rank + 1, "decoded_token": texts(tid)}
            for rank, (tid, lp) in enumerate(rec.top)
        }
        entry[str(rec.token_id)] = {
            "logprob": _value(rec.logprob),
            "rank": rec.rank,
            "decoded_token": texts(rec.token_id),
        }
        out.append(entry)
    return out
