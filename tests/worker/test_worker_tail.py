"""Tailing the engine's files (worker.tail), with no database and no engine."""

from __future__ import annotations

import json

from worker.tail import Observed, Tail, decode_event, event_kind


def test_tail_returns_complete_lines_only(tmp_path):
    path = tmp_path / "events.jsonl"
    tail = Tail(path, 0)
    assert tail.read() == ([], 0)  # no file yet
    path.write_bytes(b"a\nb\npart")
    lines, offset = tail.read()
    assert (lines, offset) == ([b"a", b"b"], 4)
    tail.offset = offset
    with open(path, "ab") as f:
        f.write(b"ial\n")
    assert tail.read() == ([b"partial"], 12)


def test_decode_event_and_kind():
    assert decode_event(b"  \n") is None
    assert decode_event(b'{"event": "progress"}') == {"event": "progress"}
    assert decode_event(b"[1]") == {"event": "bad_event_line", "line": "[1]"}
    assert decode_event(b"{oops") == {"event": "bad_event_line", "line": "{oops"}
    assert [event_kind(n) for n in ("artifact", "epoch_end", "run_end")] == \
        ["artifact", "metric", "status"]


def test_observed_folds_events_into_progress():
    seen = Observed({"epochs_completed": 1}, log_tail_lines=2)
    events = [
        {"event": "progress", "time": 5.0, "phase": "val", "epoch": 2, "val_batch": 3},
        {"event": "epoch_end", "time": 6.0, "epoch": 2, "metrics": {"m": 1}, "is_best": True},
        {"event": "artifact", "time": 7.0, "path": "weights/best.pt", "kind": "checkpoint"},
        {"event": "run_end", "time": 8.0, "status": "completed"},
    ]
    rows = seen.take([json.dumps(e).encode() for e in events] + [b""],
                     [b"one\r", b"two", b"three"])
    assert [(kind, t) for kind, t, _ in rows[:4]] == \
        [("metric", 5.0), ("metric", 6.0), ("artifact", 7.0), ("status", 8.0)]
    assert rows[4][0] == "log" and rows[4][2] == {"event": "log", "lines": ["one", "two", "three"]}
    assert seen.progress == {"epochs_completed": 2, "epoch": 2, "metrics": {"m": 1},
                             "best_epoch": 2}
    assert seen.artifact_kinds == {"weights/best.pt": "checkpoint"}
    assert seen.run_end is not None and seen.run_end.to_dict() == events[-1]
    assert seen.log_tail == ["two", "three"]
