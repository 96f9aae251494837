"""Model loading: bundled GGUF, local folder or GGUF file, or a Hugging Face id, offline-safe."""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import torch
except ImportError:  # the torch path's entry: say what to install
    from paged_llm.extras import require_engine_extra

    require_engine_extra(__name__)
    raise

from paged_llm.defaults import BUNDLED_PREFIX
from paged_llm.engine.config import DEFAULT_MODEL, EngineConfig
from paged_llm.engine.errors import ModelLoadError
from paged_llm.engine.model.architectures import check_supported, exact_context
from paged_llm.engine.model.bundled import bundled_file
from paged_llm.engine.model.loaded import LoadedModel as LoadedModel  # re-exported
from paged_llm.engine.model.memory import fit_dtype
from paged_llm.engine.model.progress import Progress, part
from paged_llm.engine.model.quant import Q4Float32Linear, WeightFormat, quantize_model
from paged_llm.kernels.cpu import attention as cpu_attention
from paged_llm.kernels.cpu import quant as cpu_quant

_LOGGER = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    """Map ``auto|cpu|cuda[:n]`` to a device, failing clearly when CUDA is asked for but absent."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was requested but no CUDA GPU is available")
    return device


def cpu_supports_bf16() -> bool:
    """Whether this CPU has native bf16 matrix instructions (AVX512-BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def resolve_dtype(name: str, device: torch.device, weights: str = "auto") -> torch.dtype:
    """Pick the dtype; on ``auto`` the one that keeps the model's own answers where it can.

    On a CPU that is float32: only there do a request's greedy tokens equal transformers'
    whatever else shares its steps (bf16 rounding differs with the batch's shape, and
    changed single requests' answers on tiny models). bf16 stays a choice: half the
    memory, and faster one-at-a-time decoding on some CPUs (docs/performance.md). With
    4-bit or 8-bit weights, whose answers differ anyway, ``auto`` takes bf16 where the CPU
    has it, as torch's quantized kernels are fast only there. On GPUs bf16 (fp16 on older
    cards), as float32 would double the memory of models that need a GPU.
    """
    if name != "auto":
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
            name
        ]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    quantized = weights in (WeightFormat.Q4, WeightFormat.Q8)
    return torch.bfloat16 if quantized and cpu_supports_bf16() else torch.float32


def bundled_gguf_path(name: str, cache_dir: Path | None = None) -> Path:
    """A bundled GGUF file: its installed package's, else fetched into the cache's models folder."""
    return bundled_file(name, cache_dir)


# The part of a GGUF load's progress reported once the kernels are there (built on a first
# start, for seconds); the metadata and the tensors take the rest.
KERNELS_SHARE = 0.1


# Picks the dtype to load a model in from its config (memory.fit_dtype, bound to settings).
DtypeFit = Callable[[Any], torch.dtype]


def _load_gguf(
    gguf: Path,
    fmt: WeightFormat,
    fit: DtypeFit,
    device: torch.device,
    config: EngineConfig,
    progress: Progress | None,
    native_model: bool = True,
) -> tuple[Any, Any, torch.dtype, str | None]:
    """Load a GGUF file: in place on the CPU kernels where ``auto`` allows, else dense.

    Returns the model, the tokenizer, the dtype and the weights description when kept in
    place (None when dense: :func:`apply_weights` then handles ``fmt``). In place, the
    activations are float32: the kernels take them so.
    """
    # Here, not at the top: only a GGUF load needs the gguf package and these kernels.
    from paged_llm.engine.model.gguf_model import load_gguf_model
    from paged_llm.kernels.cpu import forward as cpu_forward
    from paged_llm.kernels.cpu import gguf_matmul as gguf_kernels

    cache_dir = config.cache_dir
    in_place = fmt is WeightFormat.AUTO and device.type == "cpu"
    if progress is not None:
        # Begun: a dialog shows a spinner until a fraction above 0 comes, and a first
        # start builds the kernels for seconds before the tensors' fractions.
        progress(0.01)
    if in_place:
        reason = gguf_kernels.unavailable(_kernels(cache_dir))
        if reason is not None:
            _LOGGER.warning(
                "%s loads dense: the GGUF CPU kernels are unavailable (%s)", gguf, reason
            )
            in_place = False
    # The C forward runs a supported architecture without transformers' model class.
    native = native_model and in_place and cpu_forward.unavailable(_kernels(cache_dir)) is None
    if progress is not None:
        progress(KERNELS_SHARE)
    tensors = part(progress, KERNELS_SHARE)
    loaded = load_gguf_model(gguf, fit, in_place, cache_dir, tensors, native=native)
    if not in_place:
        return loaded.model, loaded.tokenizer, loaded.dtype, None
    kept = ", ".join(f"{n} {kind}" for kind, n in sorted(loaded.kept.items()))
    dense = ", ".join(f"{n} {kind}" for kind, n in sorted(loaded.dense.items()))
    text = f"gguf in place ({kept} tensors on {gguf_kernels.vector_path()} kernels"
    text += f"; {dense} in memory)" if dense else ")"
    return loaded.model, loaded.tokenizer, loaded.dtype, text


