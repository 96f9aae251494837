"""Structured output: JSON schemas, regexes, grammars and tool-call tags enforced while decoding.

Grammars come from llguidance (matcher.py), masks are numpy bitmasks (bitmask.py): no
torch here, so the torch runner (which hands its logits over as a numpy view, or turns a
mask into a tensor on its GPU) and the numpy runner share all of it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from paged_llm.engine.core.sequence import SamplingParams, Sequence
from paged_llm.engine.errors import RequestRejected
from paged_llm.engine.structured import bitmask as bits
from paged_llm.engine.structured.closer import Closer
from paged_llm.engine.structured.json_bounds import JsonBounds, open_string_length
from paged_llm.engine.structured.matcher import Grammar, GrammarCompiler, Matcher

# Cached compiled grammars, by (field, text); schemas repeat (an AI task, a tool list).
_CACHE_LIMIT = 256
# Characters a token spells at most, for a cheap lower bound on an output's length.
_TOKEN_CHARS = 16
# Every this many output tokens a request's way to its grammar's end is measured again
# (its length decides when the end must be forced); closer to max_tokens, every token.
_CLOSING_EVERY = 16
# Tokens kept in hand beyond the way to the end: one free token can lengthen the way (a
# number's sign, an object opened), so the end is forced while this many are still spare.
_CLOSING_SPARE = 8
# A string whose last tokens repeat one unit of up to _LOOP_UNIT tokens _LOOP_TIMES times
# (at least _LOOP_MIN tokens) is a loop ("1.1.1.1.", "la la la la"): a small model under
# greedy decoding does not leave one, so the engine closes the string there.
_LOOP_UNIT = 8
_LOOP_TIMES = 8
_LOOP_MIN = 16
# Threads that fill a step's masks (the engine's CPU forward needs the other cores).
_MASK_THREADS = 2


@dataclass(slots=True)
class MaskBatch:
    """A step's masks: one bitmask row per sequence, filled for ``rows``, forced tokens apart."""

    bitmask: npt.NDArray[np.int32]
    # Rows whose mask was filled (constrained and not forced).
    rows: list[int] = field(default_factory=list)
    # Rows that must take one token now (closing the answer in time), by row.
    forced: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Tracker:
    """A request's matcher and how many of its output tokens the matcher has consumed."""

    matcher: Matcher
    num_accepted: int = 0
    # Whether the answer is JSON, whose strings the engine caps at bounds.string_chars.
    json: bool = False
    # Tokens left at which the way to the end is measured every step (twice its last length
    # and some): far from max_tokens it is measured only every _CLOSING_EVERY tokens.
    closing_window: int = 1 << 30
    # Once the end must be forced: the way, and how many output tokens came before it.
    closing: list[int] | None = None
    closing_from: int = 0


