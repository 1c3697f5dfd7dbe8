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
    # the tiny set fits the default store of recently decoded images: the window, in the
    # first epoch while it fills, says that later epochs wait less for data
    assert p["config"]["cache_recent_fits"] is True
    assert any("store of recently decoded images" in n for n in p["notes"])
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
    assert [e.lever.to_dict() for e in events if e.event == "profile"] == [p["lever"]]
    artifacts = {e.path: e.kind for e in events if e.event == "artifact"}
    assert {k: artifacts[k] for k in ARTIFACTS} == {
        "timeline.html": "timeline",
        "profile.json": "profile",
        "profile_summary.json": "profile",
        "profile_trace.json.gz": "trace",
    }
    prof_events = [e for e in events if e.event == "profile"]
    assert len(prof_events) == 1 and prof_events[0].verdict == p["bound"]
    assert prof_events[0].confidence.to_dict() == p["confidence"]
    # a profile-only run reports the window (step k of 2 + 4), never "epoch 1/11"
    progress = [e for e in events if e.event == "progress"]
    assert progress and all(e.phase == "profiling" and not e.has("epoch") for e in progress)
    assert {(e.steps, e.warmup, e.measured) for e in progress} == {(6, 2, 4)}
    assert progress[0].step == 1 and progress[-1].step == 6
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


@pytest.fixture
def two_images(tmp_path):
    from libreyolo_core.data.sample import generate_sample_dataset

    return generate_sample_dataset(tmp_path / "two", n_train=2, n_val=1, imgsz=64, seed=3)


def test_exit_3_when_the_first_epoch_cannot_hold_the_window(two_images, tmp_path, capsys):
    """2 images at batch 4 with the default window (5 + 20): one epoch has 1 step. Before,
    the window was filled across 25 epoch boundaries; now it stays inside one epoch."""
    rc = main(["run", str(two_images), "--imgsz", "64", "--batch", "4", "--workers", "0",
               "--device", "cpu", "--project", str(tmp_path)])
    assert rc == 3
    err = capsys.readouterr().err
    assert "needs 25 steps (5 warm-up + 20 measured)" in err
    assert "one epoch of 2 images at batch 4 has 1" in err
    # the three ways out, with numbers
    assert "(1) fewer steps cannot help at batch 4: one epoch has 1 step" in err
    assert "(2) a smaller batch: --batch 1 (batch=1) gives 2 steps per epoch, where the " \
           "window is fitted to 0 + 2 steps" in err
    assert "(3) a bigger dataset: at least 8 training images at batch 4 for a fitted window, " \
           "100 for the whole 25-step one (this one has 2)" in err
    assert "Traceback" not in err
    assert not (tmp_path / "prof" / "profile.json").exists()


def test_a_small_set_fits_the_window_and_says_so(tmp_path, capsys):
    """#28.3: 6 images at batch 2 (3 steps per epoch) with the default window 5 + 20: the
    window is fitted (0 + 3), one line says so, the verdict is flagged short; exit 0."""
    from libreyolo_core.data.sample import generate_sample_dataset

    data = generate_sample_dataset(tmp_path / "six", n_train=6, n_val=1, imgsz=64, seed=3)
    rc = main(["run", str(data), "--imgsz", "64", "--batch", "2", "--workers", "0",
               "--device", "cpu", "--project", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 0, err[-3000:]
    p = json.loads(next(tmp_path.rglob("profile.json")).read_text())
    assert "fitted into the first epoch: warmup 0 + 3 measured steps (asked 5 + 20" in \
        p["config"]["window_fitted"]
    assert "short_window" in p["confidence"]["flags"] and not p["confidence"]["reliable"]
    assert "UNRELIABLE" in out


def test_profile_job_spec_exits_3_too(two_images, tmp_path, capsys):
    """A profile job (``libreyolo train spec=job.json`` with kind profile) gets the same."""
    from libreyolo_core.cli import run

    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"kind": "profile", "model": "yolo9-t", "data": str(two_images),
                                "project": str(tmp_path), "name": "job",
                                "params": {"imgsz": 64, "batch": 4, "workers": 0,
                                           "device": "cpu"}}))
    assert run(["train", f"spec={spec}"]) == 3
    err = capsys.readouterr().err
    assert "must fit inside the first epoch" in err and "Ways out: (1)" in err


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
    return aggregate([{**base, "img_per_s": x, "step_ms": 4000 / x} for x in ips],
                     ["a"] * len(ips)).to_dict()


def test_aggregate_mean_population_std_and_mixed():
    agg = aggregate([_profile([10.0]), _profile([14.0], "dataloader")], ["p1", "p2"])
    assert agg.img_per_s == 12.0 and agg.img_per_s_std == 2.0 and agg.img_per_s_n == 2
    assert agg.bound == "mixed" and "mixed" in agg.bound_why
    assert agg.metrics["img_per_s_std"] == 2.0
    assert agg.aggregation["representative_profile"] == "p2"
    assert agg.step_ms == pytest.approx((400 + 4000 / 14) / 2, rel=1e-3)
    same = aggregate([_profile([10.0]), _profile([10.0])], ["p1", "p2"])
    assert same.bound == "compute" and same.img_per_s_std == 0.0


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


