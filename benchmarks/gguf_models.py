"""Random-weight GGUF models of the shapes people run, made with llama.cpp's own tools.

Speed and memory depend on a model's shapes and its weight format, not on its weights, so
the GGUF benchmark needs no download: for each shape a transformers model is built from a
config with seeded random normal weights (std 0.02), saved as bf16 safetensors with
SmolLM2's tokenizer (taken from the bundled model: there is no Hub here), converted with
llama.cpp's ``convert_hf_to_gguf.py --outtype bf16`` and quantized with ``llama-quantize``.
Everything is cached under ``.cache/models/``; a file that exists is not made again.

``scripts/bench gguf_models [--shapes 360m,1.7b,qwen1.5b,gemma3-1b] [--formats Q4_0,Q4_K_M,Q8_0]``
prints the paths of the quantized files. The recommended files' other shapes (qwen2.5-3b,
qwen3-1.7b, qwen3-4b, llama3.2-3b, gemma3-4b) are made when named: ``--shapes qwen3-4b
--formats Q4_K_M --clean``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import ROOT, argument_parser

MODELS = ROOT / ".cache" / "models"
FORMATS = ("Q4_0", "Q4_K_M", "Q8_0")
# What ``scripts/bench gguf`` and this command make and compare when no shape is named; the
# 3-4B shapes of the recommended files (benchmarks.models) are made when named.
DEFAULT_SHAPES = ("360m", "1.7b", "qwen1.5b", "gemma3-1b")
# The tokenizer of SmolLM2 135M, 360M and 1.7B is one and the same.
TOKENIZER_SOURCE = "SmolLM2-135M-Instruct"


@dataclass(frozen=True, slots=True)
class Shape:
    """One model's shape: what speed and memory depend on (the weights are random)."""

    key: str
    name: str
    model_type: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    rope_theta: float
    max_positions: int
    rms_norm_eps: float
    tied: bool = True
    head_size: int = 0  # where it is not hidden // heads (Gemma 3's 256, Qwen3 4B's 128)
    window: int = 0  # Gemma 3's sliding window (512 tokens in the 1B, 1024 in the 4B)
    # The config's rope_scaling as (key, value) pairs (a tuple keeps the shape hashable):
    # Llama 3.2's llama3 frequencies, Gemma 3 4B's linear factor on its full layers.
    rope_scaling: tuple[tuple[str, Any], ...] = ()

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.head_size or self.hidden // self.heads

    def kv_bytes_per_token(self, element_bytes: int) -> int:
        """Bytes one token's K and V take across all layers at ``element_bytes`` per value."""
        return 2 * self.layers * self.kv_heads * self.head_dim * element_bytes

    def config_kwargs(self, tiny: bool = False) -> dict[str, Any]:
        """The transformers config arguments; ``tiny`` keeps the kind but shrinks the sizes."""
        scale = 16 if tiny else 1
        kwargs: dict[str, Any] = {
            "hidden_size": self.hidden // scale,
            "intermediate_size": self.intermediate // scale,
            "num_hidden_layers": 2 if tiny else self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "vocab_size": self.vocab // scale,
            "tie_word_embeddings": self.tied,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_positions,
            "rms_norm_eps": self.rms_norm_eps,
            "initializer_range": 0.02,
            "hidden_act": "silu",
            # SmolLM2's tokenizer: <|im_start|> and <|im_end|> (also its eos).
            "bos_token_id": 1,
            "eos_token_id": 2,
        }
        if self.rope_scaling:
            kwargs["rope_scaling"] = dict(self.rope_scaling)
        # tiny shrinks a head set apart from the hidden size (Gemma 3's, Qwen3's) by 4.
        shrink = 4 if tiny else 1
        if self.model_type == "llama":
            kwargs["attention_bias"] = False
            kwargs["mlp_bias"] = False
        if self.model_type == "qwen3":
            # Qwen3's kind: RMS norms on each head's queries and keys, no biases, heads of
            # 128 whatever the hidden size (Qwen3 4B: 2560 wide, 32 heads of 128).
            kwargs.update(head_dim=self.head_dim // shrink, attention_bias=False)
        if self.model_type == "gemma3_text":
            # As google/gemma-3-1b-it's and gemma-3-4b-it's config.json have it; Gemma 3's
            # defaults hold the rest of that layout (a full-attention layer after every five
            # sliding ones, rotary bases 1e6 and 1e4, GELU, 1 + w norms). The window is the
            # model's own (512 tokens in the 1B, 1024 in the 4B), not the class's 4096.
            del kwargs["hidden_act"]  # Gemma's is hidden_activation, GELU by default
            kwargs.update(
                head_dim=self.head_dim // shrink,
                query_pre_attn_scalar=self.head_dim,
                sliding_window=self.window // shrink,
                pad_token_id=0,
            )
        return kwargs

    def config(self, tiny: bool = False) -> Any:
        """A transformers config of this shape (``tiny``: the same kind, small enough to test)."""
        from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config

        kinds = {
            "llama": LlamaConfig,
            "qwen2": Qwen2Config,
            "qwen3": Qwen3Config,
            "gemma3_text": Gemma3TextConfig,
        }
        return kinds[self.model_type](**self.config_kwargs(tiny))


# From the real models' config.json files (HuggingFaceTB/SmolLM2-360M-Instruct,
# HuggingFaceTB/SmolLM2-1.7B-Instruct, Qwen/Qwen2.5-1.5B-Instruct, google/gemma-3-1b-it).
SHAPES: dict[str, Shape] = {
    "360m": Shape(
        key="360m",
        name="SmolLM2-360M",
        model_type="llama",
        hidden=960,
        intermediate=2560,
        layers=32,
        heads=15,
        kv_heads=5,
        vocab=49152,
        rope_theta=100000.0,
        max_positions=8192,
        rms_norm_eps=1e-5,
    ),
    "1.7b": Shape(
        key="1.7b",
        name="SmolLM2-1.7B",
        model_type="llama",
        hidden=2048,
        intermediate=8192,
        layers=24,
        heads=32,
        kv_heads=32,
        vocab=49152,
        rope_theta=130000.0,
        max_positions=8192,
        rms_norm_eps=1e-5,
    ),
    # Qwen2.5-1.5B's grouped-query shape (q/k/v biases come with the qwen2 kind) with
    # SmolLM2's tokenizer: the converter pads the vocabulary to 151936 with unused tokens.
    "qwen1.5b": Shape(
        key="qwen1.5b",
        name="Qwen2.5-1.5B-shape",
        model_type="qwen2",
        hidden=1536,
        intermediate=8960,
        layers=28,
        heads=12,
        kv_heads=2,
        vocab=151936,
        rope_theta=1000000.0,
        max_positions=32768,
        rms_norm_eps=1e-6,
    ),
    # Gemma 3 1B's shape (google/gemma-3-1b-it) with SmolLM2's tokenizer, its vocabulary
    # filled with unused tokens to Gemma's 262144 (the converter keeps as many embedding
    # rows as the tokenizer has tokens).
    "gemma3-1b": Shape(
        key="gemma3-1b",
        name="Gemma3-1B-shape",
        model_type="gemma3_text",
        hidden=1152,
        intermediate=6912,
        layers=26,
        heads=4,
        kv_heads=1,
        vocab=262144,
        rope_theta=1000000.0,
        max_positions=32768,
        rms_norm_eps=1e-6,
        head_size=256,
        window=512,
    ),
    # The other recommended files of package/catalogue.py, from Qwen/Qwen2.5-3B-Instruct's,
    # Qwen/Qwen3-1.7B's, Qwen/Qwen3-4B's, meta-llama/Llama-3.2-3B-Instruct's and
    # google/gemma-3-4b-it's (its text_config) config.json, each with SmolLM2's tokenizer
    # filled to the model's vocabulary, as above.
    "qwen2.5-3b": Shape(
        key="qwen2.5-3b",
        name="Qwen2.5-3B-shape",
        model_type="qwen2",
        hidden=2048,
        intermediate=11008,
        layers=36,
        heads=16,
        kv_heads=2,
        vocab=151936,
        rope_theta=1000000.0,
        max_positions=32768,
        rms_norm_eps=1e-6,
    ),
    "qwen3-1.7b": Shape(
        key="qwen3-1.7b",
        name="Qwen3-1.7B-shape",
        model_type="qwen3",
        hidden=2048,
        intermediate=6144,
        layers=28,
        heads=16,
        kv_heads=8,
        vocab=151936,
        rope_theta=1000000.0,
        max_positions=40960,
        rms_norm_eps=1e-6,
        head_size=128,
    ),
    "qwen3-4b": Shape(
        key="qwen3-4b",
        name="Qwen3-4B-shape",
        model_type="qwen3",
        hidden=2560,
        intermediate=9728,
        layers=36,
        heads=32,
        kv_heads=8,
        vocab=151936,
        rope_theta=1000000.0,
        max_positions=40960,
        rms_norm_eps=1e-6,
        head_size=128,  # not 2560 / 32
    ),
    # The converter writes the llama3 scaling as llama.cpp's rope_freqs tensor.
    "llama3.2-3b": Shape(
        key="llama3.2-3b",
        name="Llama3.2-3B-shape",
        model_type="llama",
        hidden=3072,
        intermediate=8192,
        layers=28,
        heads=24,
        kv_heads=8,
        vocab=128256,
        rope_theta=500000.0,
        max_positions=131072,
        rms_norm_eps=1e-5,
        rope_scaling=(
            ("rope_type", "llama3"),
            ("factor", 32.0),
            ("low_freq_factor", 1.0),
            ("high_freq_factor", 4.0),
            ("original_max_position_embeddings", 8192),
        ),
    ),
    # Gemma 3 4B's text part (Gemma3TextConfig; its vision tower is not run). Its config
    # says 262208 embedding rows, but llama.cpp's converter keeps only as many as the
    # tokenizer has tokens, 262144 in the real file as in the 1B's.
    "gemma3-4b": Shape(
        key="gemma3-4b",
        name="Gemma3-4B-shape",
        model_type="gemma3_text",
        hidden=2560,
        intermediate=10240,
        layers=34,
        heads=8,
        kv_heads=4,
        vocab=262144,
        rope_theta=1000000.0,
        max_positions=131072,
        rms_norm_eps=1e-6,
        head_size=256,
        window=1024,
        rope_scaling=(("rope_type", "linear"), ("factor", 8.0)),
    ),
}

# The bundled model (SmolLM2-135M-Instruct, its shipped Q4_1 file), which
# ``scripts/bench gguf --bundled`` runs as it is: nothing is built for it.
BUNDLED_SHAPE = Shape(
    key="135m",
    name="SmolLM2-135M",
    model_type="llama",
    hidden=576,
    intermediate=1536,
    layers=30,
    heads=9,
    kv_heads=3,
    vocab=49152,
    rope_theta=100000.0,
    max_positions=8192,
    rms_norm_eps=1e-5,
)


def parse_list(text: str, known: Iterable[str], what: str) -> list[str]:
    """A comma-separated list checked against the known names."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})")
    return names


def model_dir(shape: Shape) -> Path:
    """The folder of one shape's files."""
    return MODELS / f"{shape.name}-random"


def gguf_path(shape: Shape, fmt: str) -> Path:
    """Where the ``fmt`` file (Q4_0, Q4_K_M, Q8_0 or BF16) of ``shape`` lives."""
    return model_dir(shape) / f"{shape.name}-random-{fmt}.gguf"


def llama_cpp_source() -> Path:
    """The vendored llama.cpp source folder (unpacked by benchmarks.llama_cpp on first use)."""
    from .llama_cpp import source_dir

    return source_dir()


def save_tokenizer(folder: Path, vocab: int = 0) -> None:
    """SmolLM2's tokenizer from the bundled GGUF, saved in transformers' format.

    ``vocab`` above its own size adds unused tokens (no merge reaches them) up to it.
    """
    from transformers import AutoTokenizer

    from paged_llm.engine.model.loader import bundled_gguf_path

    source = bundled_gguf_path(TOKENIZER_SOURCE)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    tokenizer.save_pretrained(folder)
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text())
    words = data["model"]["vocab"]
    words.update({f"<unused{i}>": i for i in range(len(words), vocab)})
    path.write_text(json.dumps(data, ensure_ascii=False))


