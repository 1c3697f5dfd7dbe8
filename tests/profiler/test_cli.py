"""``libreyolo profile``: one real CPU run, every reader on a moved copy, compare, exit codes."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from libreyolo_core.engine.events import read_events
from libreyolo_core.profiler.cli import aggregate, main
from libreyolo_core.profiler.report import significance

HARNESS = Path(__file__).with_name("js_harness.js")
ARTIFACTS = ("timeline.html", "profile.json", "profile_summary.json", "profile_trace.json.gz")


def test_real_run_writes_the_artifacts(profiled_run):
    for name in ARTIFACTS:
        assert (profiled_run / name).is_file(), name
    p = json.loads((profiled_run / "profile.json").read_text())
    assert p["schema"] == "libreyolo.profile/v1" and p["bound"] in ("dataloader", "compute")
    assert p["bound_why"] and p["device_type"] == "cpu" and p["gpu_util"] is None
    assert p["lever"]["verdict"] == p["bound"] and p["lever"]["why"]  # structured lever
    assert isinstance(p["lever"]["params"], dict) and isinstance(p["lever"]["also"], list)
    assert p["window"]["warmup"] == 2 and p["window"]["real_steps"] == 2
    assert p["config"]["model"] == "YOLOv9-t" and p["config"]["batch"] == 4
    assert p["ops"] and p["categories"] and p["ops_by_phase"]["forward"]
    assert {"dataload", "to_device", "forward", "backward", "optimizer"} <= {
        r["phase"] for r in p["phases"]
    }
    summary = json.loads((profiled_run / "profile_summary.json").read_text())
    assert summary["bound"] == p["bound"] and summary["real"]["step_ms"] == p["step_ms"]
    with gzip.open(profiled_run / "profile_trace.json.gz", "rt") as fh:  # Perfetto opens .json.gz
        trace = json.load(fh)
    assert any(e.get("name", "").startswith("step/forward") for e in trace["traceEvents"])
    events = read_events(profiled_run / "events.jsonl")
    assert [e["lever"] for e in events if e["event"] == "profile"] == [p["lever"]]
    artifacts = {e["path"]: e["kind"] for e in events if e["event"] == "artifact"}
    assert {k: artifacts[k] for k in ARTIFACTS} == {
        "timeline.html": "timeline",
        "profile.json": "profile",
        "profile_summary.json": "profile",
        "profile_trace.json.gz": "trace",
    }
    prof_events = [e for e in events if e["event"] == "profile"]
    assert len(prof_events) == 1 and prof_events[0]["verdict"] == p["bound"]
    assert not (profiled_run / "weights" / "best.pt").exists()


def test_timeline_is_self_contained(profiled_run, tmp_path):
    html = (profiled_run / "timeline.html").read_text()
    assert not re.search(r"https?://", html)
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", html)
    assert "verdict" in html and "CPU ops" in html
    if shutil.which("node"):
        out = subprocess.run(
            ["node", str(HARNESS), str(profiled_run / "timeline.html")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr


def test_readers_on_a_moved_copy(profiled_run, tmp_path, capsys):
    copy = tmp_path / "elsewhere" / "mine.json"
    copy.parent.mkdir()
    shutil.copy(profiled_run / "profile.json", copy)
    p = json.loads(copy.read_text())
    for argv in (
        ["summary"],
        ["phases"],
        ["kernels", "--top", "5"],
        ["ops", "--phase", "backward"],
        ["get"],
        ["get", "step_ms"],
    ):
        assert main([argv[0], str(copy), *argv[1:]]) == 0, argv
        text = capsys.readouterr().out
        assert text.strip(), argv
        assert main([argv[0], str(copy), *argv[1:], "--json"]) == 0, argv
        data = json.loads(capsys.readouterr().out)
        if argv == ["get", "step_ms"]:
            assert data == {"step_ms": p["step_ms"]}
        if argv[0] == "ops":
            assert data["rows"] and len(data["rows"]) <= 20
        if argv[0] == "kernels":
            assert data["kind"] == "ops" and "CPU run" in data["note"] and len(data["rows"]) == 5
    assert main(["summary", str(copy)]) == 0
    assert f"verdict: {p['bound']}" in capsys.readouterr().out
    assert main(["compare", str(copy), str(profiled_run / "profile.json"), "--json"]) == 0
    c = json.loads(capsys.readouterr().out)
    assert c["img_per_s"]["delta"] == 0 and c["significance"]["significant"] is None
    assert "single run" in c["significance"]["reason"]


def test_reader_errors(profiled_run, tmp_path, capsys):
    path = str(profiled_run / "profile.json")
    assert main(["get", path, "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown field 'nope'" in err and "step_ms" in err and "img_per_s" in err
    assert main(["ops", path, "--phase", "nope"]) == 2
    assert "valid phases: dataload" in capsys.readouterr().err
    assert main(["summary", str(tmp_path / "missing.json")]) == 2
    assert main(["kernels", path, "--sort", "bogus"]) == 2


def test_exit_3_when_the_dataset_cannot_fill_the_window(small_yaml, tmp_path, capsys):
    rc = main(
        [
            "run",
            str(small_yaml),
            "--imgsz",
            "64",
            "--batch",
            "4",
            "--workers",
            "0",
            "--warmup",
            "2",
            "--steps",
            "4",
            "--epochs",
            "1",
            "--device",
            "cpu",
            "--project",
            str(tmp_path),
        ]
    )
    assert rc == 3
    err = capsys.readouterr().err
    assert "needs 6 steps" in err and "only has 4" in err
    assert "bigger dataset" in err and "fewer --steps" in err and "smaller --batch" in err
    assert not (tmp_path / "prof" / "profile.json").exists()


def _profile(ips: list[float], bound: str = "compute") -> dict:
    base = {
        "schema": "libreyolo.profile/v1",
        "img_per_s": ips[0],
        "step_ms": 1000 * 4 / ips[0],
        "bound": bound,
        "config": {"batch": 4},
        "dataload_frac": 0.1,
        "gpu_util": None,
        "phases": [],
        "kernels": [],
        "ops": [],
    }
    if len(ips) == 1:
        return base
    return aggregate([{**base, "img_per_s": x, "step_ms": 4000 / x} for x in ips], ["a"] * len(ips))


def test_aggregate_mean_population_std_and_mixed():
    agg = aggregate([_profile([10.0]), _profile([14.0], "dataloader")], ["p1", "p2"])
    assert agg["img_per_s"] == 12.0 and agg["img_per_s_std"] == 2.0 and agg["img_per_s_n"] == 2
    assert agg["bound"] == "mixed" and "mixed" in agg["bound_why"]
    assert agg["metrics"]["img_per_s_std"] == 2.0
    assert agg["aggregation"]["representative_profile"] == "p2"
    assert agg["step_ms"] == pytest.approx((400 + 4000 / 14) / 2, rel=1e-3)
    same = aggregate([_profile([10.0]), _profile([10.0])], ["p1", "p2"])
    assert same["bound"] == "compute" and same["img_per_s_std"] == 0.0


def test_compare_significance():
    a, b = _profile([10.0, 10.2, 9.8]), _profile([12.0, 12.2, 11.8])
    s = significance(a, b)  # SE = sqrt(2 * 0.0267 / 3) = 0.133: delta 2 >> 0.27
    assert s["significant"] is True and s["delta"] == pytest.approx(2.0)
    a, b = _profile([10.0, 11.0, 9.0]), _profile([10.5, 11.5, 9.5])
    s = significance(a, b)  # SE = sqrt(2 * 0.667 / 3) = 0.667: delta 0.5 < 1.33
    assert s["significant"] is False
    s = significance(_profile([10.0]), b)
    assert s["significant"] is None and "single" in s["reason"]


def test_compare_cli_on_repeat_files(tmp_path, capsys):
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(_profile([10.0, 10.2, 9.8])))
    pb.write_text(json.dumps(_profile([12.0, 12.2, 11.8])))
    assert main(["compare", str(pa), str(pb)]) == 0
    out = capsys.readouterr().out
    assert "img/s: significant" in out and "ms_per_image" in out