def _kernels(cache_dir: Path | None) -> Path | None:
    """Where the C kernels are built: the cache folder's kernels/, else their default."""
    return None if cache_dir is None else cache_dir / "kernels"


def _load_folder(source: str, fit: DtypeFit, local_only: bool) -> tuple[Any, Any, torch.dtype]:
    """Load a model and tokenizer from a folder or a Hugging Face id, in the dtype ``fit`` picks."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    # Refuse an unsupported model, or one memory cannot hold, before its weights are read.
    model_config = AutoConfig.from_pretrained(source, local_files_only=local_only)
    check_supported(model_config)
    dtype = fit(model_config)
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=local_only)
    return model, tokenizer, dtype


def _quiet_progress_bars() -> None:
    """Keep loading from drawing progress bars or leaving tqdm's monitor thread behind.

    Home Assistant has no terminal to draw on, and its test harness rightly fails on
    threads left running after a test.
    """
    import tqdm
    from huggingface_hub.utils.tqdm import disable_progress_bars
    from transformers.utils import logging as hf_logging

    tqdm.tqdm.monitor_interval = 0
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    disable_progress_bars()


def load_model(
    config: EngineConfig, progress: Progress | None = None, *, native_model: bool = True
) -> LoadedModel:
    """Load the configured model onto its device; every failure is a ModelLoadError naming it.

    ``native_model=False`` keeps transformers' model class for a GGUF file the C forward
    runs (the engine runs it the same way; its ``generate`` is the benchmarks' baseline).

    The work runs on a thread of its own that ends before this returns, whatever thread
    calls it: torch's OpenMP runtime (libgomp) keeps a worker pool for every live thread
    that ran parallel ops, and with more pool threads than cores its workers stop
    spinning between parallel regions, so a model loaded on a thread that lives on (a
    script's main thread, an executor) then decoded at half speed on the engine's step
    thread. ``progress`` is called from that loading thread with the done fraction.
    """
    outcome: list[LoadedModel | BaseException] = []

    def work() -> None:
        try:
            outcome.append(_load_model(config, progress, native_model))
        except BaseException as err:  # handed to the caller below
            outcome.append(err)

    thread = threading.Thread(target=work, name="paged-llm-load-model", daemon=True)
    thread.start()
    thread.join()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _load_model(
    config: EngineConfig, progress: Progress | None, native_model: bool = True
) -> LoadedModel:
    """load_model's work, on its own thread."""
    _quiet_progress_bars()
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device, config.weights)
    # auto may halve float32 weights that memory cannot hold (answers may then differ).
    fallback = torch.bfloat16 if config.dtype == "auto" and dtype == torch.float32 else None
    fit = functools.partial(fit_dtype, dtype=dtype, device=device, fallback=fallback)
    source = config.model.strip() or DEFAULT_MODEL
    fmt = WeightFormat(config.weights)
    gguf_source = source.startswith(BUNDLED_PREFIX) or source.endswith(".gguf")
    weights: str | None = None
    try:
        if gguf_source:
            if source.startswith(BUNDLED_PREFIX):
                gguf = bundled_gguf_path(source.removeprefix(BUNDLED_PREFIX), config.cache_dir)
            else:
                gguf = Path(source).expanduser()
                if not gguf.is_file():
                    raise ModelLoadError(f"GGUF file {source} does not exist")
            model, tokenizer, dtype, weights = _load_gguf(
                gguf, fmt, fit, device, config, progress, native_model
            )
        elif source.startswith(("/", "~", ".")) or Path(source).expanduser().exists():
            path = Path(source).expanduser()
            if not path.is_dir():
                raise ModelLoadError(f"model folder {source} does not exist")
            if not (path / "config.json").is_file():
                raise ModelLoadError(f"folder {source} holds no model (config.json is missing)")
            model, tokenizer, dtype = _load_folder(str(path), fit, local_only=True)
        else:
            # A Hugging Face id: from the local cache when offline, else downloaded once.
            model, tokenizer, dtype = _load_folder(source, fit, local_only=False)
        check_supported(model.config, getattr(model, "generation_config", None))
        if weights is None:
            weights = apply_weights(model, fmt, dtype, device, config.cache_dir)
    except ModelLoadError:
        raise
    except Exception as err:
        raise ModelLoadError(f"could not load model {source!r}: {err}") from err
    model.to(device)
    model.eval()
    attention = _attention_path(device, dtype, config)
    max_model_len, context_limit = exact_context(model.config)
    stops = eos_token_ids(model, tokenizer)
    if gguf_source:
        stops = tuple(sorted({*stops, *end_of_turn_ids(tokenizer)}))
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=source,
        device=device,
        dtype=dtype,
        max_model_len=max_model_len,
        context_limit=context_limit,
        eos_token_ids=stops,
        weights=weights,
        attention=attention,
        repetition_penalty=default_repetition_penalty(model),
    )


