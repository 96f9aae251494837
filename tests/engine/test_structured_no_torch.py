"""Structured output works where torch, transformers, triton and xgrammar cannot be imported."""

from __future__ import annotations

import textwrap
from pathlib import Path

from paged_llm.defaults import bundled_gguf
from tests.helpers.without_torch import run_without_torch

ROOT = Path(__file__).resolve().parents[2]

# Every structured module is imported, a grammar of each kind compiled over the GGUF
# file's own tokenizer, numpy logits masked and a JSON answer closed by the closer, where
# torch, transformers, triton and xgrammar cannot be imported.
NO_TORCH = textwrap.dedent(
    """
    import json

    import numpy as np
    from paged_llm.engine.core.sequence import SamplingParams
    from paged_llm.engine.structured import bitmask, closer, json_bounds, matcher
    from paged_llm.engine.structured import output, structural_tag, tool_grammar
    from paged_llm.engine.tokenizer.gguf_tokenizer import GGUFTokenizer

    tokenizer = GGUFTokenizer.from_gguf({path!r})
    eos = (tokenizer.eos_token_id,)
    structured = output.StructuredOutput(tokenizer, len(tokenizer), eos)
    schema = {{"type": "object", "properties": {{"on": {{"type": "boolean"}}}}, "required": ["on"]}}
    tool = {{"type": "function", "function": {{"name": "HassTurnOn"}}}}
    tag = tool_grammar.tool_call_structural_tag([tool], tool_choice="required")
    kinds = [
        SamplingParams(json_schema=schema),
        SamplingParams(json_object=True),
        SamplingParams(regex="(yes|no)"),
        SamplingParams(grammar='root ::= "light." ("on" | "off")'),
        SamplingParams(structural_tag=tag),
    ]
    grammars = [structured.compile(params) for params in kinds]
    logits = np.zeros((len(grammars), len(tokenizer)), dtype=np.float32)
    mask = bitmask.allocate(len(grammars), structured.mask_vocab_size)
    for row, grammar in enumerate(grammars):
        grammar.matcher().fill_mask(mask, row)
    bitmask.apply(logits, mask, range(len(grammars)))
    allowed = np.isfinite(logits).sum(axis=1)
    assert (allowed > 0).all() and (allowed < len(tokenizer)).all(), allowed
    way = closer.Closer(tokenizer, structured.mask_vocab_size).path(grammars[0].matcher())
    assert json.loads(tokenizer.decode(way)) in ({{"on": True}}, {{"on": False}}), way
    print(len(grammars))
    """
)


def test_structured_output_imports_no_torch() -> None:
    """Every grammar kind compiles, masks and closes with torch and xgrammar unimportable."""
    result = run_without_torch(NO_TORCH.format(path=str(bundled_gguf("SmolLM2-135M-Instruct"))))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "5"
