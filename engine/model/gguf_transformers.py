"""transformers' config and tokenizer of a GGUF file, its metadata parsed once and kept."""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
import threading
from collections.abc import Callable, Container, Iterator
from pathlib import Path
from typing import Any

from paged_llm.engine.model import gguf_rope
from paged_llm.engine.model.architectures import check_supported
from paged_llm.engine.model.cache_folder import cache_folder, publish_folder
from paged_llm.engine.model.gguf_metadata import MetadataReader, Unreadable, passing_parsed


def config_and_tokenizer(gguf: Path, cache_dir: Path | None) -> tuple[Any, Any]:
    """The model config and tokenizer of a GGUF file, kept in ``cache_dir`` when given."""
    from transformers import AutoConfig, AutoTokenizer

    folder = cache_folder(gguf, cache_dir) if cache_dir is not None else None
    if folder is not None and (folder / "config.json").is_file():
        return (
            AutoConfig.from_pretrained(folder, local_files_only=True),
            AutoTokenizer.from_pretrained(folder, local_files_only=True),
        )
    with _metadata_parsed_once() as parse:
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        check_supported(config)  # before the slower tokenizer
        # A file only gguf's reader reads (big-endian): transformers' config as it is
        with contextlib.suppress(Unreadable):
            with_file_rope(config, gguf, parse(gguf))
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if folder is not None:
        folder.parent.mkdir(parents=True, exist_ok=True)
        # A folder of this process's own: two processes may read the same file at once.
        tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".partial-", dir=folder.parent))
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        publish_folder(tmp, folder)
    return config, tokenizer


def with_file_rope(config: Any, gguf: Path, reader: MetadataReader | None = None) -> None:
    """Give transformers' config of the file the rope scaling its loader skips (gguf_rope.py).

    ``reader``: the file's metadata when parsed already.
    """
    from paged_llm.engine.model import native_model
    from paged_llm.engine.model.gguf_config import rope_factors

    reader = reader if reader is not None else MetadataReader(gguf)
    kinds = native_model.rope_kinds(config)
    theta = (kinds.get("full_attention") or kinds.get(None) or {}).get("rope_theta")
    if theta is None:
        return
    metadata = reader.values()
    scaled = gguf_rope.scaling(
        metadata,
        str(metadata.get("general.architecture", "")),
        float(theta),
        native_model.head_dim(config),
        rope_factors(gguf, reader),
    )
    gguf_rope.apply(config, scaled)


# One first-time conversion at a time: two at once could each restore the other's patch.
_PARSE_LOCK = threading.Lock()
# Arrays this long go to load_gguf_checkpoint parsed whole: a vocabulary's, never a
# config's (whose one-item arrays would parse to their item, not a list).
_LONG_ARRAY = 1024
_ATOMS = (str, int, float, bool, type(None))


