"""Parse the ``device`` key into a torch device (docs/architecture.md, Multi-device)."""

from __future__ import annotations

import os

import torch

__all__ = ["DeviceError", "parse_devices", "rank_device", "select_device"]


class DeviceError(ValueError):
    """A ``device`` value that names no usable device."""


def parse_devices(device: str | int | list[int] | None) -> list[str]:
    """Normalise a ``device`` key to a list of torch device strings.

    Accepts ``"auto"``, ``"cpu"``, ``"mps"``, ``0``, ``"0"``, ``"0,1"``, ``[0, 1]``,
    ``"cuda"``, ``"cuda:1"``. ``auto`` is the first CUDA device, else MPS, else CPU.

    Raises:
        DeviceError: an unknown form, or a CUDA index this machine does not have.
    """
    text = _device_text(device)
    if text in ("auto", ""):
        return ["cuda:0" if torch.cuda.is_available() else "mps" if _mps_available() else "cpu"]
    if text == "mps":
        if not _mps_available():
            raise DeviceError("device='mps': Apple's Metal (MPS) is not available on this machine; "
                              "use device=cpu or a CUDA device")
        return [text]
    if text == "cpu":
        return [text]
    if text == "cuda":
        text = "0"
    parts = [p.removeprefix("cuda:") for p in text.split(",") if p]
    if not parts or not all(p.isdigit() for p in parts):
        raise DeviceError(
            f"device={device!r} is invalid: use device=auto, device=cpu, device=mps, a CUDA "
            "index like device=0 or device=cuda:0, or several like device=0,1"
        )
    count = torch.cuda.device_count()
    bad = [p for p in parts if int(p) >= count]
    if bad:
        have = f"indices 0..{count - 1}" if count else "no CUDA device"
        raise DeviceError(f"device={device!r}: CUDA device {bad[0]} does not exist (this machine has {have})")
    return [f"cuda:{p}" for p in parts]


def _device_text(device: str | int | list[int] | None) -> str:
    """A ``device`` value as lower-case text without spaces: ``[0, 1]`` -> ``"0,1"``,
    ``None`` -> ``"auto"``."""
    if device is None:
        return "auto"
    if isinstance(device, list | tuple):
        device = ",".join(str(d) for d in device)
    return str(device).strip().lower().replace(" ", "")


def _mps_available() -> bool:
    """Whether this torch build has Apple's Metal (MPS) backend and it can be used here."""
    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def rank_device(names: list[str], local_rank: int, local_world_size: int) -> str:
    """The CUDA device of one torchrun rank, given the parsed ``device`` list ``names``.

    One name per local process (``device="2,3"`` with ``--nproc_per_node=2``): rank ``i``
    takes the ``i``-th; otherwise (``auto``, one index) ``cuda:LOCAL_RANK``, torchrun's
    convention (restrict GPUs with ``CUDA_VISIBLE_DEVICES``).

    Raises:
        DeviceError: several GPUs named, but not one per local process.
    """
    if len(names) == local_world_size:
        return names[local_rank]
    if len(names) > 1:
        raise DeviceError(
            f"device names {len(names)} GPUs ({','.join(names)}) but torchrun started {local_world_size} "
            "processes on this machine: name one GPU per process, or leave device unset and choose GPUs "
            "with CUDA_VISIBLE_DEVICES"
        )
    return f"cuda:{local_rank}"


def select_device(device: str | int | list[int] | None) -> torch.device:
    """The one device of a single-process run (``cuda:LOCAL_RANK`` under torchrun).

    Raises:
        DeviceError: as :func:`parse_devices`, or several devices (multi-GPU training runs
            one process per device: launch with torchrun).
    """
    local_rank = os.environ.get("LOCAL_RANK")
    devices = parse_devices(device)
    if local_rank is not None and devices[0].startswith("cuda"):
        return torch.device(f"cuda:{int(local_rank)}")
    if len(devices) > 1:
        raise DeviceError(
            f"device={device!r} names {len(devices)} GPUs; multi-GPU training runs one process per "
            f"GPU: `torchrun --nproc_per_node={len(devices)} -m libreyolo_core.cli train ...`"
        )
    return torch.device(devices[0])
