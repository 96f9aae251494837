"""GGUF files from the Hugging Face Hub or an https URL: named, resolved, checked, downloaded.

What a user may type for "another file": ``owner/repo:Q4_K_M`` (llama.cpp's ``-hf`` form: the
repository's file of that quantization), ``owner/repo/file.gguf``, or an https URL. The Hub
is asked for the file's size and sha256 (its tree API lists both for every LFS file), and
the download (paged_llm.download: ``.part`` file, Range resume, fsync, rename) checks them,
and the file's first bytes, before the file takes its final name. ``HF_ENDPOINT`` (the Hub
client's own setting) points at another Hub, a mirror or a test's stand-in.
"""

from __future__ import annotations

import enum
import json
import os
import re
import shutil
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from paged_llm.download import (
    GGUF_MAGIC,
    TIMEOUT_S,
    DownloadError,
    Progress,
    _Dropped,
    _exclusive,
    _open_url,
    download,
)
from paged_llm.net import is_loopback

ENDPOINT_ENV = "HF_ENDPOINT"
DEFAULT_ENDPOINT = "https://huggingface.co"
_USER_AGENT = "paged-llm (model download)"
_REPO = r"[A-Za-z0-9][\w.-]*/[\w.-]+"
_HUB_QUANT = re.compile(rf"^(?P<repo>{_REPO}):(?P<quant>[\w.-]+)$")
_HUB_FILE = re.compile(rf"^(?P<repo>{_REPO})/(?P<file>(?:[\w.-]+/)*[\w.-]+\.gguf)$", re.I)
# Split files (-00001-of-00003) and vision projectors are not a whole text model.
_NOT_A_MODEL = re.compile(r"-\d{5}-of-\d{5}\.gguf$|mmproj", re.I)


class SourceKind(enum.StrEnum):
    """Where a model file comes from."""

    HUB = "hub"
    URL = "url"


@dataclass(frozen=True, slots=True)
class Source:
    """A file to download: a Hub repository and a file or a quantization, or a URL."""

    kind: SourceKind
    repo: str = ""
    filename: str = ""  # a path inside the repository
    quant: str = ""
    url: str = ""


@dataclass(frozen=True, slots=True)
class RemoteFile:
    """A resolved file: where to fetch it, its name here, and what it must be."""

    url: str
    filename: str
    size: int | None
    sha256: str | None


def endpoint() -> str:
    """The Hub's address: ``HF_ENDPOINT``, else huggingface.co."""
    return (os.environ.get(ENDPOINT_ENV, "").strip() or DEFAULT_ENDPOINT).rstrip("/")


def _loopback(url: str) -> bool:
    """Whether ``url``'s host is this machine (plain http cannot be tampered with there)."""
    return is_loopback(urllib.parse.urlsplit(url).hostname or "")


def parse_source(text: str) -> Source | None:
    """The download ``text`` names, or None for anything else (a path, a model id).

    DownloadError for a URL that is not https (but on this machine).
    """
    text = text.strip()
    if re.match(r"^[a-z][a-z0-9+.-]*://", text, re.I):
        scheme = urllib.parse.urlsplit(text).scheme.lower()
        if scheme != "https" and not (scheme == "http" and _loopback(text)):
            raise DownloadError(
                f"{text} is not an https URL; only https downloads are allowed (the file's "
                "size and checksum are all that guard it otherwise)"
            )
        return Source(SourceKind.URL, url=text)
    if match := _HUB_QUANT.match(text):
        return Source(SourceKind.HUB, repo=match["repo"], quant=match["quant"])
    if match := _HUB_FILE.match(text):
        return Source(SourceKind.HUB, repo=match["repo"], filename=match["file"])
    return None


def _get_json(url: str, what: str) -> object:
    """A JSON document; DownloadError naming ``what`` when it cannot be had."""
    request = urllib.request.Request(
        url, headers={"User-Agent": _USER_AGENT, "Accept": "application/json"}
    )
    try:
        with _open_url(request, TIMEOUT_S) as response:
            return json.loads(response.read())
    except DownloadError as err:
        raise DownloadError(f"{what}: {err}") from None
    except _Dropped as err:
        raise DownloadError(f"cannot reach {endpoint()} ({err})") from err
    except (ValueError, OSError) as err:
        raise DownloadError(f"{what}: unreadable answer ({err})") from err


