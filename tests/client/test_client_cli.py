"""``libreyolo-service jobs ...`` against a real API server (fake engine)."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from libreyolo_client.cli import parse_params


@pytest.fixture
def cli(stack, token):
    from service.cli import app

    runner = CliRunner()
    env = {"LIBREYOLO_URL": stack.url, "LIBREYOLO_TOKEN": token, "LIBREYOLO_NO_BROWSER": "1"}

    def run(*args: str):
        return runner.invoke(app, ["jobs", *args], env=env, catch_exceptions=False)

    return run


def test_parse_params():
    assert parse_params(["epochs=3", "lr0=0.01", "amp=false", "name=x", "mosaic=1.0"]) == {
        "epochs": 3, "lr0": 0.01, "amp": False, "name": "x", "mosaic": 1.0}
    import typer

    with pytest.raises(typer.BadParameter):
        parse_params(["epochs"])
    # a key given twice: refused when the values differ (it silently took the last one)
    with pytest.raises(typer.BadParameter, match="epochs=1 and epochs=2: give one"):
        parse_params(["epochs=1", "epochs=2"])
    assert parse_params(["epochs=2", "epochs=2"]) == {"epochs": 2}


def test_submit_follow_show_list_logs_download_open(cli, stack, data_yaml, tmp_path,
                                                    monkeypatch):
    r = cli("submit", "--data", data_yaml, "--gpus", "0", "epochs=2", "imgsz=64", "batch=4")
    assert r.exit_code == 0, r.output
    job_id = r.stdout.strip().splitlines()[0]
    assert job_id.startswith("j")
    stack.run_in_background(job_id, FAKE_EPOCH_S="0.2")
    r = cli("show", job_id, "-f")
    assert r.exit_code == 0, r.output
    assert "status:   succeeded" in r.stdout and "mAP50-95 0.1000" in r.stdout
    assert f"/jobs/{job_id}" in r.stdout
    shown = json.loads(cli("show", job_id, "--json").stdout)
    assert shown["status"] == "succeeded"
    r = cli("list", "--status", "succeeded")
    assert job_id in r.stdout and "mAP50-95" in r.stdout
    assert json.loads(cli("list", "--json", "--limit", "1").stdout.splitlines()[0])["id"]
    logs = cli("logs", job_id).stdout.splitlines()
    assert logs[-1] == "done"
    assert cli("logs", job_id, "--tail", "1").stdout.strip() == "done"
    r = cli("download", job_id, "--list")
    assert "weights/last.pt" in r.stdout and "timeline.html" in r.stdout
    r = cli("download", job_id, "weights/last.pt", "-o", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "last.pt").read_text())["epoch"] == 2
    # a trailing slash means a folder: created when missing, the file inside it
    r = cli("download", job_id, "weights/last.pt", "-o", f"{tmp_path / 'models'}/")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "models").is_dir() and (tmp_path / "models" / "last.pt").is_file()
    assert r.stdout.strip() == str(tmp_path / "models" / "last.pt")
    opened = []
    monkeypatch.setattr("webbrowser.open", opened.append)
    monkeypatch.delenv("LIBREYOLO_NO_BROWSER", raising=False)
    r = cli("open", job_id)
    assert r.stdout.strip().endswith(f"/jobs/{job_id}")
    r = cli("open", job_id, "--timeline")
    assert r.exit_code == 0 and r.stdout.strip().startswith("file://")
    assert r.stdout.strip().endswith("timeline.html")


def test_submit_follow_of_a_failing_job_exits_1_with_the_tail(cli, stack, data_yaml):
    import threading

    def worker_when_queued():
        import time

        from service.db.models import Job

        for _ in range(200):
            with stack.sessions() as s:
                job = s.query(Job).filter(Job.status == "queued",
                                          Job.data == data_yaml).first()
                if job:
                    stack.run_in_background(job.id, FAKE_EXIT="3")
                    return
            time.sleep(0.05)

    t = threading.Thread(target=worker_when_queued)
    t.start()
    r = cli("submit", "-d", data_yaml, "--gpus", "0", "-f", "epochs=1", "imgsz=64", "batch=4")
    t.join()
    assert r.exit_code == 1
    assert "failed: data error" in r.output and "something broke in the data" in r.output
    job_id = r.output.split()[0]
    shown = cli("show", job_id)
    assert "error:    data error (exit code 3)" in shown.output
    assert "cause:    DatasetError: data broke (rank 0)" in shown.output, shown.output


def test_cli_errors_name_the_field_and_cancel(cli, data_yaml):
    r = cli("submit", "-d", data_yaml, "--gpus", "0", "imgsz=100")
    assert r.exit_code == 2 and "params.imgsz" in r.output
    r = cli("show", "j" + "0" * 24)
    assert r.exit_code == 1 and "not found" in r.output
    job_id = cli("submit", "-d", data_yaml, "--gpus", "0", "epochs=1").stdout.split()[0]
    shown = cli("show", job_id).output  # where it stands in the fair-share queue
    assert re.search(r"^queue: +#\d+ in queue cpu \(priority 0, effective 0\)$", shown, re.M), shown
    r = cli("cancel", job_id)
    assert r.exit_code == 0 and r.stdout.strip() == f"{job_id}: cancelled"


def test_cli_bad_token(stack):
    from service.cli import app

    r = CliRunner().invoke(app, ["jobs", "--url", stack.url, "--token", "lyt_bad", "list"])
    assert r.exit_code == 1 and "401" in r.output


def test_submit_a_tune_job_and_show_its_table(cli, stack, data_yaml):
    r = cli("submit", "-d", data_yaml, "--gpus", "0", "--kind", "tune", "--repeat", "2",
            "--max-candidates", "3", "--budget-s", "300", "imgsz=64", "workers=0")
    assert r.exit_code == 0, r.output
    job_id = r.stdout.split()[0]
    shown = json.loads(cli("show", job_id, "--json").stdout)
    assert shown["kind"] == "tune" and shown["params"] == {"imgsz": 64, "workers": 0}
    assert shown["tune"]["repeat"] == 2 and shown["tune"]["max_candidates"] == 3
    assert shown["tune"]["budget_s"] == 300 and shown["tune"]["steps"] == 10
    r = cli("submit", "-d", data_yaml, "--gpus", "0", "--repeat", "2", "epochs=1")
    assert r.exit_code == 2 and "--repeat is a tune option" in r.output

    # what the runner stores when the tune ends: `show` prints the table and the answer
    from service.db.models import Job

    row = {"name": "workers", "label": "workers 0 -> 2", "params": {"workers": 2},
           "img_per_s": 61.0, "img_per_s_std": 1.5, "n": 2, "step_ms": 520.0,
           "verdict": "compute", "significant": True, "gain": 0.8, "recommendable": True}
    tune = {"status": "complete", "answer": "recommended: workers=2: 34.0 -> 61.0 img/s (+80%)",
            "baseline": {"name": "baseline", "label": "baseline", "img_per_s": 34.0,
                         "img_per_s_std": 2.0, "n": 2, "step_ms": 940.0, "verdict": "dataloader"},
            "candidates": [row], "recommended": row, "expected_epoch_s": 2.1,
            "baseline_epoch_s": 3.8, "recommended_params": {"imgsz": 64, "workers": 2}}
    with stack.sessions() as s:
        s.get(Job, job_id).status, s.get(Job, job_id).result = "succeeded", {"tune": tune}
        s.commit()
    out = cli("show", job_id).stdout
    assert "workers 0 -> 2" in out and "61.0 ± 1.5 (2)" in out and "+80% *" in out
    assert "answer:   recommended: workers=2" in out
    assert "train with: imgsz=64 workers=2" in out and "2.1 s expected (baseline 3.8 s)" in out


def test_submit_nodes_then_show_and_list_each_node(cli, stack, data_yaml):
    """``--nodes 2`` submits a 2-node job; ``show`` prints its world and each node's worker
    (claimed by the real gang code), with the exit code and stop once a node ended; ``list``
    marks it; a 1-node job's display has no node lines."""
    from testkit import take_node

    from service.gang import record_node_exit

    r = cli("submit", "-d", data_yaml, "--gpus", "0", "--nodes", "2", "epochs=1")
    assert r.exit_code == 0, r.output
    job_id = r.stdout.split()[0]
    assert json.loads(cli("show", job_id, "--json").stdout)["nodes"] == 2
    take_node(stack.sessions, job_id, "w-a", "10.0.0.1")
    out = cli("show", job_id).stdout
    assert "nodes:    2 nodes x 1 CPU rank (world size 2)\n" \
        "  node 0  w-a on host-w-a (10.0.0.1)\n  node 1  (no worker yet)\n" in out
    listed = next(ln for ln in cli("list").stdout.splitlines() if ln.startswith(job_id))
    assert "[2 nodes x 1 CPU rank]" in listed
    take_node(stack.sessions, job_id, "w-b", "10.0.0.2")
    with stack.sessions() as s:
        record_node_exit(s, job_id=job_id, attempt=1, node_rank=1, worker_id="w-b",
                         exit_code=143, stop="worker shutdown", detail="")
        s.commit()
    out = cli("show", job_id).stdout
    assert "status:   running (attempt 1/3)" in out
    assert "  node 0  w-a on host-w-a (10.0.0.1)\n" \
        "  node 1  w-b on host-w-b (10.0.0.2)  exit 143  stopped: worker shutdown\n" in out
    cli("cancel", job_id)

    single = cli("submit", "-d", data_yaml, "--gpus", "0", "epochs=1").stdout.split()[0]
    assert "nodes:" not in cli("show", single).stdout
    listed = next(ln for ln in cli("list").stdout.splitlines() if ln.startswith(single))
    assert "nodes" not in listed
    cli("cancel", single)