def build_hf(shape: Shape, folder: Path, seed: int = 0, tiny: bool = False) -> Path:
    """Save a random-weight bf16 model of ``shape`` plus its tokenizer into ``folder``.

    transformers' own initialisation draws every linear and embedding weight from
    normal(0, initializer_range = 0.02) and sets norms to one; the seed makes it repeatable.
    The weights are made in bf16 (8 GB for a 4B shape, not float32's 16) and written in
    shards of 2 GB, so no step holds a second copy of the whole model.
    """
    import torch
    from transformers import AutoModelForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(shape.config(tiny), dtype=torch.bfloat16)
    model.save_pretrained(folder, max_shard_size="2GB")
    del model
    save_tokenizer(folder, 0 if tiny else shape.vocab)
    return folder


def _run(command: list[str], log: Path, env: dict[str, str] | None = None) -> float:
    """Run a tool niced (other work shares the cores), output to ``log``; return its seconds."""
    started = time.monotonic()
    with log.open("wb") as out:
        done = subprocess.run(
            ["nice", "-n", "10", *command], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{Path(command[0]).name} failed ({done.returncode}):\n{tail}")
    return time.monotonic() - started


# transformers 5 loads the tokenizer of any qwen2 folder as Qwen2Tokenizer, whose own
# pre-tokenizer regex replaces the saved one (qwen2 is in its "incorrect hub tokenizer class"
# set), so the converter would hash Qwen's pre-tokenization and reject SmolLM2's vocabulary.
# Taking qwen2 out of that set loads tokenizer.json as saved; the converter then identifies
# it by itself ("smollm", the same hash as for the llama shapes). Nothing else changes.
_CONVERT = (
    "import runpy, sys\n"
    "from transformers.models.auto import tokenization_auto\n"
    "tokenization_auto.MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS.discard('qwen2')\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def convert(hf: Path, out: Path) -> float:
    """llama.cpp's convert_hf_to_gguf.py, bf16 out; returns its wall time."""
    source = llama_cpp_source()
    # Run through runpy (see _CONVERT), so its own folder (conversion/) and its gguf-py go
    # on the path the way ``python convert_hf_to_gguf.py`` would put them.
    path = os.pathsep.join([str(source), str(source / "gguf-py")])
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}
    command = [
        sys.executable,
        "-c",
        _CONVERT,
        str(source / "convert_hf_to_gguf.py"),
        str(hf),
        "--outtype",
        "bf16",
        "--outfile",
        str(out),
    ]
    return _run(command, out.with_suffix(".convert.log"), env)


def quantize(source: Path, out: Path, fmt: str, threads: int = 2) -> float:
    """llama.cpp's llama-quantize on ``threads`` threads; returns its wall time."""
    from .llama_cpp import build_server, quantize_path

    if not quantize_path().exists() and build_server() is None:
        raise SystemExit("llama-quantize is unavailable (see benchmarks.llama_cpp.skip_reason)")
    command = [str(quantize_path()), str(source), str(out), fmt, str(threads)]
    return _run(command, out.with_suffix(".quantize.log"))


def gguf_summary(path: Path) -> dict[str, Any]:
    """What the converter wrote: architecture, vocabulary size, rope base, tensor types."""
    from gguf import GGUFReader  # the project's own dependency reads it

    reader = GGUFReader(path)
    arch = str(reader.fields["general.architecture"].contents())
    types: dict[str, int] = {}
    for tensor in reader.tensors:
        types[tensor.tensor_type.name] = types.get(tensor.tensor_type.name, 0) + 1
    return {
        "architecture": arch,
        "vocab_tokens": len(reader.fields["tokenizer.ggml.tokens"].contents()),
        "pre_tokenizer": str(reader.fields["tokenizer.ggml.pre"].contents()),
        "rope_freq_base": float(reader.fields[f"{arch}.rope.freq_base"].contents()),
        "context_length": int(reader.fields[f"{arch}.context_length"].contents()),
        "tensor_types": types,
    }


def ensure_models(
    shapes: list[str],
    formats: list[str],
    seed: int = 0,
    clean: bool = False,
    log: Callable[[str], object] = print,
) -> dict[tuple[str, str], Path]:
    """Make every (shape, format) file that is missing; return all their paths.

    Per shape, ``build.json`` records the seed, the tools' wall times and the file sizes.
    ``clean`` removes the bf16 safetensors and GGUF once the quantized files exist.
    """
    paths: dict[tuple[str, str], Path] = {}
    for key in shapes:
        shape = SHAPES[key]
        folder = model_dir(shape)
        record_path = folder / "build.json"
        record: dict[str, Any] = (
            json.loads(record_path.read_text()) if record_path.exists() else {"seconds": {}}
        )
        missing = [fmt for fmt in formats if not gguf_path(shape, fmt).exists()]
        if missing:
            hf = folder / "hf"
            bf16 = gguf_path(shape, "BF16")
            if not bf16.exists():
                if (
                    not (hf / "model.safetensors").exists()
                    and not (hf / "model.safetensors.index.json").exists()
                ):
                    log(f"{shape.name}: random bf16 weights (seed {seed})")
                    started = time.monotonic()
                    build_hf(shape, hf, seed)
                    record["seconds"]["build_hf"] = round(time.monotonic() - started, 1)
                log(f"{shape.name}: convert_hf_to_gguf.py --outtype bf16")
                record["seconds"]["convert_bf16"] = round(convert(hf, bf16), 1)
                record["bf16_summary"] = gguf_summary(bf16)
            for fmt in missing:
                log(f"{shape.name}: llama-quantize {fmt}")
                record["seconds"][f"quantize_{fmt}"] = round(
                    quantize(bf16, gguf_path(shape, fmt), fmt), 1
                )
            record.update(seed=seed, shape=asdict(shape))
        summaries = record.setdefault("summaries", {})
        for fmt in formats:
            if fmt not in summaries and gguf_path(shape, fmt).exists():
                summaries[fmt] = gguf_summary(gguf_path(shape, fmt))
        record["bytes"] = {
            p.name: p.stat().st_size for p in sorted(folder.glob("*.gguf")) if p.is_file()
        }
        folder.mkdir(parents=True, exist_ok=True)
        record_path.write_text(json.dumps(record, indent=1) + "\n")
        if clean and all(gguf_path(shape, fmt).exists() for fmt in formats):
            shutil.rmtree(folder / "hf", ignore_errors=True)
            gguf_path(shape, "BF16").unlink(missing_ok=True)
        for fmt in formats:
            paths[key, fmt] = gguf_path(shape, fmt)
    return paths


def shape_of(path: Path) -> tuple[Shape, str]:
    """The shape and format a file made here has, from its name."""
    for shape in SHAPES.values():
        prefix = f"{shape.name}-random-"
        if path.name.startswith(prefix) and path.suffix == ".gguf":
            return shape, path.name.removeprefix(prefix).removesuffix(".gguf")
    raise ValueError(f"{path} is not one of the files benchmarks.gguf_models makes")


def main(argv: list[str] | None = None) -> None:
    """Command line: make the files and print their paths."""
    parser = argument_parser("gguf_models", __doc__)
    parser.add_argument(
        "--shapes",
        default=",".join(DEFAULT_SHAPES),
        help=f"comma-separated, of {', '.join(SHAPES)} (default {','.join(DEFAULT_SHAPES)})",
    )
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--clean", action="store_true", help="delete the bf16 intermediates afterwards"
    )
    args = parser.parse_args(argv)
    shapes = parse_list(args.shapes, SHAPES, "shapes")
    formats = parse_list(args.formats, FORMATS, "formats")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for path in ensure_models(shapes, formats, args.seed, args.clean).values():
        print(path)


if __name__ == "__main__":
    sys.exit(main())
