"""Wheels built on the spot for the source tests: any distribution, any files, RECORD as asked."""
from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from pathlib import Path


def record_hash(data: bytes) -> str:
    """A RECORD hash entry for ``data``: ``sha256=<urlsafe base64, no padding>``."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(where: Path, files: dict[str, bytes], hashes: dict[str, str] | None = None,
                unlisted: tuple[str, ...] = (), version: str = "1.0", dist: str = "tiny-pkg") -> Path:
    """A wheel of ``dist`` with ``files``; ``hashes`` overrides RECORD entries, ``unlisted`` leaves some out."""
    where.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[-_.]+", "_", dist).lower()
    info = f"{name}-{version}.dist-info"
    record = [f"{p},{(hashes or {}).get(p, record_hash(d))},{len(d)}" for p, d in files.items() if p not in unlisted]
    record.append(f"{info}/RECORD,,")
    wheel = where / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel
