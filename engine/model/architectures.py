"""The allow-list of model architectures and attention features the engine runs exactly.

A model the engine has not been tested against is refused when it loads, with an error
naming what it lacks: the engine would otherwise load it and answer wrongly.
"""

from __future__ import annotations

from typing import Any

from paged_llm.engine.errors import UnsupportedModelError

# model_type -> what it is. Each has a greedy-equality test against transformers generate.
SUPPORTED_MODEL_TYPES = {
    "llama": "Llama (SmolLM2 and others)",
    "mistral": "Mistral (sliding window)",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "phi3": "Phi-3 (sliding window)",
    "gemma2": "Gemma 2 (alternating sliding window, attention soft-capping)",
    "gemma3_text": "Gemma 3 text (alternating sliding window)",
}
# Per-layer attention kinds the kernels implement, as transformers names them.
SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")

# What some well-known architectures need that the engine does not implement, so the
# refusal can name the feature rather than only the model type.
_KNOWN_FEATURES = {
    "bloom": "ALiBi position biases",
    "mpt": "ALiBi position biases",
    "falcon": "ALiBi position biases or parallel attention variants",
    "baichuan": "ALiBi position biases",
    "t5": "an encoder-decoder architecture",
    "bart": "an encoder-decoder architecture",
    "whisper": "an encoder-decoder architecture",
    "bert": "non-causal (bidirectional) attention",
    "roberta": "non-causal (bidirectional) attention",
    "deepseek_v2": "multi-head latent attention (MLA)",
    "deepseek_v3": "multi-head latent attention (MLA)",
    "mamba": "state-space layers",
    "mamba2": "state-space layers",
    "jamba": "state-space layers",
    "falcon_h1": "state-space layers",
    "recurrent_gemma": "recurrent layers",
    "rwkv": "recurrent layers",
    "llama4": "chunked attention",
    "gemma3": "image inputs (multimodal Gemma 3; use a text-only Gemma 3 model)",
    "mllama": "cross attention",
}


def unsupported_feature(config: Any) -> str | None:
    """Name what the model needs that the engine does not run exactly; None when all is known."""
    model_type = str(getattr(config, "model_type", "") or "unknown")
    if getattr(config, "is_encoder_decoder", False):
        return "an encoder-decoder architecture"
    if getattr(config, "add_cross_attention", False):
        return "cross attention"
    if model_type not in SUPPORTED_MODEL_TYPES:
        if model_type in _KNOWN_FEATURES:
            return f"{_KNOWN_FEATURES[model_type]} (model type {model_type!r})"
        return f"the {model_type!r} architecture: no test shows it runs exactly"
    layer_types = getattr(config, "layer_types", None) or ()
    for kind in layer_types:
        if kind not in SUPPORTED_LAYER_TYPES:
            return f"{kind} layers"
    if getattr(config, "use_bidirectional_attention", False):
        return "non-causal (bidirectional) attention"
    if getattr(config, "alibi", False):
        return "ALiBi position biases"
    return None


def exact_context(config: Any) -> tuple[int, str]:
    """The longest sequence the engine runs exactly, and a phrase naming what sets it.

    Usually the model's context. LongRoPE (Phi-3.5, Phi-4-mini) is the exception: past its
    original context transformers switches every position's rotary frequencies by the
    longest sequence in a forward pass, so the answer would depend on what shares the step
    and on how the prompt was chunked; the engine stops short of that point instead.
    ("dynamic" RoPE changes only past the model's context, which bounds every model.)
    """
    context = int(getattr(config, "max_position_embeddings", None) or 2048)
    for params in _rope_parameter_sets(config):
        if params.get("rope_type", params.get("type")) != "longrope":
            continue
        original = params.get("original_max_position_embeddings") or getattr(
            config, "original_max_position_embeddings", None
        )
        if original and int(original) < context:
            return int(original), (
                f"{int(original)} tokens, past which the model's longrope RoPE scaling changes "
                "its rotary frequencies with the sequence length (not run exactly)"
            )
    return context, f"the model's context of {context} tokens"


def _rope_parameter_sets(config: Any) -> list[dict[str, Any]]:
    """The RoPE settings of a config: one dict, or one per layer type (Gemma 3)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(params, dict):
        return []
    nested = [value for value in params.values() if isinstance(value, dict)]
    return nested or [params]


# Generation settings that change transformers' greedy tokens, with the value that turns
# each off. A model's generation_config may set them; generate() then applies them even
# with do_sample=False. The engine implements repetition_penalty (the model's value is its
# default, see loader.default_repetition_penalty) and refuses a model that sets another.
_GREEDY_SETTINGS: dict[str, object] = {
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "encoder_repetition_penalty": 1.0,
    "bad_words_ids": None,
    "sequence_bias": None,
    "min_length": 0,
    "min_new_tokens": 0,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "exponential_decay_length_penalty": None,
    "guidance_scale": 1.0,
    "watermarking_config": None,
    "num_beams": 1,
    "penalty_alpha": None,
    "dola_layers": None,
}


def unsupported_generation_setting(generation_config: Any) -> str | None:
    """Name a generation_config setting that changes greedy tokens and the engine lacks."""
    for name, off in _GREEDY_SETTINGS.items():
        value = getattr(generation_config, name, None)
        if value is None or value == off or value in ([], {}, ()):
            continue
        return f"the generation setting {name}={value!r} (from the model's generation_config)"
    return None


def check_supported(config: Any, generation_config: Any = None) -> None:
    """Raise UnsupportedModelError naming the feature when the engine cannot run the model."""
    feature = unsupported_feature(config) or unsupported_generation_setting(generation_config)
    if feature is not None:
        supported = ", ".join(sorted(SUPPORTED_MODEL_TYPES))
        raise UnsupportedModelError(
            f"the engine does not implement {feature}; supported model types: {supported}",
            feature,
        )
