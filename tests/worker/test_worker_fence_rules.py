"""The attempt fence's two sides, fast: the engine's check (a real process that ends with
exit 6 instead of writing) and the ingester's refusal of a given-up attempt's lines."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from testkit import REPO

from worker.tail import Observed

WRITE = r'''
import sys
from pathlib import Path
from libreyolo_core.engine.events import EventLog
from libreyolo_core.records.events import ProgressEvent
log = EventLog(Path(sys.argv[1]))
log.write(ProgressEvent(epoch=1, step=1))
Path(sys.argv[2]).write_text("2.new\n")  # attempt 2 raises the fence
log.write(ProgressEvent(epoch=1, step=2))
print("not fenced")
'''


def test_an_engine_of_a_given_up_attempt_stops_before_its_next_write(tmp_path):
    events, fence = tmp_path / "events.jsonl", tmp_path / "attempt.fence"
    fence.write_text("1.old\n")
    env = {"PYTHONPATH": str(REPO), "LIBREYOLO_ATTEMPT_TOKEN": "1.old",
           "LIBREYOLO_FENCE_FILE": str(fence), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", WRITE, str(events), str(fence)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 6, out
    assert "fenced: this engine runs attempt 1.old, but attempt 2.new" in out.stderr
    assert "not fenced" not in out.stdout
    [line] = [json.loads(ln) for ln in events.read_text().splitlines()]
    assert (line["step"], line["attempt_token"]) == (1, "1.old")


def test_the_ingester_keeps_an_earlier_attempts_history_and_refuses_what_came_after():
    def line(token: str, step: int) -> bytes:
        return json.dumps({"event": "progress", "time": 1.0, "epoch": 1, "step": step,
                           "attempt_token": token}).encode()

    before = [line("1.old", 1), line("1.old", 2)]
    seen = Observed(None, log_tail_lines=5, attempt_token="2.new")
    seen.fence_offset = sum(len(b) + 1 for b in before)
    rows = seen.take([*before, line("1.old", 3), line("2.new", 1), b'{"event": "x"}'], [])
    kept = [r[2] for r in rows if r[0] != "log"]
    assert [(e.get("attempt_token"), e.get("step")) for e in kept] == [
        ("1.old", 1), ("1.old", 2), ("2.new", 1), (None, None)]
    assert seen.refused == 1
    [note] = [r[2] for r in rows if r[0] == "log"]
    assert "refused 1 event line(s) of an earlier attempt" in note["lines"][0]


PRINT = r'''
import sys
from pathlib import Path
from libreyolo_core.engine import fence
fence.guard_output()  # what main() does first
print("before the fence", flush=True)
Path(sys.argv[1]).write_text("2.new\n")  # attempt 2 raises the fence
print("after the fence: a log line of the given-up attempt", flush=True)
sys.stderr.write("after the fence on stderr\n")
'''


def test_a_given_up_engine_prints_nothing_into_the_log_after_the_fence(tmp_path):
    """The engine's stdout and stderr go to the job's train.log (every attempt appends):
    once a newer attempt raised the fence, the given-up engine's next print ends it
    (exit 6) before the line is written; the log gets only the ``fenced:`` notice."""
    fence_file, log = tmp_path / "attempt.fence", tmp_path / "train.log"
    fence_file.write_text("1.old\n")
    env = {"PYTHONPATH": str(REPO), "LIBREYOLO_ATTEMPT_TOKEN": "1.old",
           "LIBREYOLO_FENCE_FILE": str(fence_file), "PATH": "/usr/bin:/bin"}
    with open(log, "wb") as out:  # as the worker starts the engine: both streams, one file
        rc = subprocess.run([sys.executable, "-c", PRINT, str(fence_file)], env=env,
                            stdout=out, stderr=subprocess.STDOUT, timeout=120).returncode
    text = log.read_text()
    assert rc == 6, text
    assert "before the fence" in text and "after the fence" not in text, text
    assert "fenced: this engine runs attempt 1.old, but attempt 2.new" in text
    assert "stdout output not written" in text


#: a real training engine in which attempt 2 raises the fence between epoch 1's checkpoint
#: (saved and announced) and its results.csv: the moment the checkpoint's own check misses
TRAIN = r'''
import sys
from pathlib import Path
from libreyolo_core.engine import hooks
save = hooks.CheckpointHook.save
def save_then_fence(self, *args, **kwargs):
    save(self, *args, **kwargs)
    Path(sys.argv[1]).write_text("2.new\n")  # attempt 2 raises the fence
hooks.CheckpointHook.save = save_then_fence
from libreyolo_core.cli import main
main(sys.argv[2:])
'''


@pytest.mark.slow
def test_a_given_up_engine_writes_no_results_csv(tmp_path):
    """Every file of the run folder is fenced, not only checkpoints and events: a training
    engine whose attempt was given up after its checkpoint stops before results.csv."""
    from libreyolo_core.data.sample import generate_sample_dataset

    data = generate_sample_dataset(tmp_path / "sample", n_train=4, n_val=2, imgsz=64)
    fence_file, run = tmp_path / "attempt.fence", tmp_path / "runs" / "exp"
    fence_file.write_text("1.old\n")
    env = {"PYTHONPATH": str(REPO), "LIBREYOLO_ATTEMPT_TOKEN": "1.old", "OMP_NUM_THREADS": "1",
           "LIBREYOLO_FENCE_FILE": str(fence_file), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", TRAIN, str(fence_file), "train", "model=yolo9-t",
                          f"data={data}", f"project={tmp_path / 'runs'}", "name=exp", "epochs=2",
                          "imgsz=64", "batch=2", "workers=0", "val=False", "device=cpu"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 6, out.stderr[-3000:]
    assert ("fenced: this engine runs attempt 1.old, but attempt 2.new of the job has started; "
            "results.csv not written") in out.stderr, out.stderr[-3000:]
    assert (run / "weights" / "last.pt").is_file()  # epoch 1's checkpoint, before the fence
    assert not (run / "results.csv").exists() and not (run / ".results.csv.tmp").exists()
    events = [json.loads(ln) for ln in (run / "events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "artifact" and events[-1]["path"] == "weights/last.pt", events[-1]


def test_a_given_up_engine_leaves_no_error_file(tmp_path):
    """The error file is first-writer-wins: a given-up attempt's failure written after the
    fence would become the newer attempt's. Rank 1 of a run with a malformed setting (a usage
    error only rank 0 prints, so the error file is its first write) stops at the fence
    instead of recording it."""
    fence_file, error_file = tmp_path / "attempt.fence", tmp_path / "engine_error.json"
    fence_file.write_text("2.new\n")
    env = {"PYTHONPATH": str(REPO), "LIBREYOLO_ATTEMPT_TOKEN": "1.old", "RANK": "1",
           "LIBREYOLO_FENCE_FILE": str(fence_file), "LIBREYOLO_ERROR_FILE": str(error_file),
           "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "libreyolo_core.cli", "train", "model=yolo9-t",
                          "data=x.yaml", "imgsz=abc"],
                         env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 6, out
    assert "the error file not written" in out.stderr, out.stderr[-2000:]
    assert not error_file.exists()