def test_an_unreliable_verdict_says_so_in_show_list_and_follow(cli, stack, data_yaml):
    """#28.6: the flag that profile.json, the page and the engine CLI carry."""
    from libreyolo_client._progress import verdict_text
    from service.db.models import Job

    # gpus 1: a queue no runner thread of this session claims from (the row is set below)
    r = cli("submit", "--kind", "profile", "--data", data_yaml, "--gpus", "1")
    job_id = r.stdout.split()[0]
    conf = {"reliable": False, "flags": ["few_steps", "loaded"],
            "reasons": ["only 2 unsynced steps", "other processes took 60% of the CPU"],
            "advice": "profile again with --repeat 3"}
    result = {"status": "completed", "verdict": "dataloader", "bound_why": "data wait 70%",
              "profile": {"verdict": "dataloader", "confidence": conf}}
    with stack.sessions() as s:
        job = s.get(Job, job_id)
        job.status, job.result = "succeeded", result
        s.commit()
    out = cli("show", job_id).stdout
    assert "verdict:  dataloader UNRELIABLE (few_steps, loaded): data wait 70%" in out, out
    assert ("UNRELIABLE: only 2 unsynced steps; other processes took 60% of the CPU. profile "
            "again with --repeat 3") in out
    listed = [ln for ln in cli("list").stdout.splitlines() if ln.startswith(job_id)]
    assert listed and listed[0].endswith("verdict dataloader UNRELIABLE (few_steps, loaded)")
    # the follow mode's line reads the profile event itself
    assert verdict_text({"verdict": "compute", "bound_why": "x", "confidence": conf}) == \
        "compute UNRELIABLE (few_steps, loaded): x"
    assert verdict_text({"verdict": "compute", "bound_why": "x",
                         "confidence": {"reliable": True}}) == "compute: x"


