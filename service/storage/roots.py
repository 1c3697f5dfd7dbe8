"""The one containment rule of dataset paths: what a user's dataset may read.

:meth:`ReadRule.refusal` decides, for one path after its symlinks are resolved, whether a
user's dataset may read it; :func:`check_dataset` applies it to everything a dataset yaml
makes the engine read: the yaml itself, ``path:``, every split entry (folder, image or
``.txt`` list), every list entry, and every image and label file the splits expand to
(a symlink inside an allowed folder cannot lead out). Every reader calls
:func:`check_dataset`: the upload (its own folder only), ``/v1/datasets/register``, a
job's ``data`` at submit (a path, or a dataset id: a registered yaml may have changed since)
and the worker again before it starts the engine.

The rule: never the service's own folders (``home``: the database and credentials; the
artifact, model and cache roots; the upload root, except an upload's own folder for its
own yaml) and never a folder that holds one of them (walking it would reach them); under
``Settings.dataset_roots`` when set. Another user's upload is therefore reachable by no
path; uploads are used by their id. Refusals never name the service's folders.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

__all__ = ["PathRefused", "ReadRule", "check_dataset", "data_refusal", "public_data",
           "public_model", "public_text"]


class PathRefused(ValueError):
    """A dataset names a path its user may not read; the message names the key (and the
    ``.txt`` list line) and the value as the user wrote it."""


def _real(path: str | Path) -> Path:
    return Path(os.path.realpath(path))


class ReadRule:
    """What one dataset may read (see the module docstring).

    Args:
        settings: the service's :class:`~service.settings.Settings` (its folders and
            ``dataset_roots``).
        inside: an upload's own folder: then every path must resolve inside it (and the
            dataset roots do not apply).
    """

    def __init__(self, settings: Any, inside: Path | None = None):
        self.inside = None if inside is None else _real(inside)
        home = _real(settings.home)
        self.uploads = _real(settings.upload_root)
        self.state = [home, *(_real(p) for p in (settings.artifact_root, settings.model_root,
                                                  settings.cache_root,
                                                  settings.upload_root))]
        self.roots = [_real(r) for r in settings.dataset_roots]

    def refusal(self, path: str | Path, *, walked: bool = False) -> str | None:
        """Why a dataset may not read ``path`` (symlinks resolved first), or None when it may.

        Args:
            path: the path as the dataset names it.
            walked: the path is a folder the engine walks (a split folder): it must not
                hold one of the service's folders either.
        """
        if "\0" in str(path):
            return f"{str(path)[:200]!r} contains a NUL byte"
        real = _real(path)
        if self.inside is not None:
            if real.is_relative_to(self.inside):
                return None
            return (f"{str(path)!r} leads outside the uploaded dataset; split paths of an "
                    "upload must stay inside its own folder")
        for folder in self.state:
            if real.is_relative_to(folder):
                return (f"{str(path)!r} lies in the service's own storage; use an uploaded "
                        "dataset by its id")
            if walked and folder.is_relative_to(real):
                return (f"{str(path)!r} holds the service's own storage; name the dataset's "
                        "own folders")
        if self.roots and not any(real.is_relative_to(r) for r in self.roots):
            return (f"{str(path)!r} is not under the configured dataset roots "
                    f"({', '.join(str(r) for r in self.roots)}; setting dataset_roots / "
                    "LIBREYOLO_DATASET_ROOTS)")
        return None

    @classmethod
    def for_yaml(cls, settings: Any, yaml_path: str | Path) -> ReadRule:
        """The rule of the dataset yaml ``yaml_path`` as the service stored it: an upload's
        yaml (in the upload root) reads its own folder ``<upload root>/<dataset id>``
        only; any other yaml follows the general rule."""
        real = _real(yaml_path)
        uploads = _real(settings.upload_root)
        if real.is_relative_to(uploads) and len(real.relative_to(uploads).parts) > 1:
            return cls(settings, inside=uploads / real.relative_to(uploads).parts[0])
        return cls(settings)


def _count_nodes(obj: Any, budget: int) -> int:
    """Values in ``obj`` (shared/aliased values counted at every use); stops past ``budget``."""
    count, stack = 0, [obj]
    while stack:
        item = stack.pop()
        count += 1
        if count > budget:
            return count
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def _load_bounded(yaml_path: Path, max_bytes: int, max_nodes: int) -> Any:
    name = yaml_path.name
    size = yaml_path.stat().st_size
    if size > max_bytes:
        raise PathRefused(f"{name}: {size} bytes, more than the limit of {max_bytes} (max_yaml_bytes)")
    try:
        doc = yaml.safe_load(yaml_path.read_text(encoding="utf-8-sig"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise PathRefused(f"{name}: not valid YAML ({exc})") from None
    if _count_nodes(doc, max_nodes) > max_nodes:
        raise PathRefused(f"{name}: more than {max_nodes} values once its aliases are expanded")
    return doc


def check_dataset(yaml_path: str | Path, rule: ReadRule, *, max_yaml_bytes: int = 1 << 20,
                  max_yaml_nodes: int = 100_000, deep: bool = True) -> None:
    """Apply ``rule`` to every path the dataset yaml ``yaml_path`` makes the engine read.

    Follows the engine's rules (``libreyolo_core.data.config``): ``path`` relative to the
    yaml's folder, splits relative to ``path``, ``.txt`` list entries relative to the
    list's folder. With ``deep`` (and a yaml the engine's loader accepts), every image the
    splits expand to and its label file are checked too, so a symlink inside an allowed
    folder cannot lead out. A yaml the loader refuses is left to the engine's own error.

    Raises:
        PathRefused: the yaml is too big (``max_yaml_bytes``) or has too many values (an
            alias bomb), or a path it names (or reaches) is refused (the message names the
            key and the value).
    """
    yaml_path = Path(yaml_path)
    name = yaml_path.name
    refusal = rule.refusal(yaml_path)
    if refusal is not None:
        raise PathRefused(refusal)
    doc = _load_bounded(yaml_path, max_yaml_bytes, max_yaml_nodes)
    if not isinstance(doc, dict):
        return  # the engine's loader reports the shape error
    base = yaml_path.parent
    value = doc.get("path")
    if value not in (None, "") and isinstance(value, str | Path):
        given = Path(str(value)).expanduser()  # the engine expands ~ too
        base = given if given.is_absolute() else yaml_path.parent / given
        if (refusal := rule.refusal(base)) is not None:
            raise PathRefused(f"{name}: key 'path': {refusal}")
    for key in ("train", "val", "test"):
        _check_split(doc.get(key), base, rule, name, key, max_yaml_bytes * 64)
    if deep:
        _check_files(yaml_path, rule, name)


def _check_split(entries: Any, base: Path, rule: ReadRule, name: str, key: str,
                 max_list_bytes: int) -> None:
    """Apply ``rule`` to the split ``key``'s entries (a path or a list of them, relative
    to ``base``) and to the entries of a ``.txt`` list file among them (at most
    ``max_list_bytes``)."""
    for entry in entries if isinstance(entries, list) else [entries]:
        if entry in (None, "") or not isinstance(entry, str):
            continue
        given = Path(entry).expanduser()
        target = given if given.is_absolute() else base / given
        if (refusal := rule.refusal(target, walked=True)) is not None:
            raise PathRefused(f"{name}: key {key!r}: {refusal.replace(str(target), entry)}")
        if target.suffix.lower() == ".txt" and target.is_file():
            _check_list(target, rule, name, key, max_list_bytes)


def _check_list(list_file: Path, rule: ReadRule, name: str, key: str, max_bytes: int) -> None:
    if list_file.stat().st_size > max_bytes:
        raise PathRefused(f"{name}: key {key!r}: {list_file.name}: more than {max_bytes} bytes")
    text = list_file.read_text(encoding="utf-8-sig", errors="replace")
    for lineno, line in enumerate(text.splitlines(), 1):
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        given = Path(entry).expanduser()
        target = given if given.is_absolute() else list_file.parent / given
        if (refusal := rule.refusal(target)) is not None:
            raise PathRefused(f"{name}: key {key!r}: {list_file.name}:{lineno}: "
                              f"{refusal.replace(str(target), entry)}")


def _check_files(yaml_path: Path, rule: ReadRule, name: str) -> None:
    """Every image of every split and its label file (one ``lstat`` per file, one
    ``realpath`` per folder and per symlink)."""
    from libreyolo_core.data.config import DataConfigError, load_data_config
    from libreyolo_core.data.labels import label_path_for

    try:
        dc = load_data_config(yaml_path)
    except (DataConfigError, OSError):
        return
    folders: dict[str, str | None] = {}

    def check(files: Iterable[Path], key: str) -> None:
        for f in files:
            parent = str(f.parent)
            if parent not in folders:
                folders[parent] = rule.refusal(parent)
            refusal = folders[parent]
            if refusal is None and os.path.islink(f):
                refusal = rule.refusal(f)
            if refusal is not None:
                raise PathRefused(f"{name}: key {key!r}: {f.name}: {refusal}")

    for key in ("train", "val", "test"):
        images = getattr(dc, key) or []
        check(images, key)
        check((lb for im in images if os.path.lexists(lb := label_path_for(im))), key)


def data_refusal(data: str, settings: Any) -> str | None:
    """Why the worker must not start a job whose stored ``data`` is this yaml path (its
    dataset reads a refused path, see :func:`check_dataset`), or None. A yaml the worker
    cannot see is left to the engine's own error."""
    if not os.path.isfile(data):
        return None
    try:
        check_dataset(data, ReadRule.for_yaml(settings, data),
                      max_yaml_bytes=getattr(settings, "max_yaml_bytes", 1 << 20))
    except PathRefused as exc:
        return f"data: {exc}"
    except OSError as exc:
        return f"data: cannot read the dataset ({exc.strerror or exc})"
    return None


