"""Mask time per token, llguidance (the engine's) against xgrammar (before it), at 49,152 tokens.

Three answers over the bundled model's vocabulary: a JSON-schema answer, a tool call under
the home grammar (HassTurnOn's ``name`` held to 3,000 entity names) and a plain tool call.
Each answer's tokens are fed one by one; before each, the next-token mask is filled and
applied to a float32 row of logits (numpy for llguidance, torch for xgrammar, as each
engine did). Prints compile time and per-token mask time (mean, p50, max) per library.
xgrammar is measured only where it is installed (it needs torch).

    .venv/bin/python benchmarks/grammar_masks.py
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from paged_llm.defaults import bundled_gguf
from paged_llm.engine.structured import bitmask as bits
from paged_llm.engine.structured.json_bounds import JsonBounds
from paged_llm.engine.structured.matcher import GrammarCompiler
from paged_llm.engine.structured.tool_grammar import tool_call_structural_tag
from paged_llm.engine.tokenizer.gguf_tokenizer import GGUFTokenizer

VOCAB = 49152
SCHEMA = {
    "type": "object",
    "properties": {
        "celsius": {"type": "number"},
        "rooms": {"type": "array", "items": {"type": "string"}},
        "on": {"type": "boolean"},
        "mode": {"enum": ["heat", "cool"]},
        "where": {
            "type": "object",
            "properties": {"floor": {"type": "integer"}, "name": {"type": "string"}},
            "required": ["floor", "name"],
        },
    },
    "required": ["celsius", "rooms", "on", "mode", "where"],
}
ANSWER = (
    '{"celsius": 21.5, "rooms": ["hall", "kitchen", "bedroom"], "on": true, "mode": "heat", '
    '"where": {"floor": 1, "name": "upstairs landing by the stairs"}}'
)


def _tool(name: str, properties: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI function tool whose arguments are all required."""
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


NAMES = sorted({f'Lamp {i} "{"ÄЖ寝🦖"[i % 4]}"' for i in range(3000)})
HOME = [
    _tool("HassTurnOn", {"name": {"type": "string", "enum": NAMES}, "area": {"enum": ["Kitchen"]}})
]
HOME_ANSWER = (
    '<tool_call>\n{"name": "HassTurnOn", "arguments": '
    + json.dumps({"name": NAMES[1234], "area": "Kitchen"}, ensure_ascii=False)
    + "}\n</tool_call>"
)
TOOLS = [
    _tool("set_light", {"room": {"type": "string"}, "level": {"type": "integer"}}),
    _tool("start_timer", {"minutes": {"type": "number"}}),
    _tool("add_note", {"text": {"type": "string"}}),
    _tool("set_scene", {"scene": {"enum": ["movie", "dinner", "night"]}}),
]
TOOL_ANSWER = (
    'Sure. <tool_call>\n{"name": "set_light", "arguments": {"room": "bedroom", "level": 3}}'
    "\n</tool_call>"
)
CASES = [
    ("JSON schema answer", "json_schema", json.dumps(SCHEMA), ANSWER),
    (
        "home grammar call (3,000 names)",
        "structural_tag",
        json.dumps(tool_call_structural_tag(HOME, tool_choice="required")),
        HOME_ANSWER,
    ),
    (
        "tool call (4 tools)",
        "structural_tag",
        json.dumps(tool_call_structural_tag(TOOLS)),
        TOOL_ANSWER,
    ),
]


def _stats(samples: list[float]) -> str:
    """Mean, median and max in microseconds."""
    us = [s * 1e6 for s in samples]
    return f"{statistics.mean(us):8.0f} {statistics.median(us):8.0f} {max(us):8.0f}"


def _llguidance(
    tokenizer: GGUFTokenizer, field: str, text: str, tokens: list[int]
) -> tuple[float, list[float]]:
    """Compile seconds and per-token mask seconds with the engine's llguidance path."""
    compiler = GrammarCompiler(tokenizer, VOCAB, (tokenizer.eos_token_id,))
    started = time.perf_counter()
    grammar = compiler.compile(field, text, JsonBounds())
    compile_s = time.perf_counter() - started
    matcher = grammar.matcher()
    mask = bits.allocate(1, compiler.vocab_size)
    logits = np.zeros((1, VOCAB), dtype=np.float32)
    times = []
    for token in tokens:
        started = time.perf_counter()
        matcher.fill_mask(mask, 0)
        bits.apply(logits, mask, [0])
        times.append(time.perf_counter() - started)
        assert matcher.accept_token(token), token
    return compile_s, times


def _xgrammar(
    tokenizer: GGUFTokenizer, field: str, text: str, tokens: list[int]
) -> tuple[float, list[float]]:
    """Compile seconds and per-token mask seconds with xgrammar, as the engine used it."""
    import torch
    import transformers
    import xgrammar as xg

    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)
    info = xg.TokenizerInfo.from_huggingface(
        hf, vocab_size=VOCAB, stop_token_ids=[tokenizer.eos_token_id]
    )
    compiler = xg.GrammarCompiler(info, max_threads=2)
    started = time.perf_counter()
    if field == "json_schema":
        compiled = compiler.compile_grammar(
            xg.Grammar.from_json_schema(text, any_whitespace=False, strict_mode=True)
        )
    else:
        compiled = compiler.compile_grammar(xg.Grammar.from_structural_tag(text))
    compile_s = time.perf_counter() - started
    matcher = xg.GrammarMatcher(compiled)
    mask = xg.allocate_token_bitmask(1, VOCAB)
    logits = torch.zeros(1, VOCAB)
    times = []
    for token in tokens:
        started = time.perf_counter()
        matcher.fill_next_token_bitmask(mask, 0)
        xg.apply_token_bitmask_inplace(logits, mask, vocab_size=VOCAB)
        times.append(time.perf_counter() - started)
        assert matcher.accept_token(token), token
    return compile_s, times


def main() -> None:
    """Print the table."""
    tokenizer = GGUFTokenizer.from_gguf(bundled_gguf("SmolLM2-135M-Instruct"))
    runs: list[tuple[str, Callable[..., tuple[float, list[float]]]]] = [("llguidance", _llguidance)]
    try:
        import xgrammar  # noqa: F401

        runs.append(("xgrammar", _xgrammar))
    except ImportError:
        print("(xgrammar is not installed: llguidance only)")
    header = ("case", "library", "tokens", "compile ms", "mean us", "p50 us", "max us")
    print("{:34} {:10} {:>6} {:>10} {:>8} {:>8} {:>8}".format(*header))
    for name, field, text, answer in CASES:
        tokens = [*tokenizer.encode(answer, add_special_tokens=False), tokenizer.eos_token_id]
        for library, run in runs:
            run(tokenizer, field, text, tokens)  # warm caches and thread pools
            compile_s, times = run(tokenizer, field, text, tokens)
            print(
                f"{name:34} {library:10} {len(tokens):6d} {compile_s * 1e3:10.1f} {_stats(times)}"
            )


if __name__ == "__main__":
    main()
