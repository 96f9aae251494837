"""Builds llama.cpp's ``llama-server`` from the llama-cpp-python sdist and runs it as a peer.

``python scripts/llama_cpp.py build`` downloads the sdist with pip (a package registry),
builds only the server target (Release, -j2, nice) and caches the binary under
``.cache/llama.cpp/``; later calls return the cached binary at once. When cmake or a C++
compiler is missing, :func:`build_server` returns None and :func:`skip_reason` says why.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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


def _source_dir(log: object = print) -> Path:
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
    """The llama-server binary, built (Release, server target only) and cached on first use."""
    binary = server_path()
    if binary.exists():
        return binary
    reason = skip_reason()
    if reason is not None:
        log(reason)  # type: ignore[operator]
        return None
    source = _source_dir(log)
    build = CACHE / "build"
    log(f"llama.cpp: building llama-server from {source} (several minutes on 2 cores)")  # type: ignore[operator]
    configure = [
        "cmake", "-S", str(source), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
        "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON",
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
            "-j",
            str(jobs),
        ],
        check=True,
    )
    return binary if binary.exists() else None


def main() -> None:
    """Command line: ``build`` prints the binary's path (or the skip reason)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=["build"])
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    binary = build_server(args.jobs)
    print(binary if binary else skip_reason())


if __name__ == "__main__":
    main()
