"""The ``paged-llm`` command: ``serve``, ``chat`` and ``generate``."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from paged_llm.defaults import DEFAULT_MODEL, WEIGHT_CHOICES
from paged_llm.download import DownloadError
from paged_llm.extras import (
    ENGINE_EXTRA,
    EngineExtraMissing,
    require_cpu_extra,
    require_engine_extra,
)
from paged_llm.protocol.priority import PRIORITY_NAMES

from .hub_model import fetch_hub_model
from .settings import API_KEY_ENV, DEFAULT_BODY_LIMIT, DEFAULT_HOST, DEFAULT_PORT, ServerSettings

if TYPE_CHECKING:
    from paged_llm.engine.api import EngineConfig

_SIZE = re.compile(r"^\s*([0-9.]+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> float:
    """A KV budget: bytes (``512MiB``, ``2G``, ``1073741824``) or a fraction such as ``0.8``."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 512MiB, 2GiB or 0.8)")
    value = float(match.group(1))
    unit = match.group(2).lower()
    return value * 1024 ** "_kmgt".index(unit) if unit else value


def _engine_arguments(parser: argparse.ArgumentParser, positional_model: bool = False) -> None:
    """The engine's settings, shared by every subcommand."""
    group = parser.add_argument_group("engine")
    what = (
        "a model folder, a .gguf file, a Hugging Face id, a Hub GGUF file fetched once "
        "(owner/repo:Q4_K_M, owner/repo/file.gguf, an https URL; HF_ENDPOINT for a mirror) "
        f"or bundled:NAME (default {DEFAULT_MODEL})"
    )
    if positional_model:
        group.add_argument("model", nargs="?", default=DEFAULT_MODEL, help=what)
        group.add_argument("--model", dest="model_option", help="the model, as an option")
    else:
        group.add_argument("--model", dest="model_option", default=DEFAULT_MODEL, help=what)
    group.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    group.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"]
    )
    group.add_argument(
        "--weights",
        default="auto",
        choices=WEIGHT_CHOICES,
        help="linear weights: auto (a GGUF file's Q4/Q8 weights kept as they are on a float32 "
        "CPU engine where the C kernels load (prebuilt, or built by a C compiler), else "
        "dense), float, q4 or q8 (also quantize a "
        "float model; bfloat16 where the CPU has it, answers may differ slightly)",
    )
    group.add_argument(
        "--kv-budget",
        type=parse_size,
        default=256 * 2**20,
        help="KV pool size: bytes (512MiB, 4GiB) or a fraction of the memory left after "
        "the weights (0.8); default 256MiB",
    )
    group.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=["auto", "float32", "float16", "bfloat16"],
        help="what the KV cache holds: auto (float16 on a CPU engine running quantized "
        "weights, which doubles the blocks a budget buys; else the model's dtype), float32, "
        "float16 or bfloat16 (16 bits under a float32 model on the CPU only)",
    )
    group.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    group.add_argument("--max-num-seqs", type=int, default=32, help="sequences per batch")
    group.add_argument(
        "--max-num-batched-tokens", type=int, default=512, help="token budget per step"
    )
    group.add_argument("--max-model-len", type=int, help="context length (default: the model's)")
    group.add_argument("--max-waiting", type=int, default=256, help="queue length before 503")
    group.add_argument(
        "--json-string-chars",
        type=int,
        default=1000,
        help="characters a JSON answer's string may hold when its schema sets no maxLength "
        "(structured output and tool calls); default 1000",
    )
    group.add_argument("--cache-dir", help="folder for converted GGUF models")
    group.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"])
    group.add_argument(
        "--runner",
        default="auto",
        choices=["auto", "torch", "numpy"],
        help="model runner: numpy (a GGUF file on the CPU, no torch), torch, or auto (numpy "
        "for a GGUF file on a CPU, else torch)",
    )
    group.add_argument(
        "--no-prefix-caching", action="store_true", help="do not share cached prompt prefixes"
    )
    group.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig the arguments describe (ValueError naming a bad setting)."""
    from paged_llm.engine.api import EngineConfig, JsonBounds

    cache_dir = Path(args.cache_dir or os.environ.get("XDG_CACHE_HOME", "~/.cache") + "/paged-llm")
    return EngineConfig(
        model=args.model_option or getattr(args, "model", DEFAULT_MODEL),
        device=args.device,
        dtype=args.dtype,
        weights=args.weights,
        kv_cache_dtype=args.kv_cache_dtype,
        block_size=args.block_size,
        kv_budget=args.kv_budget,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        max_waiting=args.max_waiting,
        attention_backend=args.attention_backend,
        cache_dir=cache_dir.expanduser(),
        enable_prefix_caching=not args.no_prefix_caching,
        json_bounds=JsonBounds(string_chars=args.json_string_chars),
        runner=args.runner,
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``paged-llm``."""
    parser = argparse.ArgumentParser(
        prog="paged-llm", description="A paged-KV LLM engine: serve it, chat with it, load it."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the OpenAI-compatible server")
    _engine_arguments(serve, positional_model=True)
    net = serve.add_argument_group("server")
    net.add_argument("--host", default=DEFAULT_HOST, help=f"address (default {DEFAULT_HOST})")
    net.add_argument("--port", type=int, default=DEFAULT_PORT, help="port; 0 picks a free one")
    net.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"require this bearer key (default: ${API_KEY_ENV})",
    )
    net.add_argument(
        "--no-auth",
        action="store_true",
        help="allow listening beyond loopback without an API key (logs a warning)",
    )
    net.add_argument("--served-model-name", help="the model name clients use (default: MODEL)")
    net.add_argument(
        "--max-body-size", type=parse_size, default=DEFAULT_BODY_LIMIT, help="request body limit"
    )
    net.add_argument(
        "--grace-period",
        type=float,
        default=30.0,
        help="seconds running requests get to finish on SIGTERM",
    )

    chat = commands.add_parser("chat", help="stream an answer, or chat when no prompt is given")
    _engine_arguments(chat)
    chat.add_argument("prompt", nargs="?", help="one question; without it, an interactive chat")
    chat.add_argument("--system", help="a system prompt")
    chat.add_argument("--max-tokens", type=int, default=512)
    chat.add_argument("--temperature", type=float, default=0.7)
    chat.add_argument("--seed", type=int)

    generate = commands.add_parser("generate", help="run N prompts at once and print metrics")
    _engine_arguments(generate)
    generate.add_argument("--concurrency", "-n", type=int, default=8, help="prompts at once")
    generate.add_argument("--max-tokens", type=int, default=64)
    generate.add_argument("--temperature", type=float, default=0.0)
    generate.add_argument("--priority", choices=PRIORITY_NAMES, default="interactive")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``paged-llm``; the exit status is 0 on success, 2 on a bad setting."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        asked = engine_config(args)
        config = fetch_hub_model(asked)
        from paged_llm.engine.api import runner_for

        # Looked up, not imported: torch takes seconds, and serve opens its socket first.
        if runner_for(config) == "numpy":
            require_cpu_extra("paged-llm")
        else:
            require_engine_extra("paged-llm", ("transformers", "gguf", "accelerate"))
            if importlib.util.find_spec("torch") is None:
                raise EngineExtraMissing(f"paged-llm needs PyTorch; pip install '{ENGINE_EXTRA}'")
        if args.command == "serve":
            from .serve import serve

            settings = ServerSettings(
                host=args.host,
                port=args.port,
                api_key=args.api_key or None,
                no_auth=args.no_auth,
                # A fetched Hub file keeps the name it was asked by (owner/repo:QUANT).
                served_model_name=args.served_model_name
                or (asked.model if asked.model != config.model else None),
                max_body_bytes=int(args.max_body_size),
                grace_seconds=args.grace_period,
            )
            settings.check()
            return asyncio.run(serve(config, settings))
        from . import terminal

        if args.command == "chat":
            return asyncio.run(terminal.chat(config, args))
        return asyncio.run(terminal.generate(config, args))
    except (EngineExtraMissing, DownloadError) as err:
        print(f"paged-llm: {err}", file=sys.stderr)
        return 1
    except ValueError as err:
        print(f"paged-llm: {err}", file=sys.stderr)
        return 2
    except Exception as err:
        from paged_llm.engine.api import EngineError

        if not isinstance(err, EngineError):
            raise
        print(f"paged-llm: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