def _trial(ips: float, other_frac: float, bound: str = "dataloader") -> dict:
    """A trial's profile with its recorded load and the confidence assess() gives it."""
    from libreyolo_core.profiler.confidence import assess
    from libreyolo_core.profiler.load import WindowLoad

    load = WindowLoad(wall_s=8.0, cpu_count=2, loadavg_1m_start=1.0, loadavg_1m=1.0 + other_frac,
                      machine_busy_cpu_s=8.0, own_cpu_s=8.0 * (1 - other_frac),
                      other_cpu_s=16 * other_frac, other_cpu_cores=2 * other_frac,
                      other_cpu_frac=other_frac, source="test")
    step = 1000 * 2 / ips
    conf = assess([step, step * 1.01, step * 0.99], [0.4 * step] * 3, load, bound)
    return {**_profile([ips], bound), "config": {"batch": 2}, "load": load.to_dict(),
            "confidence": conf.to_dict()}


def test_compare_puts_both_loads_next_to_the_delta_and_flags_the_environment(tmp_path, capsys):
    """The A/A case measured before filing: the same configuration, 3 trials a side, the
    'after' side run while other work loaded the machine: 2.69 vs 1.11 img/s, 'significant',
    and until now nothing said why."""
    from libreyolo_core.profiler.report import compare_profiles

    quiet = aggregate([_trial(x, 0.02) for x in (2.60, 2.69, 2.78)], ["a1", "a2", "a3"])
    busy = aggregate([_trial(x, f) for x, f in ((1.05, 0.55), (1.11, 0.6), (1.17, 0.7))],
                     ["b1", "b2", "b3"])
    assert busy.load.other_cpu_frac_max == 0.7 and len(busy.load.trials) == 3
    assert busy.confidence.reliable is False and "loaded" in busy.confidence.flags
    c = compare_profiles(quiet, busy)
    # beyond the noise, but the load may explain it: not called significant (#28.6)
    assert c.significance["significant"] is None and c.significance["beyond_noise"] is True
    assert "but the environment may explain the delta" in c.significance["reason"]
    assert c.load["before"]["other_cpu_frac"] == 0.02
    assert c.load["after"]["other_cpu_frac"] == pytest.approx(0.6167, abs=1e-3)
    assert c.reliable == {"before": True, "after": False}
    env = c.environment
    assert env.may_explain is True and "not the configuration, may explain" in env.note
    assert "after ran on a loaded machine (other processes 70% of the CPU)" in env.note
    assert "busier during after (other processes 2% before, 62% after)" in env.note
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(quiet.to_dict()))
    pb.write_text(json.dumps(busy.to_dict()))
    assert main(["compare", str(pa), str(pb)]) == 0
    out = capsys.readouterr().out
    assert "load before: other processes 2% of the CPU (0.0 of 2 cores)" in out
    assert "load after:  other processes 62% of the CPU" in out and "at most 70%" in out
    assert "img/s: significant" not in out and "!! environment: the environment" in out
    assert "img/s: no significance call — |Δ img/s| = 1.58 > 2 × SE" in out
    assert main(["compare", str(pa), str(pb), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["environment"]["may_explain"] is True and data["environment"]["reasons"]
    assert data["load"]["after"]["other_cpu_frac_max"] == 0.7
    assert data["img_per_s"]["delta"] == pytest.approx(1.11 - 2.69, abs=1e-3)


def test_compare_quiet_sides_and_missing_load():
    from libreyolo_core.profiler.report import compare_profiles

    a = aggregate([_trial(x, 0.03) for x in (2.6, 2.7, 2.8)], ["a"] * 3)
    b = aggregate([_trial(x, 0.05) for x in (3.6, 3.7, 3.8)], ["b"] * 3)
    env = compare_profiles(a, b).environment
    assert env.may_explain is False and "both sides ran on a quiet machine" in env.note
    old = _profile([10.0, 10.2, 9.8])  # written before loads were recorded
    env = compare_profiles(old, b).environment
    assert env.may_explain is None and "not recorded for before" in env.note


def test_profile_run_takes_other_training_keys_with_set(small_yaml, tmp_path, capsys):
    """``--set KEY=VALUE`` reaches the trial (no store of recently decoded images: no note
    about later epochs); a bad key or item is a usage error before any training."""
    rc = main(["run", str(small_yaml), "--imgsz", "64", "--batch", "4", "--workers", "0",
               "--device", "cpu", "--warmup", "1", "--steps", "2", "--set", "cache_recent_mb=0",
               "--project", str(tmp_path / "p")])
    assert rc == 0
    p = json.loads((tmp_path / "p" / "prof" / "profile.json").read_text())
    assert p["config"]["cache_recent_fits"] is None
    assert not any("store of recently decoded images" in n for n in p["notes"])
    from libreyolo_core.cli import main as libreyolo_main

    capsys.readouterr()
    for bad, said in ((["--set", "nope=1"], "unknown key 'nope'"),
                      (["--set", "cache_recent_mb=-1"], "cache_recent_mb='-1' is invalid"),
                      (["--set", "oops"], "give a training key as KEY=VALUE")):
        with pytest.raises(SystemExit) as exc:
            libreyolo_main(["profile", "run", str(small_yaml), *bad, "--project", str(tmp_path / "q")])
        assert exc.value.code == 2 and said in capsys.readouterr().err
    assert not (tmp_path / "q" / "prof" / "profile.json").exists()