def public_data(data: str, settings: Any) -> str:
    """A job's ``data`` as its user sees it: ``dataset:<id>`` for an upload (never the
    service's folder), else :func:`public_text` of the path (a registered yaml is the
    user's own path)."""
    uploads = f"{settings.upload_root}{os.sep}"
    if data.startswith(uploads):
        return f"dataset:{data[len(uploads):].split(os.sep, 1)[0]}"
    return public_text(data, settings)


def public_model(model: str, settings: Any) -> str:
    """A job's stored ``model`` as its user sees it (and may submit again): a registered
    model's file ``<model root>/<id>.pt`` -> ``<id>``, a checkpoint of a job ->
    ``job:<job id>/<path>``, a name as it is."""
    folder = f"{settings.model_root}{os.sep}"
    if model.startswith(folder) and os.sep not in model[len(folder):]:
        return Path(model).stem
    return public_text(model, settings)


def public_text(text: str, settings: Any) -> str:
    """``text`` (a log line, an error, a path) with the service's own folders named as the
    API names their contents: ``<upload root>/<id>/`` -> ``dataset:<id>/``, ``<artifact
    root>/<job id>/run/`` -> ``job:<job id>/``, the model and cache roots -> ``model:`` and
    ``cache:``, anything else under ``home`` -> ``service:``."""
    pairs = sorted([(str(settings.upload_root), "dataset:"), (str(settings.artifact_root), "job:"),
                    (str(settings.model_root), "model:"), (str(settings.cache_root), "cache:"),
                    (os.path.realpath(settings.home), "service:")], key=lambda p: -len(p[0]))
    if not any(folder in text for folder, _ in pairs):
        return text
    sep = re.escape(os.sep)
    text = re.sub(f"{re.escape(str(settings.artifact_root))}{sep}([^{sep}\\s]+){sep}run{sep}",
                  r"job:\1/", text)
    for folder, name in pairs:
        text = text.replace(f"{folder}{os.sep}", name).replace(folder, name.rstrip(":"))
    return text