def _attention_path(device: torch.device, dtype: torch.dtype, config: EngineConfig) -> str:
    """Say how decode attention will run; on a float32 CPU engine, build its C kernel now.

    Built at load (once per machine), not in the first decode step.
    """
    if device.type != "cpu" or config.attention_backend == "triton":
        return f"{config.attention_backend} backend on {device.type}"
    if dtype != torch.float32:
        return f"torch ({str(dtype).removeprefix('torch.')})"
    cache_dir = config.cache_dir
    reason = cpu_attention.unavailable(_kernels(cache_dir))
    if reason is not None:
        _LOGGER.info("decode attention takes the torch path: %s", reason)
        return f"torch ({reason})"
    return "C kernel in place (float32 decodes), torch SDPA for prefill"


def apply_weights(
    model: Any,
    fmt: WeightFormat,
    dtype: torch.dtype,
    device: torch.device,
    cache_dir: Path | None = None,
) -> str:
    """Hold a dense model's linear weights as ``fmt`` asks; return what was done.

    ``auto`` and ``float`` keep them dense (a GGUF file's blocks are kept in place by
    :func:`_load_gguf` instead); ``q4`` and ``q8`` quantize them at load, on the CPU only.
    """
    if fmt in (WeightFormat.FLOAT, WeightFormat.AUTO):
        return "float"
    if device.type != "cpu":
        raise ModelLoadError(
            f"weights {fmt.value!r} uses torch's CPU kernels; use weights 'float' on {device}"
        )
    # Built (once) into the engine's cache folder.
    cpu_quant.unavailable(_kernels(cache_dir))
    swapped = Counter(quantize_model(model, fmt, dtype))
    if not swapped:
        return "float"
    names = {"q4": "4-bit", "q8-row": "8-bit per-row"}
    text = " and ".join(f"{n} {names[kind]}" for kind, n in swapped.items()) + " linear layers"
    if any(isinstance(m, Q4Float32Linear) for m in model.modules()):
        text += f", float32 kernels, {cpu_quant.vector_path()}"
    return f"{fmt.value} ({text})"


def default_repetition_penalty(model: Any) -> float:
    """The model's own repetition penalty (Qwen2.5 sets 1.05-1.1), else 1 (off).

    transformers' generate applies it even to greedy decoding, and vLLM makes it the
    default of a request that sets none; so does this engine.
    """
    value = getattr(getattr(model, "generation_config", None), "repetition_penalty", None)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return 1.0
    return float(value)


# Tokens llama.cpp ends a generation at by their text (src/llama-vocab.cpp's end-of-
# generation list, those of the architectures this engine runs). A GGUF file names one eos:
# Gemma 3's is <eos> while its turns end at <end_of_turn>, which the original model's
# generation_config lists ([1, 106]) and llama-server and Ollama stop at on the same file.
END_OF_TURN = (
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>",
)  # fmt: skip


def end_of_turn_ids(tokenizer: Any) -> set[int]:
    """The ids of END_OF_TURN's tokens that the tokenizer has as tokens of their own."""
    ids = set()
    for text in END_OF_TURN:
        token_id = tokenizer.convert_tokens_to_ids(text)
        # an unknown token comes back as the unknown token's id, or None
        if isinstance(token_id, int) and tokenizer.convert_ids_to_tokens(token_id) == text:
            ids.add(token_id)
    return ids


def eos_token_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    """All end-of-sequence ids: the generation config's (one or a list) and the tokenizer's."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    value = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(value, int):
        ids.add(value)
    elif isinstance(value, list | tuple):
        ids.update(int(v) for v in value)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return tuple(sorted(ids))
