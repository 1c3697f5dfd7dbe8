"""Dataset YAML loading: ``load_data_config(path) -> DataConfig``.

The YAML schema follows the YOLO convention (LibreYOLO ``docs/dataset_schema.md``,
Ultralytics ``data/*.yaml``)::

    path: ../datasets/coco128   # dataset root; relative to this file's folder; absent -> folder
    train: images/train2017     # folder (recursive), image file, .txt list, or a list of those
    val: images/val2017
    test:                       # optional
    names: {0: person, 1: bicycle}   # or a list: [person, bicycle]
    nc: 2                       # optional; must equal len(names)

Only ``yaml.safe_load`` is used; ``download`` scripts are never run here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "IMG_EXTENSIONS",
    "SPLITS",
    "DataConfig",
    "DataConfigError",
    "is_image_file",
    "load_data_config",
]

#: Image file extensions recognised in split folders and lists (compared lower-cased).
IMG_EXTENSIONS: frozenset[str] = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"}
)
#: Split keys a dataset YAML may define.
SPLITS: tuple[str, ...] = ("train", "val", "test")


class DataConfigError(ValueError):
    """A dataset YAML is unreadable or inconsistent.

    The message always starts with the YAML path and, where one is at fault, the key:
    ``"/d/coco.yaml: key 'val': folder /d/images/val does not exist"``.
    """


def is_image_file(path: str | Path) -> bool:
    """True when ``path`` has an image extension (case-insensitive, e.g. ``.JPG``)."""
    return Path(path).suffix.lower() in IMG_EXTENSIONS


@dataclass(frozen=True)
class DataConfig:
    """A resolved dataset YAML.

    Attributes:
        yaml_path: absolute path of the YAML file.
        root: absolute dataset root (``path`` key resolved against the YAML's folder).
        train, val, test: sorted, de-duplicated absolute image paths of each split, or
            ``None`` when the key is absent (or empty) in the YAML.
        names: class id -> name, ids exactly ``0..nc-1``.
        nc: number of classes (``len(names)``).
    """

    yaml_path: Path
    root: Path
    train: list[Path] | None
    val: list[Path] | None
    test: list[Path] | None
    names: dict[int, str]
    nc: int

    def split(self, name: str) -> list[Path]:
        """Image files of split ``name`` (``train``/``val``/``test``).

        Raises:
            DataConfigError: unknown split name, or the YAML does not define it.
        """
        if name not in SPLITS:
            raise DataConfigError(f"{self.yaml_path}: unknown split {name!r} (one of {SPLITS})")
        files = getattr(self, name)
        if files is None:
            raise DataConfigError(f"{self.yaml_path}: key {name!r} is not defined")
        return files

    def describe(self, split: str) -> str:
        """``"<yaml>: split 'train'"`` — used in error messages downstream."""
        return f"{self.yaml_path}: split {split!r}"


def load_data_config(path: str | Path) -> DataConfig:
    """Read and resolve a dataset YAML.

    Args:
        path: the YAML file.

    Returns:
        A :class:`DataConfig` with every split expanded to a sorted list of image files.

    Raises:
        DataConfigError: the file is missing or not valid YAML, the top level is not a
            mapping, ``names`` is missing/malformed (ids must be ``0..n-1``), ``nc``
            disagrees with ``names``, or a split entry points to something that does not
            exist or holds no images. The message names the YAML and the key.
    """
    yaml_path = _abspath(Path(path).expanduser())
    if not yaml_path.is_file():
        inside = sorted(yaml_path.glob("*.yaml"))[:3] if yaml_path.is_dir() else []
        raise DataConfigError(f"{yaml_path}: " + (
            "a folder, not a dataset yaml: give its data.yaml (the file with `path`, `train`, "
            "`val` and `names`)" + (f"; it holds {', '.join(p.name for p in inside)}" if inside else "")
            if yaml_path.is_dir() else "dataset yaml does not exist"))
    try:
        doc = yaml.safe_load(yaml_path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise DataConfigError(f"{yaml_path}: not valid YAML: {e}") from e
    if doc is None:
        raise DataConfigError(f"{yaml_path}: the file is empty (expected keys path, train, "
                              "val, names)")
    if not isinstance(doc, dict):
        raise DataConfigError(f"{yaml_path}: top level must be a mapping, got {type(doc).__name__}")

    def err(key: str, msg: str) -> DataConfigError:
        return DataConfigError(f"{yaml_path}: key {key!r}: {msg}")

    root = _resolve_root(doc.get("path"), yaml_path, err)
    names = _parse_names(doc.get("names"), err)
    nc = doc.get("nc")
    if nc is not None:
        if isinstance(nc, bool) or not isinstance(nc, int):
            raise err("nc", f"must be an integer, got {nc!r}")
        if nc != len(names):
            raise err("nc", f"nc={nc} but 'names' has {len(names)} entries")

    splits: dict[str, list[Path] | None] = {}
    for key in SPLITS:
        value = doc.get(key)
        splits[key] = None if value in (None, "", []) else _resolve_split(value, root, key, err)
    return DataConfig(
        yaml_path=yaml_path,
        root=root,
        train=splits["train"],
        val=splits["val"],
        test=splits["test"],
        names=names,
        nc=len(names),
    )


def _resolve_root(value: Any, yaml_path: Path, err: Any) -> Path:
    if value in (None, ""):
        return yaml_path.parent
    if not isinstance(value, str | Path):
        raise err("path", f"must be a string, got {value!r}")
    root = Path(value).expanduser()
    if not root.is_absolute():
        root = yaml_path.parent / root
    root = _abspath(root)
    if not root.is_dir():
        raise err("path", f"{str(value)!r} resolves to {str(root)!r}, which does not exist "
                          f"(a relative 'path' is relative to the yaml's folder {str(yaml_path.parent)!r})")
    return root


def _name_items(value: Any, err: Any) -> list[tuple[int, Any]]:
    """``names`` as sorted ``(class id, name)`` pairs, from a list or an ``{id: name}`` map."""
    if value is None:
        raise err("names", "missing (a list of class names or a {id: name} map)")
    if isinstance(value, list):
        return list(enumerate(value))
    if not isinstance(value, dict):
        raise err("names", f"must be a list or an {{id: name}} map, got {type(value).__name__}")
    items = []
    for k, v in value.items():
        try:
            if isinstance(k, bool) or (isinstance(k, float) and not k.is_integer()):
                raise ValueError
            kid = int(k)
        except (TypeError, ValueError):
            raise err("names", f"class id {k!r} is not an integer") from None
        items.append((kid, v))
    return sorted(items)


def _parse_names(value: Any, err: Any) -> dict[int, str]:
    items = _name_items(value, err)
    if not items:
        raise err("names", "is empty")
    ids = [i for i, _ in items]
    if ids != list(range(len(ids))):
        raise err("names", f"class ids must be 0..{len(ids) - 1} without gaps, got {ids}")
    names: dict[int, str] = {}
    for i, v in items:
        if isinstance(v, bool) or not isinstance(v, str | int | float) or str(v).strip() == "":
            raise err("names", f"name of class {i} must be a non-empty string, got {v!r}")
        names[i] = str(v)
    return names


def _resolve_split(value: Any, root: Path, key: str, err: Any) -> list[Path]:
    entries = value if isinstance(value, list) else [value]
    files: set[Path] = set()
    for entry in entries:
        if not isinstance(entry, str | Path) or str(entry).strip() == "":
            raise err(key, f"entries must be paths, got {entry!r}")
        p = Path(entry).expanduser()
        rule = ("an absolute path" if p.is_absolute() else
                f"relative to 'path:' {str(root)!r} (which defaults to the yaml's folder)")
        p = _abspath(p if p.is_absolute() else root / p)
        where = f"{str(entry)!r} resolves to {str(p)!r} ({rule})"
        if p.is_dir():
            found = _images_in_folder(p)
            if not found:
                raise err(key, f"folder {p} contains no images ({_ext_list()})")
            files.update(found)
        elif p.suffix.lower() == ".txt":
            if not p.is_file():
                raise err(key, f"image list {where}, which does not exist")
            files.update(_images_in_list(p, key, err))
        elif is_image_file(p):
            if not p.is_file():
                raise err(key, f"image {where}, which does not exist")
            files.add(p)
        elif not p.exists():
            raise err(key, f"folder {where}, which does not exist")
        else:
            raise err(key, f"{p} is neither a folder, an image ({_ext_list()}) nor a .txt list")
    return sorted(files)


def _abspath(p: Path) -> Path:
    """Absolute, normalised path WITHOUT resolving symlinks: label paths are derived from
    the image path as the user laid it out (``images/`` -> ``labels/``), not from where a
    symlink points."""
    return Path(os.path.normpath(p.absolute()))


def _images_in_folder(folder: Path) -> list[Path]:
    """Image files under ``folder`` at any depth (symlinked folders followed once)."""
    out: list[Path] = []
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:  # a symlink cycle
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames.sort()
        for name in filenames:
            if is_image_file(name):
                p = Path(dirpath, name)
                if p.is_file():
                    out.append(p)
    return out


def _images_in_list(list_file: Path, key: str, err: Any) -> Iterable[Path]:
    try:
        text = list_file.read_text(encoding="utf-8-sig")  # a byte-order mark is not a path
    except (OSError, UnicodeDecodeError) as e:
        raise err(key, f"cannot read image list {str(list_file)!r}: {e}") from e
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        p = Path(line).expanduser()
        p = _abspath(p if p.is_absolute() else list_file.parent / p)
        where = f"{list_file}:{lineno}"
        if not is_image_file(p):
            raise err(key, f"{where}: {line!r} is not an image file ({_ext_list()})")
        if not p.is_file():
            raise err(key, f"{where}: image {str(p)!r} does not exist (listed as {line!r}; relative "
                           "entries are relative to the list's folder)")
        out.append(p)
    if not out:
        raise err(key, f"image list {list_file} lists no images")
    return out


def _ext_list() -> str:
    return " ".join(sorted(IMG_EXTENSIONS))
