"""Grammars compiled with llguidance over a model's vocabulary, and matchers that follow tokens.

llguidance needs no torch and ships wheels for musl and aarch64, so the torch runner and
the numpy runner share it. What the engine accepts and how it reads each field:

- ``json_schema``: compact JSON (``", "`` and ``": "`` between items, no other
  whitespace), objects closed to the properties they list, free numbers and items bounded
  (json_bounds.py);
- ``json_object``: any JSON object, bounded the same way;
- ``regex``: a Rust ``regex`` pattern, matched whole;
- ``grammar``: GBNF (llama.cpp's, which xgrammar's EBNF with ``root ::= ...`` also is) or
  llguidance's Lark (``start: ...``);
- ``structural_tag``: xgrammar's structural tag JSON (structural_tag.py).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from paged_llm.engine.structured.json_bounds import JsonBounds, any_object_schema, bounded_schema
from paged_llm.engine.structured.structural_tag import (
    JSON_ESCAPES,
    json_options,
    structural_tag_lark,
)

# Compact JSON as xgrammar wrote it without free whitespace: small models otherwise drift
# into endless newlines inside an object until max_tokens.
COMPACT = {
    "item_separator": ", ",
    "key_separator": ": ",
    "whitespace_flexible": False,
    **JSON_ESCAPES,
}


def _llguidance() -> Any:
    """The llguidance module, imported on first use (a clear error when it is missing)."""
    # Imported here: only constrained requests need it, and a missing one is reported then.
    import llguidance

    return llguidance


@dataclass(slots=True, frozen=True)
class Grammar:
    """One compiled constraint: a pristine matcher that every request's matcher copies."""

    template: Any
    stop_token_ids: frozenset[int]
    tokenizer: Any
    # Whether the answer is JSON, whose strings the engine caps at bounds.string_chars.
    is_json: bool = False

    def matcher(self) -> Matcher:
        """A fresh matcher at the grammar's start."""
        return Matcher(self.template.deep_copy(), self.stop_token_ids, self.tokenizer)


