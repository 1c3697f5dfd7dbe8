"""Resume: every decision about continuing a run, in one module.

``resume`` continues one run (same weights, optimizer, schedule, classes, run directory);
training a checkpoint's weights on a dataset with other classes is fine-tuning, a new run
started with ``model=<checkpoint>``.

Decision table (:func:`resume_path`; ``resume`` as a config value or a CLI string):

=====================================  ==================================================
``resume``                              checkpoint
=====================================  ==================================================
None, False, ``""``, ``"false"``, ...   none: a new run
True, ``"true"``, ``"1"``, ``"yes"``    the newest ``*/weights/last.pt`` under ``project``
                                        (none there: :class:`CheckpointError`)
a path                                  that file
=====================================  ==================================================

Then :func:`open_resume` loads it (a lean ``best.pt`` has no training state: ValueError),
:meth:`Resume.config` continues with the checkpoint's config (``data``, ``device``,
``workers``, ``epochs`` as given win), :func:`check_resume_classes` refuses another class
count before the dataset is scanned, :attr:`Resume.run_dir` is the run's own directory and
:meth:`~libreyolo_core.engine.state.TrainState.load` restores the state.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libreyolo_core.config import TrainConfig
from libreyolo_core.data.config import DataConfig
from libreyolo_core.engine.checkpoint import CheckpointError, load_checkpoint

__all__ = ["Resume", "resume_path", "open_resume", "load_resume", "latest_last_checkpoint", "check_resume_classes",
           "announce_resume", "warn_ignored"]

#: The keys a resumed run takes from the call rather than the checkpoint, when given:
#: where to find things (a resume on another host has its own cache folder), how long to
#: train, how images are held in memory (the caches change no sample: a run killed
#: for memory resumes with less) and the network's memory layout (it goes with the device,
#: and changes no sample, only float rounding).
CALL_KEYS = ("data", "device", "workers", "epochs", "cache", "cache_recent_mb", "cache_dir",
             "channels_last")

log = logging.getLogger(__name__)


def _names(names: dict[int, str], limit: int = 12) -> str:
    shown = [names[i] for i in sorted(names)][:limit]
    return "[" + ", ".join(shown) + (", ..." if len(names) > limit else "") + "]"


def check_resume_classes(ckpt: dict[str, Any], path: str | Path, data: DataConfig) -> None:
    """Compare a resume checkpoint's classes with the dataset yaml's.

    Args:
        ckpt: the loaded checkpoint (``nc``, ``names``).
        path: its file, for messages.
        data: the loaded dataset yaml (not yet scanned).

    Raises:
        CheckpointError: the class counts differ (the message gives both counts and names
            and says that ``model=<path>`` fine-tunes). Same count, other names: a warning.
    """
    nc, names = int(ckpt["nc"]), {int(k): str(v) for k, v in ckpt["names"].items()}
    if nc != data.nc:
        raise CheckpointError(
            f"{path}: cannot resume on {data.yaml_path}: the checkpoint has nc={nc} {_names(names)}, "
            f"the dataset yaml has nc={data.nc} {_names(data.names)}. resume continues a run with "
            f"its own classes; to train these weights on this dataset, start a new run with "
            f"model={path} (fine-tuning: the head is rebuilt for {data.nc} classes) and no resume")
    if names != data.names:
        changed = [f"{i}: {names[i]!r} -> {data.names[i]!r}" for i in sorted(names) if names[i] != data.names[i]]
        log.warning("%s: resuming with renamed classes (%s%s); the run continues, the new names are used",
                    path, ", ".join(changed[:5]), " ..." if len(changed) > 5 else "")


def latest_last_checkpoint(project: str | Path = "runs/train") -> Path:
    """The most recently modified ``*/weights/last.pt`` under ``project`` (``resume=True``).

    Raises:
        CheckpointError: there is none (exit code 4 in the CLI).
    """
    found = sorted(Path(project).glob("*/weights/last.pt"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise CheckpointError(f"resume=True: no weights/last.pt under {project}/ "
                              "(name the checkpoint: resume=path/to/last.pt)")
    return found[-1]


def resume_path(resume: str | bool | os.PathLike[str] | None, project: str | Path) -> Path | None:
    """The checkpoint ``resume`` names (the module docstring's table), or None.

    Raises:
        CheckpointError: ``resume`` is true and ``project`` holds no ``last.pt``.
    """
    flag = TrainConfig._resume(resume) if resume is not None else False
    if not flag:
        return None
    return latest_last_checkpoint(project) if flag is True else Path(str(flag))


@dataclass(frozen=True)
class Resume:
    """A checkpoint a run continues from: ``path`` and the loaded ``ckpt``."""

    path: Path
    ckpt: dict[str, Any]

    @property
    def run_dir(self) -> Path:
        """The run directory the checkpoint belongs to (``<run>/weights/last.pt``); the
        resumed run writes there again."""
        return self.path.parent.parent

    @property
    def epochs_done(self) -> int:
        """Epochs the checkpoint completed (its ``epoch`` is the 0-based last one)."""
        return int(self.ckpt["epoch"]) + 1

    def config(self, given: TrainConfig) -> TrainConfig:
        """The checkpoint's config, with the :data:`CALL_KEYS` ``given`` set explicitly and
        ``resume`` pointing at this checkpoint."""
        keep = {k: getattr(given, k) for k in CALL_KEYS if k in given.model_fields_set}
        return TrainConfig(**{**self.ckpt["config"], **keep, "resume": str(self.path)})

    def ignored(self, given: TrainConfig) -> list[str]:
        """The keys ``given`` sets to other values than the checkpoint's that a resume does
        not take (every key but :data:`CALL_KEYS`, ``resume`` and where the run is written),
        as ``key=value`` (the checkpoint's value)."""
        saved = TrainConfig(**self.ckpt["config"])
        skip = {*CALL_KEYS, "resume", "project", "name", "exist_ok"}
        return [f"{k}={getattr(saved, k)!r}" for k in sorted(given.model_fields_set - skip)
                if getattr(given, k) != getattr(saved, k)]

    def arch(self, family: Any) -> dict[str, Any]:
        """The head widths the checkpoint was trained with (YOLOv9's class tower), so the
        rebuilt model takes every weight."""
        return family.arch_from_state(self.ckpt.get("train_model", self.ckpt["model"]))


def open_resume(cfg: TrainConfig) -> Resume | None:
    """The :class:`Resume` of ``cfg.resume`` (searched under ``cfg.project``), or None.

    Raises:
        CheckpointError: no such file, not a checkpoint, or no ``last.pt`` to find.
        ValueError: the checkpoint has no training state (a lean or inference one).
    """
    path = resume_path(cfg.resume, cfg.project)
    return None if path is None else load_resume(path)


def load_resume(path: str | Path) -> Resume:
    """Load the checkpoint at ``path`` (once) as the :class:`Resume` a run continues from.

    Raises:
        CheckpointError: no such file or not a checkpoint.
        ValueError: the checkpoint has no training state (a lean or inference one).
    """
    path = Path(path)
    ckpt = load_checkpoint(path)
    if "optimizer" not in ckpt or "epoch" not in ckpt:
        raise ValueError(f"{path}: has no training state to resume (a final/inference checkpoint)")
    return Resume(path, ckpt)


def warn_ignored(ignored: list[str], resume: Resume) -> None:
    """One warning naming the keys of the call a resume did not take
    (:meth:`Resume.ignored`), with what can change and how to change the rest."""
    log.warning("resume continues the run as it was saved, so it keeps the checkpoint's %s (a "
                "resume takes only %s from the call; to change the others start a new run, "
                "or fine-tune with model=%s)", ", ".join(ignored), ", ".join(CALL_KEYS),
                resume.path)


def announce_resume(resume: Resume, *, start_epoch: int, epochs: int, lr: float, step: int,
                    schedule: str, main: bool) -> None:
    """Log where the resumed run continues: the epoch, the learning rate at ``step`` of the
    ``schedule``; a warning when ``epochs`` differs from the checkpoint's (``epochs 4 -> 6``
    and what it does to the schedule), when nothing is left to train, and (rank 0) when
    the file is not ``last.pt`` (the later epochs are trained again)."""
    before = (resume.ckpt.get("config") or {}).get("epochs")
    if isinstance(before, int) and before != epochs and main:
        no_aug = (resume.ckpt.get("config") or {}).get("no_aug_epochs")
        log.warning("epochs %d -> %d (changed on resume): the %s schedule is laid out again over "
                    "%d epochs, so the learning rate continues at %.6g (step %d) and reaches its "
                    "final value at epoch %d instead of %d%s", before, epochs, schedule, epochs, lr,
                    step, epochs, before,
                    f"; the last {no_aug} epochs without mosaic move with the end"
                    if isinstance(no_aug, int) and no_aug else "")
    if start_epoch >= epochs:
        log.warning("%s: the run already finished its %d epochs; nothing to train (pass a larger "
                    "epochs= to train longer)", resume.path, epochs)
    else:
        log.info("resuming %s from epoch %d at lr=%.6g (step %d of the %s schedule)", resume.path,
                 start_epoch + 1, lr, step, schedule)
    if resume.path.name != "last.pt" and main:
        log.warning("resuming from %s (epoch %d), not last.pt: the later epochs of this run are "
                    "trained again and their results.csv rows replaced", resume.path.name, start_epoch)