def _hub_files(repo: str) -> list[dict[str, object]]:
    """The files of a Hub repository's main branch, as its tree API lists them."""
    quoted = urllib.parse.quote(repo, safe="/")
    listing = _get_json(
        f"{endpoint()}/api/models/{quoted}/tree/main?recursive=true",
        f"the repository {repo} was not found on {endpoint()}",
    )
    if not isinstance(listing, list):
        raise DownloadError(f"{endpoint()} answered no file list for {repo}")
    return [item for item in listing if isinstance(item, dict) and item.get("type") == "file"]


def _pick(repo: str, files: list[dict[str, object]], source: Source) -> dict[str, object]:
    """The file ``source`` names among a repository's ``files``."""
    ggufs = [f for f in files if str(f.get("path", "")).lower().endswith(".gguf")]
    if source.filename:
        for item in ggufs:
            if item.get("path") == source.filename:
                return item
        raise DownloadError(f"the repository {repo} has no file {source.filename}")
    quant = source.quant.lower()
    whole = [f for f in ggufs if not _NOT_A_MODEL.search(str(f["path"]))]
    ending = re.compile(rf"[-_.]{re.escape(quant)}\.gguf$")
    matching = [f for f in whole if ending.search(str(f["path"]).lower())]
    if not matching:
        offered = sorted({_quant_of(str(f["path"])) for f in whole})
        raise DownloadError(
            f"the repository {repo} has no {source.quant} file"
            + (f"; it offers {', '.join(offered)}" if offered else " (no GGUF file at all)")
        )
    return min(matching, key=lambda f: len(str(f["path"])))


def _quant_of(path: str) -> str:
    """The quantization a GGUF file's name ends with (``…-Q4_K_M.gguf`` -> ``Q4_K_M``)."""
    stem = path.rsplit("/", 1)[-1].removesuffix(".gguf")
    return re.split(r"[-.]", stem)[-1]


def resolve(source: Source) -> RemoteFile:
    """Where ``source``'s file is and what it must be (the Hub's size and sha256)."""
    if source.kind is SourceKind.URL:
        return _resolve_url(source.url)
    item = _pick(source.repo, _hub_files(source.repo), source)
    path = str(item["path"])
    lfs = item.get("lfs") if isinstance(item.get("lfs"), dict) else {}
    assert isinstance(lfs, dict)
    sha256 = lfs.get("oid") or lfs.get("sha256")
    size = lfs.get("size", item.get("size"))
    quoted = urllib.parse.quote(f"{source.repo}/resolve/main/{path}", safe="/")
    return RemoteFile(
        url=f"{endpoint()}/{quoted}",
        filename=path.rsplit("/", 1)[-1],
        size=int(size) if isinstance(size, int) else None,
        sha256=str(sha256) if isinstance(sha256, str) and len(sha256) == 64 else None,
    )


def _resolve_url(url: str) -> RemoteFile:
    """A URL's file: its name, and the size and sha256 a Hub-like server states in a HEAD."""
    name = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    if not name.lower().endswith(".gguf"):
        raise DownloadError(f"{url} does not name a .gguf file")
    request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": _USER_AGENT})
    try:
        with _open_url(request, TIMEOUT_S) as response:
            headers = response.headers
    except _Dropped as err:
        raise DownloadError(f"cannot reach {url} ({err})") from err
    size = headers.get("X-Linked-Size") or headers.get("Content-Length")
    etag = (headers.get("X-Linked-Etag") or "").strip('"').removeprefix("W/").strip('"')
    return RemoteFile(
        url=url,
        filename=name,
        size=int(size) if size and size.isdigit() else None,
        sha256=etag if re.fullmatch(r"[0-9a-f]{64}", etag) else None,
    )


def check_disk(remote: RemoteFile, models_dir: Path) -> None:
    """DownloadError when the file cannot fit the disk holding ``models_dir``."""
    if remote.size is None:
        return
    models_dir.mkdir(parents=True, exist_ok=True)
    part = models_dir / f"{remote.filename}.part"
    have = part.stat().st_size if part.is_file() else 0
    free = shutil.disk_usage(models_dir).free
    if remote.size - have > free:
        raise DownloadError(
            f"{remote.filename} needs {remote.size / 1e9:.1f} GB; the disk holding "
            f"{models_dir} has {free / 1e9:.1f} GB free"
        )


def fetch(remote: RemoteFile, models_dir: Path, progress: Progress | None = None) -> Path:
    """Download ``remote`` into ``models_dir`` (once: a checked file there is kept)."""
    check_disk(remote, models_dir)
    dest = models_dir / remote.filename
    with _exclusive(dest):
        return download(
            remote.url,
            dest,
            sha256=remote.sha256,
            size=remote.size,
            progress=progress,
            magic=GGUF_MAGIC,
        )