class Matcher:
    """One request's place in its grammar: tokens taken, the mask of the next, forced ones.

    A refused token leaves the matcher as it was (llguidance's own matcher would enter an
    error state it never leaves), so the closer can probe with it.
    """

    __slots__ = ("_llt", "_matcher", "_stops", "ended")

    def __init__(self, matcher: Any, stop_token_ids: frozenset[int], tokenizer: Any) -> None:
        """Wrap an llguidance matcher."""
        self._matcher = matcher
        self._stops = stop_token_ids
        self._llt = tokenizer
        # Whether the matcher took an end token: nothing more may follow.
        self.ended = False

    @property
    def inner(self) -> Any:
        """The llguidance matcher (for filling masks of a batch at once)."""
        return self._matcher

    def accept_token(self, token: int) -> bool:
        """Take ``token`` if the grammar allows it here; False (and no change) if not."""
        if self.ended:
            return False
        if token in self._stops:
            # llguidance's validation says no to an end token once the grammar is done,
            # though it takes one wherever the grammar may end.
            if not self._matcher.is_accepting() or not self._matcher.consume_token(token):
                return False
            self.ended = True
            return True
        return bool(self._matcher.try_consume_tokens([token]) == 1)

    def accept_string(self, text: str) -> bool:
        """Take ``text`` (tokenized any way: llguidance follows bytes); False if refused."""
        tokens = self._llt.tokenize_str(text)
        taken = self._matcher.try_consume_tokens(tokens)
        return bool(taken == len(tokens))

    def rollback(self, count: int) -> None:
        """Undo the last ``count`` tokens."""
        if count > 0:
            self._matcher.rollback(count)
            self.ended = False

    def fork(self) -> Matcher:
        """An independent copy in the same state (for looking ahead)."""
        twin = Matcher(self._matcher.deep_copy(), self._stops, self._llt)
        twin.ended = self.ended
        return twin

    def is_completed(self) -> bool:
        """Whether the grammar may end here (an end token is allowed)."""
        return bool(self._matcher.is_accepting())

    def is_terminated(self) -> bool:
        """Whether the matcher took an end token."""
        return self.ended

    def is_error(self) -> bool:
        """Whether llguidance reports an error (a grammar or resource limit it hit)."""
        return bool(self._matcher.is_error())

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces from here (jump-forward), possibly none."""
        return list(self._matcher.compute_ff_tokens())

    def fill_mask(self, bitmask: npt.NDArray[np.int32], row: int) -> None:
        """Write the allowed next tokens into ``bitmask[row]`` (bit i of the words: token i)."""
        target = bitmask[row]
        self._matcher.unsafe_compute_mask_ptr(target.ctypes.data, target.nbytes)


class GrammarCompiler:
    """Compiles constraints over one tokenizer's vocabulary (its llguidance view built once)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int]) -> None:
        """Build the llguidance view of ``tokenizer`` (about half a second at 49,152 tokens).

        ``tokenizer`` is a Hugging Face fast tokenizer or the engine's GGUF tokenizer:
        both hold a ``tokenizers.Tokenizer`` as ``backend_tokenizer``.
        """
        llg = _llguidance()
        backend = copy.copy(tokenizer.backend_tokenizer)
        # Padding or truncation settings would change how llguidance tokenizes text.
        backend.no_padding()
        backend.no_truncation()
        # The mask covers the model's rows and every token the tokenizer has.
        self.vocab_size = max(vocab_size, backend.get_vocab_size(with_added_tokens=True))
        stops = list(stop_token_ids) or [tokenizer.eos_token_id]
        self.tokenizer = llg.LLTokenizer(backend.to_str(), n_vocab=self.vocab_size, eos_token=stops)
        self.stop_token_ids = frozenset(int(t) for t in stops if t is not None)

    def special_token(self, text: str) -> int | None:
        """The id of the special token that spells ``text`` alone, or None."""
        ids = self.tokenizer.tokenize_str(text, parse_special=True)
        if len(ids) == 1 and self.tokenizer.is_special_token(ids[0]):
            return int(ids[0])
        return None

    def grammar_text(self, field: str, text: str, bounds: JsonBounds | None) -> str:
        """The llguidance grammar of one constraint field (ValueError where it cannot be read).

        JSON (a schema, any object, tool calls) gets ``bounds`` on its free values; a
        regex or grammar the caller wrote is compiled as written.
        """
        llg = _llguidance()
        if field == "json_schema":
            schema = json.loads(text)
            strict = bounded_schema(schema, bounds, strict=True)
            return str(llg.grammar_from("json_schema", json.dumps(json_options(strict, COMPACT))))
        if field == "json_object":
            schema = json_options(any_object_schema(bounds), COMPACT)
            return str(llg.grammar_from("json_schema", json.dumps(schema)))
        if field == "structural_tag":
            lark = structural_tag_lark(json.loads(text), bounds, self.special_token)
            return str(llg.grammar_from("lark", lark))
        if field == "regex":
            return str(llg.grammar_from("regex", text))
        if field == "grammar":
            # GBNF (root ::= ...) is converted to Lark; Lark passes through.
            return str(llg.grammar_from("grammar", text))
        raise ValueError(f"unknown structured output field {field!r}")

    def compile(self, field: str, text: str, bounds: JsonBounds | None) -> Grammar:
        """Compile one constraint; ValueError with llguidance's message where it cannot."""
        llg = _llguidance()
        grammar = self.grammar_text(field, text, bounds)
        template = llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if template.is_error():
            raise ValueError(template.get_error())
        json_answer = field in ("json_schema", "json_object", "structural_tag")
        return Grammar(template, self.stop_token_ids, self.tokenizer, is_json=json_answer)

    def executor(self, threads: int = 2) -> Any:
        """A pool that fills the masks of a batch's matchers at once."""
        return _llguidance().LLExecutor(num_threads=threads)