@contextlib.contextmanager
def _metadata_parsed_once() -> Iterator[Callable[[Any], MetadataReader]]:
    """Within it, transformers takes a GGUF file's metadata from one parse however often it asks.

    It gives the function that returns a file's one parse (Unreadable where it cannot read it).

    AutoConfig and AutoTokenizer read the file's metadata four times: three through
    transformers' ``read_gguf_metadata`` (the config's and the tokenizer's architecture
    checks, then the vocabulary and merges, which its numpy map reads a string at a time:
    0.3 s of a first start for a 49k-token vocabulary) and, for the architectures its fast
    config reader does not cover (llama, qwen2), one ``load_gguf_checkpoint`` through gguf's
    GGUFReader. Here all of them take their fields from one parse by the engine's
    MetadataReader (the same fields, a tenth of the time), ``load_gguf_checkpoint`` gets
    the vocabulary's arrays already parsed (it would parse them an item per call: 0.6 s
    for a 151k-token vocabulary) and a second call gets a copy of the first's result, so
    config and tokenizer are exactly what transformers builds alone. What MetadataReader
    cannot read (a big-endian file), calls that read tensors, and a transformers without
    these functions go through unchanged.
    """
    from transformers import modeling_gguf_pytorch_utils

    gguf_utils: Any = modeling_gguf_pytorch_utils  # its function is replaced for a while
    original = getattr(gguf_utils, "load_gguf_checkpoint", None)
    parse_item = getattr(gguf_utils, "_gguf_parse_value", None)
    import gguf

    gguf_module: Any = gguf  # its reader class is replaced for one parse at a time
    reader = gguf_module.GGUFReader
    readers = _metadata_readers()
    parsed: dict[str, MetadataReader] = {}
    checkpoints: dict[str, Any] = {}

    def parse(path: Any) -> MetadataReader:
        """The file's one MetadataReader (Unreadable where it cannot read the file)."""
        key = os.path.realpath(path)
        if key not in parsed:
            parsed[key] = MetadataReader(path)
        return parsed[key]

    def parsed_fields(path: Any, *args: Any, **kwargs: Any) -> Any:
        """GGUFReader(path)'s fields from the one parse, long arrays parsed whole; else gguf's."""
        try:
            fields = parse(path)
            # Parsed whole only where the item parse that passes them on replaces its own.
            return fields.parsed(_LONG_ARRAY) if parse_item is not None else fields
        except Unreadable:
            return reader(path, *args, **kwargs)

    def load_once(path: Any, return_tensors: bool = False, *args: Any, **kwargs: Any) -> Any:
        """load_gguf_checkpoint, its metadata-only result kept per file; a copy per call."""
        assert original is not None  # put in place only where transformers has it
        if return_tensors or args or kwargs:
            return original(path, return_tensors, *args, **kwargs)
        key = os.path.realpath(path)
        if key not in checkpoints:
            gguf_module.GGUFReader = parsed_fields  # transformers imports it per call
            if parse_item is not None:
                gguf_utils._gguf_parse_value = passing_parsed(parse_item)
            try:
                checkpoints[key] = original(path, return_tensors=False)
            finally:
                gguf_module.GGUFReader = reader
                if parse_item is not None:
                    gguf_utils._gguf_parse_value = parse_item
        # A copy per caller, the first included: a caller may change the dicts it gets.
        return _copied(checkpoints[key])

    def read_metadata(path: Any, string_arrays: Container[str] = ()) -> Any:
        """What transformers' read_gguf_metadata(path, string_arrays) gives, from the one parse."""
        try:
            parsed_file = parse(path)
        except Unreadable:
            return readers[0][1](path, string_arrays)
        return parsed_file.values(string_arrays), tuple(t.name for t in parsed_file.tensors)

    with _PARSE_LOCK:
        if original is not None:
            gguf_utils.load_gguf_checkpoint = load_once
        for module, _ in readers:
            module.read_gguf_metadata = read_metadata
        try:
            yield parse
        finally:
            if original is not None:
                gguf_utils.load_gguf_checkpoint = original
            for module, function in readers:
                module.read_gguf_metadata = function


def _copied(value: Any) -> Any:
    """A deep copy of a checkpoint's dicts and lists of plain values (copy.deepcopy's result).

    deepcopy visits every item of a vocabulary and its merges (0.2 s of a first start); a
    list of only strings and numbers is copied whole here.
    """
    if type(value) is dict:
        return {key: _copied(item) for key, item in value.items()}
    if type(value) is list:
        if all(type(item) in _ATOMS for item in value):
            return list(value)
        return [_copied(item) for item in value]
    if type(value) in _ATOMS:
        return value
    return copy.deepcopy(value)


def _metadata_readers() -> list[tuple[Any, Callable[..., Any]]]:
    """The transformers modules that give ``read_gguf_metadata``, each with that function."""
    try:
        from transformers.integrations import gguf as package
        from transformers.integrations.gguf import reader
    except ImportError:
        return []
    # The package re-exports the reader's function: configuration_utils imports it from there.
    return [(module, module.read_gguf_metadata) for module in (reader, package)]
