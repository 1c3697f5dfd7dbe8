"""Safe extraction of uploaded dataset zips, and the containment of their yaml.

Checked before anything is extracted: no absolute paths, no ``..``, no symlinks or other
special files, no duplicate names; bounded member count, per-member and total inflated
size, per-member and whole-archive compression ratio, path depth and length
(:class:`ZipLimits`; every refusal names the limit and its setting). While extracting,
the bytes actually written are counted too (a lying header cannot inflate past the cap).

After extraction the upload endpoint applies the service's one containment rule
(:func:`service.storage.roots.check_dataset` with the upload's own folder): the yaml is
bounded (size, node count: no alias bombs) and every path it names stays inside the
upload, so an upload cannot point at another upload's images.
"""

from __future__ import annotations

import shutil
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

__all__ = ["UnsafeZipError", "ZipLimits", "check_zip", "extract_zip"]

#: the compression methods zipfile can read (stored, deflate, bzip2, lzma)
_METHODS = frozenset({zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA})
#: files smaller than this are never flagged by the ratio check (tiny text compresses well).
RATIO_MIN_BYTES = 1 << 20


class UnsafeZipError(ValueError):
    """A zip member that would escape the target, a special file, a zip bomb, a limit
    passed, or a dataset yaml pointing outside its upload. The message names the member,
    key or limit (and the limit's setting)."""


@dataclass(frozen=True)
class ZipLimits:
    """What one uploaded archive may make the server spend (Settings field in brackets).

    Attributes:
        max_total_bytes: inflated size of all members [``max_uncompressed_bytes``].
        max_ratio: inflated / compressed, per member over 1 MiB and for the whole archive
            [``max_compression_ratio``].
        max_members: files and folders [``max_zip_members``].
        max_member_bytes: inflated size of one member [``max_zip_member_bytes``].
        max_depth: folders in one member path [``max_zip_path_depth``].
        max_path_chars: characters of one member path [``max_zip_path_chars``]; one
            component is at most 255 bytes (the filesystems' limit).
        max_yaml_bytes: size of the dataset yaml [``max_yaml_bytes``].
        max_yaml_nodes: values in the parsed yaml, aliases counted each time they are
            used [fixed: 100000].
    """

    max_total_bytes: int = 8 << 30
    max_ratio: float = 200.0
    max_members: int = 200_000
    max_member_bytes: int = 1 << 30
    max_depth: int = 32
    max_path_chars: int = 1024
    max_yaml_bytes: int = 1 << 20
    max_yaml_nodes: int = 100_000


def _member_path(name: str) -> PurePosixPath:
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise UnsafeZipError(f"zip member {name!r} has an absolute path")
    path = PurePosixPath(name.replace("\\", "/"))
    if ".." in path.parts:
        raise UnsafeZipError(f"zip member {name!r} contains '..'")
    return path


def _limits(limits: ZipLimits | None, max_total_bytes: int | None, max_ratio: float | None) -> ZipLimits:
    limits = limits or ZipLimits()
    over = {k: v for k, v in (("max_total_bytes", max_total_bytes), ("max_ratio", max_ratio)) if v is not None}
    return ZipLimits(**{**limits.__dict__, **over})