class StructuredOutput:
    """Compiles each grammar once, keeps a matcher per constrained request, masks logits.

    Compiling is thread-safe, so a caller can compile ahead on a worker thread and the
    engine thread then finds the grammar in the cache. The matcher is kept in step with
    the sequence's output tokens before every mask: tokens a matcher has not seen are
    replayed and surplus ones rolled back, so preemption (recompute keeps the output
    tokens) and any skipped step cannot leave it out of step.
    """

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: tuple[int, ...],
        bounds: JsonBounds | None = None,
    ) -> None:
        """Remember the tokenizer; llguidance's view of the vocabulary is built on first use."""
        self._tokenizer = tokenizer
        self.bounds = bounds or JsonBounds()
        self.vocab_size = vocab_size
        self._stop_token_ids = list(stop_token_ids)
        self._lock = threading.Lock()
        self._compiler: GrammarCompiler | None = None
        self._cache: dict[tuple[str, str], Grammar] = {}
        self._trackers: dict[str, _Tracker] = {}
        self._bitmask: npt.NDArray[np.int32] | None = None
        self._executor: Any = None
        self._closer: Closer | None = None
        # Seconds the last step spent filling and applying masks (benchmarks read it).
        self.last_mask_s = 0.0

    def _get_compiler(self) -> GrammarCompiler:
        """The grammar compiler over this model's vocabulary (built once, under the lock)."""
        if self._compiler is None:
            try:
                self._compiler = GrammarCompiler(
                    self._tokenizer, self.vocab_size, self._stop_token_ids
                )
            except ImportError as err:
                raise RequestRejected(
                    "structured_output_unavailable",
                    f"structured output needs the llguidance package (pip install llguidance): "
                    f"{err}",
                ) from err
        return self._compiler

    @property
    def mask_vocab_size(self) -> int:
        """Tokens a mask row covers (the model's rows, or the tokenizer's if it has more)."""
        return self._compiler.vocab_size if self._compiler is not None else self.vocab_size

    def compile(self, params: SamplingParams) -> Grammar | None:
        """The compiled grammar for ``params`` (None when free); RequestRejected if it fails."""
        spec = params.structured
        if spec is None:
            return None
        with self._lock:
            compiled = self._cache.get(spec)
            if compiled is not None:
                return compiled
            compiler = self._get_compiler()
        field_name, text = spec
        try:
            compiled = compiler.compile(field_name, text, self.bounds)
        except (RuntimeError, ValueError, TypeError) as err:
            raise RequestRejected(
                "invalid_structured_output", f"{field_name} cannot be enforced: {err}"
            ) from err
        with self._lock:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.pop(next(iter(self._cache)))
            self._cache[spec] = compiled
        return compiled

    def add(self, seq: Sequence) -> None:
        """Start a matcher for a constrained request (compiling its grammar if needed)."""
        compiled = self.compile(seq.params)
        if compiled is None:
            return
        self._trackers[seq.request_id] = _Tracker(compiled.matcher(), json=compiled.is_json)

    def is_constrained(self, request_id: str) -> bool:
        """Whether the request decodes under a grammar."""
        return request_id in self._trackers

    def release(self, request_id: str) -> None:
        """Drop a finished request's matcher."""
        self._trackers.pop(request_id, None)

    def sync(self, seq: Sequence) -> bool:
        """Bring the matcher to the sequence's output; False if a token breaks the grammar."""
        tracker = self._trackers.get(seq.request_id)
        if tracker is None:
            return True
        output = seq.output_token_ids
        matcher = tracker.matcher
        if tracker.num_accepted > len(output):
            matcher.rollback(tracker.num_accepted - len(output))
            tracker.num_accepted = len(output)
        for token in output[tracker.num_accepted :]:
            if not matcher.accept_token(token):
                return False
            tracker.num_accepted += 1
        return True

    def is_terminated(self, request_id: str) -> bool:
        """Whether the request's grammar has accepted its end (nothing more may follow)."""
        tracker = self._trackers.get(request_id)
        return tracker is not None and tracker.matcher.is_terminated()

    def fill(self, seqs: list[Sequence]) -> MaskBatch | None:
        """The masks of a step's rows (row ``i`` is ``seqs[i]``); None when none is constrained.

        A row whose matcher is in error raises (the runner then masks row by row, so only
        that request fails).
        """
        rows = [i for i, seq in enumerate(seqs) if seq.request_id in self._trackers]
        if not rows:
            self.last_mask_s = 0.0
            return None
        started = time.perf_counter()
        compiler = self._get_compiler()
        bitmask = self._bitmask
        if bitmask is None or bitmask.shape[0] < len(seqs):
            bitmask = bits.allocate(max(len(seqs), 8), compiler.vocab_size)
            self._bitmask = bitmask
        batch = MaskBatch(bitmask[: len(seqs)])
        matchers: list[tuple[Any, int]] = []
        for i in rows:
            seq = seqs[i]
            self.sync(seq)  # the engine syncs after each step; this covers any other caller
            matcher = self._trackers[seq.request_id].matcher
            if matcher.is_error():
                raise RuntimeError(
                    f"the grammar of {seq.request_id} failed: {matcher.inner.get_error()}"
                )
            token = self._closing_token(seq)
            if token is not None:
                batch.forced[i] = token
            else:
                batch.rows.append(i)
                matchers.append((matcher.inner, i))
        if matchers:
            if self._executor is None:
                self._executor = compiler.executor(_MASK_THREADS)
            words = batch.bitmask.shape[1]
            self._executor.unsafe_compute_mask_ptr(
                matchers, batch.bitmask.ctypes.data, words * 4, batch.bitmask.shape[0]
            )
        self.last_mask_s = time.perf_counter() - started
        return batch

    def apply(self, logits: npt.NDArray[np.floating], seqs: list[Sequence]) -> None:
        """Mask, in place, every constrained row of ``logits`` to the tokens its grammar allows.

        Row ``i`` belongs to ``seqs[i]``; free rows are left untouched.
        """
        batch = self.fill(seqs)
        if batch is None:
            return
        started = time.perf_counter()
        bits.apply(logits, batch.bitmask, batch.rows)
        for row, token in batch.forced.items():
            bits.force(logits, row, token)
        self.last_mask_s += time.perf_counter() - started

    def _string_to_close(self, seq: Sequence) -> bool:
        """Whether the answer's open string must end now and its grammar may close it.

        It must once it holds the cap's characters, or once its last tokens loop.
        """
        cap = self.bounds.string_chars
        looping = _looping(seq.token_ids, seq.num_output_tokens)
        if not looping and seq.num_output_tokens * _TOKEN_CHARS < cap:
            return False
        text = self._tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
        length = open_string_length(text)
        if length < cap and not (looping and length > 0):
            return False
        if self._closer is None:
            self._closer = Closer(self._tokenizer, self.mask_vocab_size)
        fork = self._trackers[seq.request_id].matcher.fork()
        return self._closer.quote >= 0 and bool(fork.accept_token(self._closer.quote))

    def _closing_token(self, seq: Sequence) -> int | None:
        """The token a request must take now to reach its grammar's end by max_tokens.

        None while the way to the end (and the end token) fits in what is left with
        _CLOSING_SPARE tokens to spare, where the answer may already end (a regex such as
        ``[a-z ]+`` is whole wherever it is cut), or when no way is found.
        """
        tracker = self._trackers[seq.request_id]
        produced = seq.num_output_tokens
        if tracker.closing is None and tracker.json and self._string_to_close(seq):
            return self._closer.quote if self._closer is not None else None
        if tracker.closing is None:
            left = seq.params.max_tokens - produced
            if left > tracker.closing_window and produced % _CLOSING_EVERY:
                return None
            if self._closer is None:
                self._closer = Closer(self._tokenizer, self.mask_vocab_size)
            path = self._closer.path(tracker.matcher)
            if not path:  # no way found, or it may end here: a cut leaves a whole answer
                return None
            tracker.closing_window = 2 * len(path) + 2 * _CLOSING_SPARE
            if len(path) + 1 + _CLOSING_SPARE < left:
                return None
            # Held to this path from now on: measured again from each later state, a path
            # may come out a token longer (another split of the same text).
            tracker.closing, tracker.closing_from = path, produced
        # By position, not popped: a step that masks a row twice (one row failing in a batch)
        # must force the same token both times.
        step = produced - tracker.closing_from
        if step < len(tracker.closing):
            return tracker.closing[step]
        return self._stop_token_ids[0] if self._stop_token_ids else None


def _looping(tokens: list[int], outputs: int) -> bool:
    """Whether the last of ``tokens``, ``outputs`` of them generated, repeat one unit."""
    for unit in range(1, _LOOP_UNIT + 1):
        span = max(_LOOP_MIN, unit * _LOOP_TIMES)
        if outputs < span:
            break
        tail = tokens[-span:]
        if all(tail[i] == tail[i + unit] for i in range(span - unit)):
            return True
    return False


def mask_isolated(
    mask: Callable[[Any, list[Sequence]], None], logits: Any, seqs: list[Sequence]
) -> dict[int, Exception]:
    """``mask(logits, seqs)``; where one request's grammar breaks it, row by row instead.

    Returns the rows whose grammar failed, with the error, so only those requests fail and
    the others keep their masks. ``logits`` is any array whose rows slice (numpy or torch).
    """
    try:
        mask(logits, seqs)
        return {}
    except Exception:
        failed: dict[int, Exception] = {}
        for row, seq in enumerate(seqs):
            try:
                mask(logits[row : row + 1], [seq])
            except Exception as err:
                failed[row] = err
        return failed
