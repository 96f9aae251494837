"""Which model file is loaded, so a file rewritten in place under the engine is noticed."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


class ModelFileChanged(Exception):
    """The memory-mapped model file was rewritten in place while the engine used it."""


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """A file's device, inode, size and modification time when the engine opened it.

    A GGUF file is memory-mapped, not copied. Deleting it, or replacing it by a rename
    (what downloads and `mv` do), leaves the mapped inode intact: the engine goes on
    with the old weights and the next load reads the new file. Writing it in place (`cp`
    over it, a download into the same name) changes the pages under the mapping: the
    engine would compute with a mix of two models, or die of SIGBUS once the file shrank.
    """

    path: Path
    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> FileIdentity:
        """The identity of ``path`` now."""
        stat = path.stat()
        return cls(path, stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)

    def changed_in_place(self) -> bool:
        """Whether the same inode now has another size or modification time (one stat)."""
        try:
            stat = os.stat(self.path)
        except OSError:
            return False  # deleted: the mapping keeps the old inode alive
        if (stat.st_dev, stat.st_ino) != (self.device, self.inode):
            return False  # replaced by a rename: the mapped inode is untouched
        return (stat.st_size, stat.st_mtime_ns) != (self.size, self.mtime_ns)


def model_file(model: str) -> Path | None:
    """The GGUF file a model setting names, when it is one on disk (not a folder, not a Hub id)."""
    path = Path(model.strip()).expanduser()
    return path if path.suffix == ".gguf" and path.is_file() else None
