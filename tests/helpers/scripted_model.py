"""A tiny Llama whose weights make it answer one fixed text, token by token, under greedy.

Every layer's output projection is zero, so the last hidden state is the current token's
embedding; each token of the script gets its own embedding axis and the LM head maps that
axis to the next token of the script. A real transformers model through the real engine,
with an answer a test can predict (a tool call, a JSON object).
"""

from __future__ import annotations

import itertools
from pathlib import Path

from tests.helpers.support import save_model_folder, tiny_config, tokenizer_dir

GENERATION_PROMPT_END = 198  # "\n" after "<|im_start|>assistant" in the SmolLM2 template
EOS = 2  # <|im_end|>


def build_scripted_model(folder: Path, script: str) -> Path:
    """Save a model that answers ``script`` to any chat prompt, then ends."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    ids = tok(script, add_special_tokens=False)["input_ids"]
    chain = [GENERATION_PROMPT_END, *ids, EOS]
    if len(set(chain[:-1])) != len(chain) - 1:
        raise ValueError(f"the script's tokens must not repeat: {script!r}")
    config = tiny_config("llama", len(tok))
    config.tie_word_embeddings = False
    if len(chain) > config.hidden_size:
        raise ValueError("the script is longer than the hidden size allows")
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        for axis, (token, following) in enumerate(itertools.pairwise(chain)):
            model.model.embed_tokens.weight[token, axis] = 1.0
            model.lm_head.weight[following, axis] = 10.0
    return save_model_folder(folder, model, tok)
