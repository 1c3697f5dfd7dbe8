"""``profile.json`` as a typed record: :class:`ProfileRecord` and its parts.

Written by :func:`~libreyolo_core.profiler.artifacts.build_profile`, read by attribute in
the readers (``report``, ``cli``, ``tune``). Torch-free (pydantic only). Frozen pydantic
models rather than dataclasses: the readers take files written by any version (and
``profile_repeat.json`` aggregates), so parsing must coerce and tolerate absent keys, and
writing must give back exactly the keys read (``to_dict`` leaves out what was never set),
which pydantic does without hand-written ``from_dict`` / ``to_dict`` pairs. Unknown keys
are kept (``extra="allow"``), so a newer file passes through an older reader unchanged.

The JSON shape is flat (headline figures at the top level) and stable: schema
:data:`SCHEMA`. GPU-only figures are ``None`` on a CPU run or without a trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

from libreyolo_core.profiler.confidence import Confidence

__all__ = ["HEADLINE_FIELDS", "SCHEMA", "Lever", "LoadRecord", "PhaseRow", "ProfileHeadline",
           "ProfileRecord", "ProfileWindow", "ordered"]

SCHEMA = "libreyolo.profile/v1"

#: A measured figure: ints stay ints (counts), as the writer gave them.
Number = int | float


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the keys that were set (built or read), nothing added."""
        return self.model_dump(mode="json", exclude_unset=True)


class Lever(_Record):
    """The lever a verdict suggests (:func:`~libreyolo_core.profiler.verdict.lever`).

    Attributes:
        verdict: the verdict it answers. params: training keys and the values to try
            (``{"workers": 8, "cache": "ram"}``; empty when no key helps).
        why: one sentence. also: advice that is no training key.
    """

    verdict: str | None = None
    params: dict[str, Any] = {}
    why: str = ""
    also: list[str] = []


class ProfileWindow(_Record):
    """The measured window, in optimizer steps: ``warmup`` discarded, ``real_steps``
    unsynced (the verdict's figures), ``synced_steps`` (per-phase composition),
    ``steps = real_steps + synced_steps``, ``accumulate``; from the trace,
    ``analysed_steps`` and its ``wall_ms``."""

    warmup: int | None = None
    real_steps: int | None = None
    synced_steps: int | None = None
    steps: int | None = None
    accumulate: int | None = None
    analysed_steps: int | None = None
    wall_ms: Number | None = None


class PhaseRow(_Record):
    """One phase of a step (``dataload``, ``to_device``, ``forward``, ...), per step:
    GPU ms (``None`` without GPU kernels), CPU-op ms, wall ms (synced), kernels, ops."""

    phase: str
    gpu_ms_per_step: Number | None = None
    cpu_ms_per_step: Number | None = None
    wall_ms_per_step: Number | None = None
    kernels_per_step: Number = 0.0
    ops_per_step: Number = 0.0
    unique_kernels: int = 0


class LoadRecord(_Record):
    """The machine's load during the window: the fields of
    :class:`~libreyolo_core.profiler.load.WindowLoad`, and for a repeat aggregate the
    means over trials with ``other_cpu_frac_max`` (the worst trial) and ``trials``."""

    wall_s: Number | None = None
    cpu_count: int | None = None
    loadavg_1m_start: Number | None = None
    loadavg_1m: Number | None = None
    machine_busy_cpu_s: Number | None = None
    own_cpu_s: Number | None = None
    other_cpu_s: Number | None = None
    other_cpu_cores: Number | None = None
    other_cpu_frac: Number | None = None
    source: str | None = None
    other_cpu_frac_max: Number | None = None
    trials: list[dict[str, Any] | None] | None = None


class ProfileHeadline(_Record):
    """A profile's verdict and the headline figures it is read with: the fields
    ``profile.json`` (:class:`ProfileRecord`) and the ``profile`` event
    (:class:`~libreyolo_core.records.events.ProfileEvent`) share, same names and units.

    Attributes:
        verdict: one of :data:`~libreyolo_core.profiler.verdict.VERDICTS` (or ``mixed``
            for a repeat aggregate whose trials disagree); ``profile.json`` writes it
            under its older key ``bound``. bound_why: the sentence that decided it.
        lever: the lever it suggests, as data.
        step_ms ... memory_pressure: the unsynced steps' headline figures, milliseconds
            per optimizer step unless the name says otherwise, fractions in [0, 1];
            GPU-only figures are ``None`` on a CPU run or without a trace.
        confidence: how sure the verdict is (``None``: a profile rebuilt from a bare
            trace, or written before it was recorded).
    """

    verdict: str | None = None
    bound_why: str | None = None
    lever: Lever | None = None
    step_ms: Number | None = None
    img_per_s: Number | None = None
    dataload_ms: Number | None = None
    dataload_frac: Number | None = None
    gpu_util: Number | None = None
    gpu_util_raw: Number | None = None
    gpu_busy_ms_per_step: Number | None = None
    host_overhead_ms_per_step: Number | None = None
    kernels_per_step: Number | None = None
    ops_per_step: Number | None = None
    cuda_mallocs_per_step: Number | None = None
    peak_vram_mb: Number | None = None
    memory_pressure: bool | None = None
    confidence: Confidence | None = None

    @field_validator("confidence", mode="before")
    @classmethod
    def _confidence(cls, v: Any) -> Any:
        return Confidence.from_dict(v) if isinstance(v, Mapping) or v is None else v

    @field_serializer("confidence")
    def _confidence_json(self, c: Confidence | None) -> dict[str, Any] | None:
        return c.to_dict() if c is not None else None


