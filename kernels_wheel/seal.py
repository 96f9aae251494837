"""Record a repaired paged-llm-kernels wheel's library bytes in its manifest and RECORD.

auditwheel rewrites each library (RPATH, the bundled libgomp's name) after setup.py
recorded their sha256; the load refuses a library whose bytes differ from the manifest's,
so the manifest must name the bytes the user installs. Usage: seal.py FOLDER_OR_WHEEL...
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import zipfile
from pathlib import Path

MANIFEST = "paged_llm_kernels/manifest.json"


def seal(wheel: Path) -> None:
    """Rewrite wheel in place with its manifest's sha256s and its RECORD made anew."""
    with zipfile.ZipFile(wheel) as old:
        files = {info.filename: old.read(info) for info in old.infolist()}
        infos = {info.filename: info for info in old.infolist()}
    manifest = json.loads(files[MANIFEST])
    for library in manifest["libraries"].values():
        for build in library["builds"]:
            data = files[f"paged_llm_kernels/{build['file']}"]
            build["sha256"] = hashlib.sha256(data).hexdigest()
    files[MANIFEST] = (json.dumps(manifest, indent=1) + "\n").encode()
    record = next(name for name in files if name.endswith(".dist-info/RECORD"))
    lines = []
    for name, data in files.items():
        if name == record or name.endswith("/"):  # RECORD lists files, not folders
            continue
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{name},sha256={digest},{len(data)}")
    lines.append(f"{record},,")
    files[record] = ("\n".join(lines) + "\n").encode()
    tmp = wheel.with_name(wheel.name + ".partial")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as new:
        for name, data in files.items():
            info = infos[name]
            info.compress_type = zipfile.ZIP_DEFLATED
            new.writestr(info, data)
    tmp.replace(wheel)
    print(f"seal: {wheel.name}: manifest and RECORD name the repaired libraries")


def main(paths: list[str]) -> None:
    """Seal every wheel named, or found in a folder named."""
    for path in map(Path, paths):
        for wheel in sorted(path.glob("paged_llm_kernels-*.whl")) if path.is_dir() else [path]:
            seal(wheel)


if __name__ == "__main__":
    main(sys.argv[1:])
