"""The job status machine: the transition table, what ``ops.transition`` refuses, the
diagram of docs/architecture.md against the table, and the one ownership rule."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from testkit import make_user, queued_job

from service.lifecycle import (
    EDGES,
    FINISH,
    HAND_BACK,
    REQUEST_CANCEL,
    TRANSITIONS,
    JobStatus,
    TransitionError,
)

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"

Q, R, C = JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.CANCELLING
S, F, X = JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED
#: every edge the service makes, with the name of its transition (the contract).
EXPECTED = {
    (Q, R, "claim"), (Q, X, "cancel_queued"), (R, C, "request_cancel"), (R, Q, "hand_back"),
    (R, Q, "requeue_expired"), (R, F, "fail_expired"), (C, X, "cancel_expired"),
    (R, S, "finish"), (R, F, "finish"), (R, X, "finish"),
    (C, S, "finish"), (C, F, "finish"), (C, X, "finish"),
    (R, Q, "node_lost"), (R, F, "node_lost"),
    (R, Q, "requeue_infra"), (R, F, "requeue_infra"),
}


def test_the_table_is_the_contract():
    assert set(EDGES) == EXPECTED
    assert all(name == t.name for name, t in TRANSITIONS.items())


def test_every_other_edge_is_refused():
    allowed = {(a, b) for a, b, _ in EDGES}
    refused = set(itertools.permutations(JobStatus, 2)) - allowed
    for a, b in refused:
        assert not any(a in t.sources and b in t.targets for t in TRANSITIONS.values()), (a, b)
    # nothing leaves an end status; nothing goes back from cancelling to running or queued
    assert not any(a in (S, F, X) for a, _ in allowed)
    assert {(C, R), (C, Q), (Q, C), (Q, S), (Q, F)} <= refused


def _diagram_edges(text: str) -> set[tuple[str, str, str]]:
    """``(from, to, label)`` of the mermaid block of the "How a job flows" section."""
    section = text.split("## How a job flows", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```mermaid\n(.*?)```", section, re.S)
    assert block is not None, "no mermaid diagram in 'How a job flows'"
    edges = set()
    for line in block.group(1).splitlines():
        m = re.fullmatch(r"\s*(\S+)\s*-->\s*(\S+)\s*:\s*(\w+)\s*", line)
        if m and "[*]" not in (m[1], m[2]):
            edges.add((m[1], m[2], m[3]))
    return edges


def test_architecture_diagram_matches_the_table():
    drawn = _diagram_edges(ARCHITECTURE.read_text(encoding="utf-8"))
    table = {(a.value, b.value, name) for a, b, name in EDGES}
    assert drawn - table == set(), "drawn but not in service/lifecycle.py"
    assert table - drawn == set(), "in service/lifecycle.py but not drawn"


def test_transition_target_rules():
    assert HAND_BACK.target() == Q
    assert FINISH.target("failed") == F
    with pytest.raises(TransitionError, match="say which"):
        FINISH.target()
    with pytest.raises(TransitionError, match="not to 'queued'"):
        FINISH.target(Q)


def test_transition_enforces_the_table(sessions):
    from service.db.models import Job, JobEvent, User
    from service.ops import transition

    name, _ = make_user(sessions)
    with sessions() as s:
        owner = s.query(User).filter_by(name=name).one().id
    job_id = queued_job(sessions, owner)
    with sessions() as s:
        with pytest.raises(TypeError):
            transition(s, job_id, ["queued"], "running")  # bare edges are gone
        with pytest.raises(TransitionError):
            transition(s, job_id, FINISH, Q)
        assert not transition(s, job_id, REQUEST_CANCEL)  # queued is not a source
        assert not transition(s, job_id, FINISH, S)
        s.commit()
        assert s.get(Job, job_id).status == Q
        assert s.query(JobEvent).filter_by(job_id=job_id).count() == 1  # only "queued"


def test_one_ownership_rule(sessions):
    from service.api.deps import owned_job
    from service.api.problems import Problem
    from service.db.models import User
    from service.job_store import get_owned

    alice, _ = make_user(sessions)
    bob, _ = make_user(sessions)
    root, _ = make_user(sessions, admin=True)
    with sessions() as s:
        users = {u.name: u for u in s.query(User).filter(User.name.in_([alice, bob, root]))}
        job_id = queued_job(sessions, users[alice].id)
        assert get_owned(session=s, job_id=job_id, user=users[alice]).id == job_id
        assert get_owned(session=s, job_id=job_id, user=users[root]).id == job_id
        assert get_owned(session=s, job_id=job_id, user=users[bob]) is None
        assert owned_job(job_id, users[alice], s).id == job_id
        for who, jid in ((bob, job_id), (alice, "j" + "0" * 24)):
            with pytest.raises(Problem) as err:
                owned_job(jid, users[who], s)
            assert err.value.status == 404 and err.value.detail == f"job {jid!r} not found"


def test_create_job_writes_the_row_and_its_first_event(sessions):
    from service.db.models import Job, JobEvent, User
    from service.job_store import create_job

    name, _ = make_user(sessions)
    with sessions() as s:
        owner = s.query(User).filter_by(name=name).one().id
        job = create_job(session=s, owner_id=owner, kind="train", model="yolo9-t",
                         data="/data/x.yaml", params={"epochs": 1}, gpus=0, procs=2, nodes=1,
                         priority=3, queue="cpu", max_attempts=3, time_budget_s=None,
                         request_sha256="ab" * 32, reason="resuming job j0 from its last.pt")
        s.commit()
        job_id = job.id
    with sessions() as s:
        row = s.get(Job, job_id)
        assert (row.status, row.attempt, row.event_seq, row.procs, row.priority) == (Q, 0, 1, 2, 3)
        assert row.created_at == row.enqueued_at == row.sent_at
        assert not row.cancel_requested and row.idempotency_key is None
        events = s.query(JobEvent).filter_by(job_id=job_id).all()
        assert [(e.seq, e.kind, e.payload) for e in events] == [
            (1, "status", {"event": "status", "status": "queued",
                           "reason": "resuming job j0 from its last.pt"})]
