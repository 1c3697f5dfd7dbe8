"""How busy the machine was while a profile window ran (what the OS tells us).

Two readings frame the measured steps (:func:`snapshot` at the start and at the end);
:func:`window_load` turns them into a :class:`WindowLoad`:

- the load average (``os.getloadavg``: runnable + uninterruptible tasks, averaged over 1
  minute by the kernel; it counts this run's own processes too, so it is reported, not
  judged on);
- the CPU time the whole machine spent busy (``psutil.cpu_times()``: on Linux the first
  line of ``/proc/stat``, busy = everything but ``idle`` and ``iowait``) minus the CPU time
  of this process tree (this process, its live children such as data-loader workers, and
  the children it already reaped; ``psutil.Process.cpu_times``). What is left was taken by
  **other processes**: a competitor for the cores the loader workers and the host side of
  the step need.

Where the platform gives no reading (no ``getloadavg`` on Windows, a psutil error), the
field is ``None`` and ``source`` says what was missing; nothing here ever raises.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["LoadSnapshot", "WindowLoad", "snapshot", "window_load", "mean_load"]


@dataclass(frozen=True)
class LoadSnapshot:
    """One reading. Times in seconds; ``None`` where the OS gave nothing.

    Attributes:
        wall: ``time.monotonic()``. loadavg_1m: 1-minute load average.
        machine_busy_s: CPU seconds every core of the machine spent busy since boot.
        own_cpu_s: user + system CPU seconds of this process tree so far.
    """

    wall: float
    loadavg_1m: float | None
    machine_busy_s: float | None
    own_cpu_s: float | None


def _machine_busy_s() -> float | None:
    try:
        import psutil

        t = psutil.cpu_times()
    except Exception:  # noqa: BLE001 - no reading on this platform
        return None
    idle = t.idle + getattr(t, "iowait", 0.0)
    total = sum(getattr(t, f) for f in t._fields if f not in ("guest", "guest_nice"))
    return max(total - idle, 0.0)


def _own_cpu_s() -> float | None:
    try:
        import psutil

        me = psutil.Process()
        t = me.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for child in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                c = child.cpu_times()
                total += c.user + c.system
        return total
    except Exception:  # noqa: BLE001
        return None


def snapshot() -> LoadSnapshot:
    """Read the load average, the machine's busy CPU time and this process tree's CPU time."""
    try:
        load = float(os.getloadavg()[0])
    except (AttributeError, OSError):
        load = None
    return LoadSnapshot(time.monotonic(), load, _machine_busy_s(), _own_cpu_s())


@dataclass(frozen=True)
class WindowLoad:
    """The machine's load over one window (all CPU figures in seconds or cores).

    Attributes:
        wall_s: length of the window. cpu_count: logical cores of the machine.
        loadavg_1m_start, loadavg_1m: the 1-minute load average at the start and the end.
        machine_busy_cpu_s: CPU time all cores spent busy during the window.
        own_cpu_s: CPU time of this process tree during the window.
        other_cpu_s: ``machine_busy_cpu_s - own_cpu_s`` (clamped at 0): other processes.
        other_cpu_cores: ``other_cpu_s / wall_s``: cores other processes kept busy on average.
        other_cpu_frac: ``other_cpu_cores / cpu_count``: their share of the whole machine.
        source: where the figures came from, or what was missing.
    """

    wall_s: float
    cpu_count: int
    loadavg_1m_start: float | None
    loadavg_1m: float | None
    machine_busy_cpu_s: float | None
    own_cpu_s: float | None
    other_cpu_s: float | None
    other_cpu_cores: float | None
    other_cpu_frac: float | None
    source: str

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (the ``load`` object of ``profile.json``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> WindowLoad | None:
        """Back from :meth:`to_dict` (``None`` for a missing or foreign object)."""
        if not isinstance(d, dict):
            return None
        try:
            fields: dict[str, Any] = {f: d.get(f) for f in cls.__dataclass_fields__}
            return cls(**fields)
        except TypeError:
            return None


def window_load(start: LoadSnapshot, end: LoadSnapshot) -> WindowLoad:
    """The load between two :func:`snapshot` readings (see the module docstring)."""
    try:
        import psutil

        cores = int(psutil.cpu_count() or os.cpu_count() or 1)
    except Exception:  # noqa: BLE001
        cores = int(os.cpu_count() or 1)
    wall = max(end.wall - start.wall, 1e-9)
    busy = own = other = cores_used = frac = None
    missing = []
    if start.machine_busy_s is not None and end.machine_busy_s is not None:
        busy = max(end.machine_busy_s - start.machine_busy_s, 0.0)
    else:
        missing.append("machine CPU time")
    if start.own_cpu_s is not None and end.own_cpu_s is not None:
        own = max(end.own_cpu_s - start.own_cpu_s, 0.0)
    else:
        missing.append("own CPU time")
    if busy is not None and own is not None:
        other = max(busy - own, 0.0)
        cores_used = other / wall
        frac = cores_used / cores
    if start.loadavg_1m is None:
        missing.append("load average")
    source = "os.getloadavg, psutil (/proc/stat on Linux)"
    if missing:
        source += "; unavailable: " + ", ".join(missing)

    def r(x: float | None, nd: int = 3) -> float | None:
        return None if x is None else round(float(x), nd)

    return WindowLoad(
        wall_s=round(wall, 3), cpu_count=cores, loadavg_1m_start=r(start.loadavg_1m, 2),
        loadavg_1m=r(end.loadavg_1m, 2), machine_busy_cpu_s=r(busy), own_cpu_s=r(own),
        other_cpu_s=r(other), other_cpu_cores=r(cores_used), other_cpu_frac=r(frac, 4),
        source=source,
    )


def mean_load(loads: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The load of ``--repeat`` trials: each numeric :class:`WindowLoad` field averaged over
    the trials that recorded it, plus ``other_cpu_frac_max`` (the worst trial) and
    ``trials`` (each trial's own ``load``). ``None`` when no trial recorded one."""
    known = [d for d in loads if isinstance(d, dict)]
    if not known:
        return None
    out: dict[str, Any] = {}
    for f in WindowLoad.__dataclass_fields__:
        vals = [d[f] for d in known if isinstance(d.get(f), int | float)]
        out[f] = round(sum(vals) / len(vals), 4) if vals else None
    out["cpu_count"] = known[-1].get("cpu_count")
    out["source"] = known[-1].get("source")
    fracs = [d["other_cpu_frac"] for d in known if d.get("other_cpu_frac") is not None]
    out["other_cpu_frac_max"] = max(fracs) if fracs else None
    out["trials"] = list(loads)
    return out
