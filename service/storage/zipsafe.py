"""Safe extraction of uploaded dataset zips.

Checked before anything is extracted: no absolute paths, no ``..``, no symlinks or other
special files, bounded total inflated size and per-file compression ratio. While
extracting, the bytes actually written are counted too (a lying header cannot inflate
past the cap).
"""

from __future__ import annotations

import shutil
import stat
import zipfile
from pathlib import Path, PurePosixPath

__all__ = ["UnsafeZipError", "check_zip", "extract_zip"]

#: files smaller than this are never flagged by the ratio check (tiny text compresses well).
RATIO_MIN_BYTES = 1 << 20


class UnsafeZipError(ValueError):
    """A zip member that would escape the target, a special file, or a zip bomb."""


def _member_path(name: str) -> PurePosixPath:
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise UnsafeZipError(f"zip member {name!r} has an absolute path")
    path = PurePosixPath(name.replace("\\", "/"))
    if ".." in path.parts:
        raise UnsafeZipError(f"zip member {name!r} contains '..'")
    return path


def check_zip(zf: zipfile.ZipFile, *, max_total_bytes: int, max_ratio: float) -> int:
    """Validate every member; returns the total inflated size in bytes.

    Raises:
        UnsafeZipError: naming the first offending member.
    """
    total = 0
    for info in zf.infolist():
        _member_path(info.filename)
        mode = info.external_attr >> 16
        if stat.S_IFMT(mode) and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            kind = "a symlink" if stat.S_ISLNK(mode) else "a special file"
            raise UnsafeZipError(f"zip member {info.filename!r} is {kind}")
        total += info.file_size
        if total > max_total_bytes:
            raise UnsafeZipError(f"zip inflates to more than {max_total_bytes} bytes "
                                 f"(at member {info.filename!r})")
        if info.file_size > RATIO_MIN_BYTES and \
                info.file_size / max(info.compress_size, 1) > max_ratio:
            raise UnsafeZipError(f"zip member {info.filename!r} has compression ratio "
                                 f"{info.file_size / max(info.compress_size, 1):.0f} > {max_ratio:g}")
    return total


def extract_zip(zf: zipfile.ZipFile, dest: Path, *, max_total_bytes: int, max_ratio: float) -> None:
    """Check, then extract into ``dest`` (created), never writing outside it.

    Raises:
        UnsafeZipError: see :func:`check_zip`; also when the bytes actually inflated pass
            ``max_total_bytes``. ``dest`` is removed on error.
    """
    check_zip(zf, max_total_bytes=max_total_bytes, max_ratio=max_ratio)
    dest.mkdir(parents=True, exist_ok=False)
    root = dest.resolve()
    written = 0
    try:
        for info in zf.infolist():
            target = (root / _member_path(info.filename)).resolve()
            if not target.is_relative_to(root):
                raise UnsafeZipError(f"zip member {info.filename!r} leaves the upload folder")
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "xb") as out:
                while chunk := src.read(1 << 20):
                    written += len(chunk)
                    if written > max_total_bytes:
                        raise UnsafeZipError(f"zip inflates to more than {max_total_bytes} bytes")
                    out.write(chunk)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
