"""The SDK's models agree with the engine's records they mirror (field names and types).

The SDK (``libreyolo_client``) does not import ``libreyolo_core`` (see
``test_client_sdk.py``); this test imports both and compares the pydantic fields:
``Preflight`` <-> :class:`PreflightEvent` (the estimate, ``preflight.json``),
``TuneRow`` <-> :class:`TuneCandidateEvent` and the record's ``TuneRow`` (a row of
``tune.json``), ``TuneReport`` <-> ``TuneRecord`` (``tune.json``), the SDK's ``JobResult``
<-> the record ``JobResult`` (a job's ``result``), ``PreflightActual`` <->
:func:`worker.result.actual_timing` and its record. Each SDK field must exist on the engine's side with
a compatible type (numbers are numbers, an object is a dict, ``Any`` takes anything).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Union

import pytest
from pydantic import BaseModel

from libreyolo_client._models import Preflight, PreflightActual, TuneReport, TuneRow
from libreyolo_client._results import JobResult as SdkJobResult
from libreyolo_client._results import LeverAdvice
from libreyolo_core.profiler.preflight import PreflightEstimate
from libreyolo_core.profiler.record import Lever
from libreyolo_core.records.events import EngineEvent, PreflightEvent, TuneCandidateEvent
from libreyolo_core.records.result import JobResult
from libreyolo_core.records.result import PreflightActual as RecordPreflightActual
from libreyolo_core.records.tune import TuneRecord
from libreyolo_core.records.tune import TuneRow as RecordTuneRow

#: Fields the SDK adds that the engine's record does not carry (the worker adds them).
SDK_ONLY = {Preflight: {"actual"}}


def _kinds(annotation: Any) -> set[str]:
    """The JSON kinds an annotation admits: number, str, bool, object, array, null, any."""
    if annotation is Any:
        return {"any"}
    if annotation is None or annotation is type(None):
        return {"null"}
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return set().union(*(_kinds(a) for a in typing.get_args(annotation)))
    base = origin or annotation
    if base is bool:
        return {"bool"}
    if base in (int, float):
        return {"number"}
    if base is str:
        return {"str"}
    if base in (dict,) or (isinstance(base, type) and issubclass(base, BaseModel)):
        return {"object"}
    if base in (list, tuple):
        return {"array"}
    raise AssertionError(f"no JSON kind for {annotation!r}")


def _fields(model: type[BaseModel]) -> dict[str, set[str]]:
    hints = typing.get_type_hints(model)
    return {name: _kinds(hints[name]) for name in model.model_fields}


@pytest.mark.parametrize(("sdk", "record"), [(Preflight, PreflightEvent),
                                             (TuneRow, TuneCandidateEvent),
                                             (TuneRow, RecordTuneRow),
                                             (TuneReport, TuneRecord),
                                             (SdkJobResult, JobResult),
                                             (LeverAdvice, Lever),
                                             (PreflightActual, RecordPreflightActual)])
def test_sdk_models_agree_with_the_event_records(sdk, record):
    theirs = _fields(record)
    for name, kinds in _fields(sdk).items():
        if name in SDK_ONLY.get(sdk, set()):
            continue
        assert name in theirs, f"{sdk.__name__}.{name}: not a field of {record.__name__}"
        engine = theirs[name]
        if "any" in engine or "any" in kinds:
            continue
        assert engine - {"null"} <= kinds, f"{sdk.__name__}.{name}: {kinds} vs {engine}"


def test_preflight_event_carries_the_whole_estimate():
    estimate = {f.name for f in dataclasses.fields(PreflightEstimate)}
    own = set(PreflightEvent.model_fields) - set(EngineEvent.model_fields)
    assert own == estimate


def test_preflight_actual_agrees_with_the_worker(tmp_path):
    from worker.result import actual_timing

    assert set(PreflightActual.model_fields) == set(actual_timing(tmp_path, None))