#: The headline fields (:class:`ProfileHeadline`), in their order.
HEADLINE_FIELDS = tuple(ProfileHeadline.model_fields)


def ordered(d: dict[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    """``d`` with the keys of ``order`` first, in that order, then the rest as they come:
    a record's JSON keeps the key order its file always had, whichever base class declares
    a field."""
    return {**{k: d[k] for k in order if k in d}, **{k: v for k, v in d.items() if k not in order}}


class ProfileRecord(ProfileHeadline):
    """``profile.json`` (and ``profile_repeat.json``): everything the readers need.

    Times are milliseconds per optimizer step unless the name says otherwise; fractions are
    in [0, 1]. ``config`` is the run's environment as the trainer gave it (model, device,
    batch, imgsz, amp, workers, ...). ``confidence`` and ``load`` are ``None`` for a profile
    rebuilt from a bare trace. ``kernels``/``ops``/``categories`` rows and ``steps`` are the
    trace analysis tables (:mod:`~libreyolo_core.profiler.analysis`). ``metrics`` is the
    flat map ``libreyolo profile get`` lists. The ``img_per_s_*``, ``trial_verdicts`` and
    ``aggregation`` fields belong to a repeat aggregate only.

    The verdict is ``verdict`` here as everywhere else; the file keeps its older keys
    ``bound`` and ``trial_bounds`` (read and written), so every ``profile.json`` written
    so far reads unchanged.
    """

    schema_: str = Field(SCHEMA, alias="schema")
    trace: str | None = None
    trace_error: str | None = None
    model: str | None = None
    config: dict[str, Any] = {}
    device_type: str | None = None
    verdict: str | None = Field(None, alias="bound")
    load: LoadRecord | None = None
    levers: str | None = None
    memory_pressure: bool = False
    # headline figures besides the shared ones
    compute_ms: Number | None = None
    utilisation: str | None = None
    launches_per_step: Number | None = None
    mean_kernel_us: Number | None = None
    unique_kernels: Number | None = None
    memcpy_ms_per_step: Number | None = None
    tensorcore_pct: Number | None = None
    cpu_ops_ms_per_step: Number | None = None
    # window and breakdowns
    window: ProfileWindow = ProfileWindow()
    composition_ms: dict[str, Number] = {}
    composition_total_ms: Number | None = None
    categories: list[dict[str, Any]] = []
    phases: list[PhaseRow] = []
    phases_gpu: dict[str, Number | None] = {}
    kernels_by_phase: dict[str, list[dict[str, Any]]] = {}
    ops_by_phase: dict[str, list[dict[str, Any]]] = {}
    top_kernels: list[dict[str, Any]] = []
    kernels: list[dict[str, Any]] = []
    ops: list[dict[str, Any]] = []
    notes: list[str] = []
    steps: list[dict[str, Any]] = []
    metrics: dict[str, Any] = {}
    # repeat aggregates (profile_repeat.json)
    img_per_s_std: Number | None = None
    img_per_s_n: int | None = None
    img_per_s_trials: list[Number] | None = None
    trial_verdicts: list[str | None] | None = Field(None, alias="trial_bounds")
    aggregation: dict[str, Any] | None = None

    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)

    #: The file's keys in the order ``profile.json`` has always had them.
    KEY_ORDER: ClassVar[tuple[str, ...]] = (
        "schema", "trace", "trace_error", "model", "config", "device_type", "bound",
        "bound_why", "confidence", "load", "levers", "lever", "step_ms", "img_per_s",
        "dataload_ms", "dataload_frac", "compute_ms", "gpu_util", "gpu_util_raw",
        "utilisation", "memory_pressure", "cuda_mallocs_per_step", "host_overhead_ms_per_step",
        "launches_per_step", "gpu_busy_ms_per_step", "mean_kernel_us", "kernels_per_step",
        "unique_kernels", "memcpy_ms_per_step", "tensorcore_pct", "peak_vram_mb",
        "cpu_ops_ms_per_step", "ops_per_step", "window", "composition_ms",
        "composition_total_ms", "categories", "phases", "phases_gpu", "kernels_by_phase",
        "ops_by_phase", "top_kernels", "kernels", "ops", "notes", "steps", "metrics",
        "img_per_s_std", "img_per_s_n", "img_per_s_trials", "trial_bounds", "aggregation")

    @property
    def bound(self) -> str | None:
        """The verdict under the file's older name (readers not yet switched to
        :attr:`verdict`)."""
        return self.verdict

    @classmethod
    def of(cls, data: ProfileRecord | Mapping[str, Any]) -> ProfileRecord:
        """``data`` as a record: a record as is, a mapping (a file's JSON) parsed.

        Raises:
            pydantic.ValidationError: a value of the wrong type (a ``ValueError``).
        """
        if isinstance(data, ProfileRecord):
            return data
        return cls.model_validate(dict(data))

    def to_dict(self) -> dict[str, Any]:
        """The ``profile.json`` form: the keys that were set, ``schema`` first."""
        return ordered(self.model_dump(mode="json", exclude_unset=True, by_alias=True),
                       self.KEY_ORDER)