def _check_member(info: zipfile.ZipInfo, path: PurePosixPath, lim: ZipLimits) -> None:
    """The checks of :func:`check_zip` that one member passes alone: its path's length and
    depth, its names' lengths, its inflated size, no encryption, a known compression
    method, a regular file or folder.

    Raises:
        UnsafeZipError: naming the member and the limit passed.
    """
    if len(info.filename) > lim.max_path_chars:
        raise UnsafeZipError(f"zip member {info.filename[:80]!r}... has a path of {len(info.filename)} "
                             f"characters, more than the limit of {lim.max_path_chars} (max_zip_path_chars)")
    if len(path.parts) - (0 if info.is_dir() else 1) > lim.max_depth:
        raise UnsafeZipError(f"zip member {info.filename[:80]!r} is {len(path.parts)} folders deep, more "
                             f"than the limit of {lim.max_depth} (max_zip_path_depth)")
    if any(len(part.encode()) > 255 for part in path.parts):
        raise UnsafeZipError(f"zip member {info.filename[:80]!r} has a name longer than 255 bytes")
    if info.file_size > lim.max_member_bytes:
        raise UnsafeZipError(f"zip member {info.filename!r} inflates to {info.file_size} bytes, more than "
                             f"the limit of {lim.max_member_bytes} (max_zip_member_bytes)")
    if info.flag_bits & 0x1:
        raise UnsafeZipError(f"zip member {info.filename!r} is encrypted (zip a dataset "
                             "without a password)")
    if info.compress_type not in _METHODS:
        raise UnsafeZipError(f"zip member {info.filename!r} uses compression method "
                             f"{info.compress_type}; use stored, deflate, bzip2 or lzma")
    mode = info.external_attr >> 16
    if stat.S_IFMT(mode) and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = "a symlink" if stat.S_ISLNK(mode) else "a special file"
        raise UnsafeZipError(f"zip member {info.filename!r} is {kind}")


def check_zip(zf: zipfile.ZipFile, *, max_total_bytes: int | None = None, max_ratio: float | None = None,
              limits: ZipLimits | None = None) -> int:
    """Validate every member against ``limits`` (``max_total_bytes``/``max_ratio``
    override two of them); returns the total inflated size in bytes. Reads only the
    central directory.

    Raises:
        UnsafeZipError: naming the first offending member and the limit passed.
    """
    lim = _limits(limits, max_total_bytes, max_ratio)
    infos = zf.infolist()
    if len(infos) > lim.max_members:
        raise UnsafeZipError(f"zip has {len(infos)} members, more than the limit of {lim.max_members} "
                             "(max_zip_members)")
    total = compressed = 0
    seen: set[str] = set()
    for info in infos:
        path = _member_path(info.filename)
        key = path.as_posix().rstrip("/")
        if key in seen:
            raise UnsafeZipError(f"zip member {info.filename!r} appears twice")
        seen.add(key)
        _check_member(info, path, lim)
        compressed += info.compress_size
        total += info.file_size
        if total > lim.max_total_bytes:
            raise UnsafeZipError(f"zip inflates to more than {lim.max_total_bytes} bytes "
                                 f"(at member {info.filename!r}; max_uncompressed_bytes)")
        if info.file_size > RATIO_MIN_BYTES and \
                info.file_size / max(info.compress_size, 1) > lim.max_ratio:
            raise UnsafeZipError(f"zip member {info.filename!r} has compression ratio "
                                 f"{info.file_size / max(info.compress_size, 1):.0f} > {lim.max_ratio:g} "
                                 "(max_compression_ratio)")
    if total > RATIO_MIN_BYTES and total / max(compressed, 1) > lim.max_ratio:
        raise UnsafeZipError(f"zip inflates {total / max(compressed, 1):.0f} times its compressed size, more "
                             f"than {lim.max_ratio:g} (max_compression_ratio; many small members)")
    return total


def extract_zip(zf: zipfile.ZipFile, dest: Path, *, max_total_bytes: int | None = None,
                max_ratio: float | None = None, limits: ZipLimits | None = None) -> None:
    """Check, then extract into ``dest`` (created), never writing outside it.

    Raises:
        UnsafeZipError: see :func:`check_zip`; also when the bytes actually inflated pass
            ``max_total_bytes`` (or one member's pass ``max_member_bytes``). ``dest`` is
            removed on error.
    """
    lim = _limits(limits, max_total_bytes, max_ratio)
    max_total_bytes = lim.max_total_bytes
    check_zip(zf, limits=lim)
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
            member = 0
            with zf.open(info) as src, open(target, "xb") as out:
                while chunk := src.read(1 << 20):
                    written += len(chunk)
                    member += len(chunk)
                    if written > max_total_bytes:
                        raise UnsafeZipError(f"zip inflates to more than {max_total_bytes} bytes "
                                             "(max_uncompressed_bytes)")
                    if member > lim.max_member_bytes:
                        raise UnsafeZipError(f"zip member {info.filename!r} inflates past "
                                             f"{lim.max_member_bytes} bytes (max_zip_member_bytes)")
                    out.write(chunk)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
