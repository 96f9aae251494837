"""Builds llama.cpp's ``llama-server`` from the llama-cpp-python sdist and runs it as a peer.

``scripts/bench llama_cpp build`` downloads the sdist with pip (a package registry),
builds only the server and quantize targets (Release, -j2, nice) and caches the binaries
under ``.cache/llama.cpp/``; later calls return the cached binary at once. When cmake or a C++
compiler is missing, :func:`build_server` returns None and :func:`skip_reason` says why.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from . import ROOT, argument_parser
from .process import ServerProcess, free_port

CACHE = ROOT / ".cache" / "llama.cpp"
SDIST = "llama-cpp-python"


def skip_reason() -> str | None:
    """Why llama.cpp cannot be built here, or None when cmake and a C++ compiler exist."""
    if shutil.which("cmake") is None:
        return "llama.cpp skipped: cmake is not installed"
    if not any(shutil.which(cxx) for cxx in ("c++", "g++", "clang++")):
        return "llama.cpp skipped: no C++ compiler (c++, g++ or clang++) on PATH"
    return None


def server_path() -> Path:
    """Where the cached llama-server binary lives once built."""
    return CACHE / "build" / "bin" / "llama-server"


def quantize_path() -> Path:
    """Where the cached llama-quantize binary lives once built (by :func:`build_server`)."""
    return CACHE / "build" / "bin" / "llama-quantize"


def source_dir(log: object = print) -> Path:
    """Download and unpack the sdist once; return its vendored llama.cpp source folder."""
    existing = sorted(CACHE.glob("llama_cpp_python-*/vendor/llama.cpp"))
    if existing:
        return existing[-1]
    CACHE.mkdir(parents=True, exist_ok=True)
    if not sorted(CACHE.glob("llama_cpp_python-*.tar.gz")):
        log(f"llama.cpp: downloading the {SDIST} sdist with pip")  # type: ignore[operator]
        # The project's .venv (made by uv) has no pip; fall back to the system's.
        pip = (
            [sys.executable, "-m", "pip"]
            if importlib.util.find_spec("pip")
            else [shutil.which("pip3") or "pip"]
        )
        subprocess.run(
            [*pip, "download", "--no-binary", ":all:", "--no-deps", SDIST, "-d", str(CACHE)],
            check=True,
        )
    archive = sorted(CACHE.glob("llama_cpp_python-*.tar.gz"))[-1]
    with tarfile.open(archive) as tar:
        tar.extractall(CACHE, filter="data")
    return sorted(CACHE.glob("llama_cpp_python-*/vendor/llama.cpp"))[-1]


def build_server(jobs: int = 2, log: object = print) -> Path | None:
    """The llama-server binary, built (Release, server and quantize targets), cached on first use.

    ``llama-quantize`` (:func:`quantize_path`) comes from the same build: the GGUF benchmark
    makes its Q4/Q8 files with llama.cpp's own quantizer.
    """
    binary = server_path()
    if binary.exists() and quantize_path().exists():
        return binary
    reason = skip_reason()
    if reason is not None:
        log(reason)  # type: ignore[operator]
        return None
    source = source_dir(log)
    build = CACHE / "build"
    log(f"llama.cpp: building llama-server and llama-quantize from {source} (minutes on 2 cores)")  # type: ignore[operator]
    # AMX off: a virtual machine may show AMX in its CPU flags without granting its tile
    # state, and llama-server then dies at its first matrix product (seen on a 2-core
    # Sapphire Rapids VM); the engine uses no AMX either, so both run on AVX-512 there.
    no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    configure = [
        "cmake", "-S", str(source), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
        "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON",
        f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={no_amx}",
    ]  # fmt: skip
    subprocess.run(configure, check=True)
    subprocess.run(
        [
            "nice",
            "-n",
            "10",
            "cmake",
            "--build",
            str(build),
            "--target",
            "llama-server",
            "llama-quantize",
            "-j",
            str(jobs),
        ],
        check=True,
    )
    return binary if binary.exists() else None


class LlamaServer(ServerProcess):
    """A llama-server process on one GGUF file: 2 threads, ``slots`` at once.

    ``unified``: the slots share one KV cache of ``kv_tokens`` (a request that finds it full
    fails with "Context size has been exceeded"; llama.cpp neither waits nor preempts);
    otherwise each slot owns ``kv_tokens / slots`` and requests beyond the slots queue.
    """

    def __init__(
        self,
        binary: Path,
        gguf: Path,
        kv_tokens: int,
        slots: int,
        threads: int = 2,
        unified: bool = True,
    ) -> None:
        """Remember how to start it; :meth:`__enter__` starts it and waits until it serves."""
        port = free_port()
        command = [
            str(binary), "-m", str(gguf), "-t", str(threads), "-tb", str(threads),
            "-c", str(kv_tokens), "-np", str(slots), "-cb",
            "--host", "127.0.0.1", "--port", str(port), "--no-webui",
        ]  # fmt: skip
        command.append("--kv-unified" if unified else "--no-kv-unified")
        super().__init__("llama-server", command, port)


async def stream_completion(
    session: Any, url: str, prompt_ids: list[int], max_tokens: int
) -> tuple[float, float, int]:
    """One greedy completion streamed from /completion: (TTFT s, end-to-end s, tokens)."""
    body = {
        "prompt": prompt_ids,
        "n_predict": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "cache_prompt": True,
        "stream": True,
    }
    started = time.monotonic()
    first: float | None = None
    tokens = 0
    async with session.post(f"{url}/completion", json=body) as reply:
        reply.raise_for_status()
        async for raw in reply.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if chunk.get("stop"):
                tokens = int(chunk.get("tokens_predicted", tokens))
                break
            if first is None:
                first = time.monotonic()
            tokens += 1
    end = time.monotonic()
    return (first or end) - started, end - started, tokens


def run_workload(binary: Path, gguf: Path, workload: list[Any], slots: int = 4) -> dict[str, Any]:
    """Drive the home workload (HomeRequest-like items) at its arrival times through the server.

    llama.cpp is set up the way Ollama runs it: a few slots (OLLAMA_NUM_PARALLEL), each with
    its own context long enough for the longest request, and the rest queued. A shared
    (unified) cache the size of this engine's pool would fail requests instead: llama.cpp
    cannot wait for or preempt a sequence when the shared cache is full.

    Returns per-request rows (request_id, priority, arrival, ttft, e2e, queue, tokens), the
    makespan, the server's peak memory and its KV tokens; the benchmark turns them into its
    SystemRun.
    """
    import aiohttp

    async def main(server: LlamaServer) -> tuple[list[dict[str, Any]], float]:
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            start = time.monotonic()

            async def one(req: Any) -> dict[str, Any]:
                await asyncio.sleep(max(0.0, start + req.arrival - time.monotonic()))
                ttft, e2e, tokens = await stream_completion(
                    session, server.url, req.prompt_ids, req.max_tokens
                )
                return {
                    "request_id": req.request_id,
                    "priority": req.priority,
                    "arrival": req.arrival,
                    "ttft": ttft,
                    "e2e": e2e,
                    "queue": 0.0,  # llama-server does not report it
                    "tokens": tokens,
                }

            rows = list(await asyncio.gather(*(one(r) for r in workload)))
            return rows, time.monotonic() - start - workload[0].arrival

    longest = max(len(req.prompt_ids) + req.max_tokens for req in workload)
    kv_tokens = slots * 256 * -(-longest // 256)
    with LlamaServer(binary, gguf, kv_tokens, slots, unified=False) as server:
        rows, makespan = asyncio.run(main(server))
        return {
            "results": rows,
            "makespan": makespan,
            "peak_rss": server.peak_rss,
            "kv_tokens": kv_tokens,
            "slots": slots,
        }


def decode_rate(binary: Path, gguf: Path, prompt_ids: list[int], batch: int, tokens: int) -> float:
    """Decode tokens per second with ``batch`` identical-length requests sent at once.

    Counted from the moment the last request got its first token (every prompt read,
    all decoding together) to the end, as the engine's own decode figure is: the tokens
    after each request's first, over that time.
    """
    import aiohttp

    async def main(server: LlamaServer) -> float:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            done = await asyncio.gather(
                *(stream_completion(session, server.url, prompt_ids, tokens) for _ in range(batch))
            )
            decoding = max(e2e for _, e2e, _ in done) - max(ttft for ttft, _, _ in done)
            return sum(n - 1 for _, _, n in done) / decoding

    with LlamaServer(binary, gguf, batch * (len(prompt_ids) + tokens + 16), batch) as server:
        return asyncio.run(main(server))


def main(argv: list[str] | None = None) -> None:
    """Command line: ``build`` prints the binary's path (or the skip reason)."""
    parser = argument_parser("llama_cpp", __doc__)
    parser.add_argument("command", choices=["build"])
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args(argv)
    binary = build_server(args.jobs)
    print(binary if binary else skip_reason())


if __name__ == "__main__":
    sys.exit(main())