def test_a_cancelled_job_resumes_from_its_last_pt(cli, stack, data_yaml, client):
    """#28.9: POST /v1/jobs/{id}/resume and `jobs resume`: a new job that continues from
    the old one's last.pt; the engine's log names that way, not a server path."""
    import time

    from testkit import wait_for

    job = client.train(model="yolo9-t", data=data_yaml, gpus=0, epochs=8, imgsz=64, batch=4)
    stack.run_in_background(job.id, FAKE_EPOCH_S="0.3")
    weights = stack.settings.artifact_root / job.id / "run" / "weights" / "last.pt"
    wait_for(lambda: weights.is_file() and json.loads(weights.read_text())["epoch"] >= 2,
             timeout=60, what="two epochs")
    job.cancel()
    wait_for(lambda: job.refresh().status == "cancelled", timeout=60, what="cancelled")
    time.sleep(0.2)
    r = cli("resume", job.id)
    assert r.exit_code == 0, r.output
    new_id = r.stdout.split()[0]
    assert new_id != job.id
    new = client.job(new_id)
    assert new.info.status == "queued" and new.info.params == job.info.params
    stack.run_in_background(new_id, FAKE_EPOCH_S="0.05").join(60)
    new.refresh()
    assert new.status == "succeeded", new.info.error
    log = "\n".join(cli("logs", new_id).stdout.splitlines())
    assert "resuming from" in log and "at epoch 1\n" not in log, log
    assert client.job(job.id).status == "cancelled"  # the old job stays as it ended
    # only a cancelled or failed train job, and one that left a last.pt
    r = cli("resume", new_id)
    assert r.exit_code != 0 and "only a cancelled or failed train job" in r.output


