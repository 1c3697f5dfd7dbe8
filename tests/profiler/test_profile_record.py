"""``profile.json`` as a record: the writer fills exactly the declared fields, files round-trip
unchanged, the readers stay torch-free, and the SDK's models agree with the record without
the SDK importing the engine."""

from __future__ import annotations

import json
import subprocess
import sys
import typing

import pytest

from libreyolo_core.profiler.artifacts import build_profile
from libreyolo_core.profiler.load import WindowLoad
from libreyolo_core.profiler.record import SCHEMA, LoadRecord, ProfileRecord

REAL = {"step_ms": 10.0, "dataload_ms": 4.0, "dataload_frac": 0.4, "compute_ms": 6.0, "img_per_s": 800.0}
LOAD = WindowLoad(wall_s=1.0, cpu_count=2, loadavg_1m_start=1.0, loadavg_1m=1.2, machine_busy_cpu_s=1.5,
                  own_cpu_s=1.0, other_cpu_s=0.5, other_cpu_cores=0.5, other_cpu_frac=0.25, source="test")
#: fields only a repeat aggregate (profile_repeat.json) sets
AGGREGATE_ONLY = {"img_per_s_std", "img_per_s_n", "img_per_s_trials", "trial_bounds", "aggregation"}


def _cpu_profile() -> ProfileRecord:
    return build_profile(meta={"model": "YOLOv9-t", "batch": 8, "device": "cpu"},
                         window={"warmup": 1, "real_steps": 3, "synced_steps": 2},
                         real=REAL, composition_ms={"forward": 3.0, "backward": 2.0}, analysis=None,
                         device_type="cpu", steps=[{"index": 0, "kind": "unsynced"}],
                         spread=([10.0, 10.2, 9.8], [4.0, 4.1, 3.9]), load=LOAD)


def test_writer_sets_every_declared_field_and_nothing_else():
    p = _cpu_profile()
    assert p.model_extra == {}
    declared = {f.alias or name for name, f in ProfileRecord.model_fields.items()}
    assert set(p.to_dict()) == declared - AGGREGATE_ONLY
    assert p.to_dict()["schema"] == SCHEMA and list(p.to_dict())[0] == "schema"
    # GPU-only figures are None on a CPU run
    assert p.gpu_util is None and p.mean_kernel_us is None and p.kernels == [] and p.phases_gpu == {}
    assert set(LoadRecord.model_fields) >= set(WindowLoad.__dataclass_fields__)


def test_a_file_round_trips_unchanged_including_unknown_keys():
    d = json.loads(json.dumps(_cpu_profile().to_dict()))
    assert ProfileRecord.of(d).to_dict() == d
    newer = {**d, "from_a_newer_version": 1}
    assert ProfileRecord.of(newer).to_dict() == newer
    old = {"schema": SCHEMA, "img_per_s": 3.0, "bound": "compute"}  # written before confidence
    back = ProfileRecord.of(old)
    assert back.confidence is None and back.load is None and back.to_dict() == old


def test_record_and_readers_import_without_torch():
    code = ("import sys; import libreyolo_core.profiler.record, libreyolo_core.profiler.report, "
            "libreyolo_core.profiler.cli; sys.exit(1 if 'torch' in sys.modules else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr or "torch was imported"


def test_sdk_imports_without_the_engine():
    code = ("import sys; import libreyolo_client; "
            "sys.exit(1 if {'libreyolo_core', 'torch'} & set(sys.modules) else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr or "the SDK imported the engine"


#: SDK field -> the ProfileRecord field it carries (a tune row is a repeat aggregate's figures)
SDK_TO_RECORD = {"img_per_s": "img_per_s", "img_per_s_std": "img_per_s_std", "n": "img_per_s_n",
                 "step_ms": "step_ms", "verdict": "verdict"}


def _kinds(annotation) -> set[type]:
    args = typing.get_args(annotation) or (annotation,)
    kinds = set()
    for a in args:
        kinds |= set(typing.get_args(a)) if typing.get_args(a) else {a}
    return {float if k is int else k for k in kinds}


@pytest.mark.parametrize("sdk_field", sorted(SDK_TO_RECORD))
def test_sdk_models_agree_with_the_record(sdk_field):
    from libreyolo_client._models import TuneRow

    record_field = SDK_TO_RECORD[sdk_field]
    assert sdk_field in TuneRow.model_fields and record_field in ProfileRecord.model_fields
    sdk = _kinds(TuneRow.model_fields[sdk_field].annotation)
    ours = _kinds(ProfileRecord.model_fields[record_field].annotation)
    assert ours <= sdk, (sdk_field, ours, sdk)