def test_a_run_that_learned_nothing_says_so(cli, stack, data_yaml, token):
    """#28.5: mAP50 0.004 after 5 epochs from scratch ended without a word."""
    import httpx

    from libreyolo_core.records.notes import learned_nothing
    from service.db.models import Job

    r = cli("submit", "--data", data_yaml, "--gpus", "1", "epochs=5")  # no runner claims it
    job_id = r.stdout.split()[0]
    result = {"status": "completed", "best_epoch": 5, "epochs_completed": 5,
              "metrics": {"mAP50": 0.004, "mAP50-95": 0.001}}
    with stack.sessions() as s:
        job = s.get(Job, job_id)
        job.status, job.result = "succeeded", result
        s.commit()
    out = cli("show", job_id).stdout
    assert "note:     mAP50 0.004 after 5 epochs from scratch: too short to learn" in out, out
    assert "about 30 epochs" in out
    page = httpx.get(f"{stack.url}/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"})
    assert "mAP50 0.004 after 5 epochs from scratch: too short to learn" in page.text
    assert learned_nothing({"mAP50": 0.004}, 5, True).startswith(
        "mAP50 0.004 after 5 epochs from scratch: too short to learn")
    assert learned_nothing({"mAP50": 0.6}, 5, True) is None
    assert "learned next to nothing" in learned_nothing({"mAP50": 0.01}, 1, False)


def test_the_scan_counts_show_in_show_and_on_the_page(cli, stack, data_yaml, token):
    import httpx

    from service.db.models import Job

    job_id = cli("submit", "--data", data_yaml, "--gpus", "1").stdout.split()[0]  # unclaimed
    data = {"train": {"images": 64, "usable": 64, "boxes": 120, "n_defects": 6,
                      "defects": {"bad_class": 3, "zero_area": 3}, "rows_dropped": 6,
                      "skipped": 0},
            "val": {"images": 16, "usable": 16, "boxes": 30, "n_defects": 0, "defects": {}}}
    with stack.sessions() as s:
        job = s.get(Job, job_id)
        job.status = "succeeded"
        job.result = {"status": "completed", "best_epoch": 1, "epochs_completed": 1,
                      "metrics": {"mAP50": 0.5}, "data": data}
        s.commit()
    out = cli("show", job_id).stdout
    assert ("data:     train 64 images, 120 boxes, 6 data defects (bad_class 3, zero_area 3; "
            "see jobs logs); val 16 images, 30 boxes") in out, out
    page = httpx.get(f"{stack.url}/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"})
    assert "6 data defects (bad_class 3, zero_area 3; the log names each)" in page.text
