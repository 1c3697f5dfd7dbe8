"""Multi-node jobs, fast, on SQLite and PostgreSQL: the gang rows (service/gang.py) through
the scheduler's claim; two nodes as two worker threads running the fake engine (a node
other than 0 writes no events); and the submit checks of ``nodes``. The real engine across
worker processes is tests/worker/test_multinode.py (slow).

Each test uses a queue of its own and new users, so jobs other tests leave queued in the
shared database do not take part.
"""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update
from testkit import (
    ServerThread,
    client,
    engine_lines,
    make_user,
    pid_alive,
    queued_job,
    wait_for,
    write_data_yaml,
)

from service.db.models import Job, JobEvent, JobNode, User, utcnow
from service.gang import (
    Claim,
    NodeAddress,
    NodeView,
    gather_step,
    lost_nodes,
    nodes_of,
    record_node_exit,
    release_slot,
    renew_node,
    take_slot,
)
from service.job_store import node_lost, request_cancel
from service.lifecycle import FINISH
from service.ops import transition
from service.reaper import reap_once
from service.scheduler import claim, claim_order, read_queue
from service.storage import ArtifactStore
from worker.runner import run_next


def new_user(sessions, cap: int | None = None) -> str:
    """The id of a new user (with a running-job cap of their own when given)."""
    name, _ = make_user(sessions)
    with sessions() as s:
        user = s.query(User).filter_by(name=name).one()
        user.max_running = cap
        s.commit()
        return user.id


def add_job(sessions, owner: str, queue: str, nodes: int = 2, params=None, **over) -> str:
    return queued_job(sessions, owner, queue=queue, nodes=nodes, params=params or {"epochs": 1},
                      sent_at=utcnow(), **over)


def at(port: int) -> NodeAddress:
    return NodeAddress("host-x", "127.0.0.1", port)


def take(sessions, queue: str, settings, worker: str, port: int | None = None,
         **kw) -> Claim | None:
    """One claim of ``worker`` (with an address when ``port`` is given)."""
    with sessions() as s:
        return claim(s, queue, worker, settings, where=at(port) if port else None, **kw)


def row(sessions, job_id: str) -> Job:
    with sessions() as s:
        return s.get(Job, job_id)


def slots(sessions, job_id: str, attempt: int = 1) -> list[NodeView]:
    with sessions() as s:
        return nodes_of(s, job_id, attempt)


def events(sessions, job_id: str) -> list[JobEvent]:
    with sessions() as s:
        return list(s.query(JobEvent).filter_by(job_id=job_id).order_by(JobEvent.seq))


def gang_lines(sessions, job_id: str) -> list[str]:
    return [ln for e in events(sessions, job_id)
            if e.kind == "log" and e.payload.get("event") == "gang" for ln in e.payload["lines"]]


def status_events(sessions, job_id: str, status: str) -> list[dict[str, Any]]:
    return [e.payload for e in events(sessions, job_id)
            if e.payload.get("event") == "status" and e.payload["status"] == status]


def step(sessions, c: Claim, worker: str, settings, cap: int = 0) -> tuple[str, int]:
    with sessions() as s:
        return gather_step(s, c, worker_id=worker, lease_s=settings.lease_s, cap=cap)


# -- the gang rows through the scheduler's claim ------------------------------------------


def test_the_claim_that_takes_the_last_slot_starts_the_job(settings, sessions, new_queue):
    """A 2-node job (2 CPU ranks per node): the first claim takes node 0 and publishes its
    port, the job stays queued with a ``gang`` event; the second takes node 1 and starts
    it (attempt 1, the lease to node 0's worker, a status event naming both nodes and the
    world size); a third claim gets nothing."""
    q = new_queue()
    job = add_job(sessions, new_user(sessions), q, procs=2)
    assert take(sessions, q, settings, "w0", 41000) == Claim(job, 0, 1, 2, False)
    j = row(sessions, job)
    assert (j.status, j.attempt, j.lease_owner) == ("queued", 0, None)
    [zero] = slots(sessions, job)
    assert (zero.node_rank, zero.worker, zero.addr, zero.port) == (0, "w0", "127.0.0.1", 41000)
    assert gang_lines(sessions, job) == ["node 0 of 2 claimed by w0; 1 of 2 nodes gathered"]
    with sessions() as s:
        assert [w.gathered for w in read_queue(s, q, settings).waiting] == [1]

    assert take(sessions, q, settings, "w1", 41001) == Claim(job, 1, 1, 2, True)
    j = row(sessions, job)
    assert (j.status, j.attempt, j.lease_owner) == ("running", 1, "w0")
    assert j.lease_expires_at is not None and j.started_at is not None
    assert [(n.node_rank, n.worker, n.port) for n in slots(sessions, job)] == \
        [(0, "w0", 41000), (1, "w1", None)]  # only node 0 publishes a port
    [running] = status_events(sessions, job, "running")
    assert running["attempt"] == 1 and running["worker"] == "w0"
    assert running["world_size"] == 4 and running["rendezvous"] == "127.0.0.1:41000"
    assert running["nodes"] == [{"node_rank": 0, "worker": "w0", "addr": "127.0.0.1"},
                                {"node_rank": 1, "worker": "w1", "addr": "127.0.0.1"}]
    assert len(gang_lines(sessions, job)) == 1  # the starting claim logs the start instead

    assert take(sessions, q, settings, "w2", 41002) is None
    assert len(slots(sessions, job)) == 2 and row(sessions, job).attempt == 1


def test_a_partly_gathered_job_comes_before_older_and_higher_priority_jobs(settings, sessions,
                                                                           new_queue):
    """A free worker completes a waiting gang before it starts anything else, so it never
    leaves a gathered node waiting for a worker busy elsewhere."""
    q = new_queue()
    single = add_job(sessions, new_user(sessions), q, nodes=1, priority=9)
    two = add_job(sessions, new_user(sessions), q, nodes=2, priority=0)
    with sessions() as s:
        assert [w.id for w in claim_order(read_queue(s, q, settings), 15.0)] == [single, two]
    assert take(sessions, q, settings, "w0", 41000, job_id=two) == Claim(two, 0, 1, 2, False)
    with sessions() as s:
        assert [w.id for w in claim_order(read_queue(s, q, settings), 15.0)] == [two, single]
    assert take(sessions, q, settings, "w1", 41001) == Claim(two, 1, 1, 2, True)
    assert take(sessions, q, settings, "w2", 41002) == Claim(single, 0, 1, 1, True)


def test_an_expired_slot_is_freed_and_taken_by_the_next_claim(settings, sessions, new_queue):
    """The worker holding node 0 died while waiting: its slot no longer counts as gathered,
    the next claim takes node 0 (with its own port), and the dead worker's slot is gone."""
    q = new_queue()
    job = add_job(sessions, new_user(sessions), q)
    dead = take(sessions, q, settings, "w0", 41000)
    assert dead == Claim(job, 0, 1, 2, False)
    with sessions() as s:
        s.execute(update(JobNode).where(JobNode.job_id == job)
                  .values(lease_expires_at=utcnow() - timedelta(seconds=1)))
        s.commit()
        assert [w.gathered for w in read_queue(s, q, settings).waiting] == [0]
    again = take(sessions, q, settings, "w1", 41001)
    assert again == Claim(job, 0, 1, 2, False)
    assert [(n.node_rank, n.worker, n.port) for n in slots(sessions, job)] == [(0, "w1", 41001)]
    assert step(sessions, dead, "w0", settings) == ("gone", 0)
    assert step(sessions, again, "w1", settings) == ("waiting", 1)
    assert row(sessions, job).status == "queued"


def test_release_slot_leaves_the_job_queued_with_the_reason(settings, sessions, new_queue):
    q = new_queue()
    job = add_job(sessions, new_user(sessions), q)
    c = take(sessions, q, settings, "w0", 41000)
    assert c is not None
    with sessions() as s:
        assert not release_slot(s, c, worker_id="w9", reason="not w9's slot")
    assert len(slots(sessions, job)) == 1
    with sessions() as s:
        assert release_slot(s, c, worker_id="w0", reason="gang wait: test")
    j = row(sessions, job)
    assert (j.status, j.attempt) == ("queued", 0) and slots(sessions, job) == []
    assert gang_lines(sessions, job)[-1] == "gang wait: test"
    with sessions() as s:  # released already: nothing more to give back, no second event
        assert not release_slot(s, c, worker_id="w0", reason="again")
    assert "again" not in gang_lines(sessions, job)
    assert take(sessions, q, settings, "w1", 41001) == Claim(job, 0, 1, 2, False)


def test_a_cancel_while_gathering_sends_the_waiting_worker_away(settings, sessions, new_queue):
    q = new_queue()
    job = add_job(sessions, new_user(sessions), q)
    c = take(sessions, q, settings, "w0", 41000)
    assert c is not None and step(sessions, c, "w0", settings) == ("waiting", 1)
    with sessions() as s:
        assert request_cancel(session=s, job_id=job)
        s.commit()
    assert step(sessions, c, "w0", settings) == ("gone", 0)
    with sessions() as s:
        assert not release_slot(s, c, worker_id="w0", reason="too late")
    assert row(sessions, job).status == "cancelled"
    assert take(sessions, q, settings, "w1", 41001) is None


def test_the_owners_cap_holds_at_the_gang_start(settings, sessions, new_queue):
    """Owner cap 1: a 2-node job's gang gathers, but the owner's 1-node job started
    meanwhile, so taking the last slot does not start it; the waiting nodes start it once
    the other job ends."""
    q = new_queue()
    owner = new_user(sessions, cap=1)
    two = add_job(sessions, owner, q, nodes=2)
    one = add_job(sessions, owner, q, nodes=1)
    c0 = take(sessions, q, settings, "w0", 41000, job_id=two)
    assert c0 == Claim(two, 0, 1, 2, False)
    assert take(sessions, q, settings, "w9", job_id=one) == Claim(one, 0, 1, 1, True)
    assert take(sessions, q, settings, "w1", 41001, job_id=two) is None  # at the cap
    with sessions() as s:  # a worker that read the queue before the owner reached the cap
        c1 = take_slot(s, job_id=two, attempt=1, nodes=2, worker_id="w1", where=at(41001),
                       lease_s=settings.lease_s, cap=1)
        s.commit()
    assert c1 == Claim(two, 1, 1, 2, False)
    assert row(sessions, two).status == "queued"
    assert step(sessions, c0, "w0", settings, cap=1) == ("waiting", 2)
    with sessions() as s:
        assert transition(s, one, FINISH, "succeeded", finished_at=utcnow(), lease_owner=None,
                          lease_expires_at=None)
        s.commit()
    assert step(sessions, c1, "w1", settings, cap=1) == ("running", 2)
    j = row(sessions, two)
    assert (j.status, j.attempt, j.lease_owner) == ("running", 1, "w0")
    assert step(sessions, c0, "w0", settings, cap=1) == ("running", 2)
    assert len(status_events(sessions, two, "running")) == 1


def test_a_worker_without_an_address_passes_over_multi_node_jobs(make_settings, db_url, settings,
                                                                  sessions, new_queue):
    """No NodeAddress (``worker_addr`` not an address of this host): the worker takes the
    one-node job behind a higher-priority 2-node job, and then nothing."""
    q = new_queue()
    two = add_job(sessions, new_user(sessions), q, nodes=2, priority=9)
    one = add_job(sessions, new_user(sessions), q, nodes=1)
    assert take(sessions, q, settings, "w0") == Claim(one, 0, 1, 1, True)
    assert take(sessions, q, settings, "w1") is None
    unbound = make_settings(db_url, worker_addr="192.0.2.1")  # TEST-NET-1: not this host
    assert run_next(two, settings=unbound, sessions=sessions, worker_id="w2") == "skipped"
    assert row(sessions, two).status == "queued" and slots(sessions, two) == []


def test_concurrent_claims_take_each_slot_once(db_url, settings, sessions, new_queue):
    """Three workers claim a 2-node job at the same instant: two get a slot each (ranks 0
    and 1), the job starts once, the third gets nothing."""
    from service.db.session import make_engine, make_session_factory

    q = new_queue()
    job = add_job(sessions, new_user(sessions), q)
    engines = [make_engine(db_url) for _ in range(3)]
    barrier = threading.Barrier(3)
    got: list[Claim | None] = [None] * 3
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            with make_session_factory(engines[i])() as s:
                s.connection()  # connected before the barrier
                barrier.wait(30)
                got[i] = claim(s, q, f"w{i}", settings, where=at(41000 + i))
        except BaseException as exc:  # raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    for e in engines:
        e.dispose()
    assert not errors, errors
    won = [c for c in got if c is not None]
    assert sorted(c.node_rank for c in won) == [0, 1] and [c.started for c in won].count(True) == 1
    j = row(sessions, job)
    assert (j.status, j.attempt) == ("running", 1)
    assert sorted(n.worker for n in slots(sessions, job)) == \
        sorted(f"w{i}" for i, c in enumerate(got) if c is not None)
    assert len(status_events(sessions, job, "running")) == 1


def test_lost_nodes_a_failed_engine_or_an_expired_node_lease(settings, sessions, new_queue):
    """Node 0's view of a running 3-node attempt: a node whose engine ended cleanly is not
    lost; one whose engine failed, and one whose slot lease expired, are. ``node_lost``
    then re-queues the attempt, and the other nodes' renewals say it is over for them."""
    q = new_queue()
    job = add_job(sessions, new_user(sessions), q, nodes=3)
    for i in range(3):
        assert take(sessions, q, settings, f"w{i}", 41000 + i) is not None
    with sessions() as s:
        assert lost_nodes(s, job_id=job, attempt=1) == []
        assert renew_node(s, job_id=job, attempt=1, node_rank=1, worker_id="w1",
                          lease_s=settings.lease_s) == ("running", False)
        assert renew_node(s, job_id=job, attempt=1, node_rank=1, worker_id="w2",
                          lease_s=settings.lease_s) is None  # not w2's slot
        record_node_exit(s, job_id=job, attempt=1, node_rank=1, worker_id="w1", exit_code=0,
                         stop=None, detail="done")
        s.commit()
        assert lost_nodes(s, job_id=job, attempt=1) == []
        s.execute(update(JobNode).where(JobNode.job_id == job, JobNode.node_rank == 2)
                  .values(lease_expires_at=utcnow() - timedelta(seconds=1)))
        s.commit()
        [(two, why)] = lost_nodes(s, job_id=job, attempt=1)
        assert (two.node_rank, two.worker, why) == (2, "w2", "its node lease expired (worker lost)")
        # torchrun's failure report ends with a rule: the reason quotes the line above it
        report = ("  exitcode  : -9 (pid: 18585)\n"
                  "  traceback : Signal 9 (SIGKILL) received by PID 18585\n" + "=" * 60 + "\n")
        s.execute(update(JobNode).where(JobNode.job_id == job, JobNode.node_rank == 1)
                  .values(exit_code=1, detail=report))
        s.commit()
        assert [(n.node_rank, why) for n, why in lost_nodes(s, job_id=job, attempt=1)] == \
            [(1, "its engine failed, exit code 1; its log ends: traceback : Signal 9 "
                 "(SIGKILL) received by PID 18585"),
             (2, "its node lease expired (worker lost)")]
        store = ArtifactStore(settings.artifact_root)
        assert node_lost(session=s, job_id=job, worker_id="w1", reason="x", progress=None,
                         store=store) is None  # only node 0's worker holds the job
        assert node_lost(session=s, job_id=job, worker_id="w0", reason="node 2 lost",
                         progress=None, store=store) == "queued"
        s.commit()
        assert renew_node(s, job_id=job, attempt=1, node_rank=1, worker_id="w1",
                          lease_s=settings.lease_s) is None
    j = row(sessions, job)
    assert (j.status, j.attempt, j.lease_owner) == ("queued", 1, None)
    assert queued_reasons(sessions, job) == [
        "node 2 lost; re-queued for attempt 2 (infrastructure retry 1 of 10) on every node, "
        "starting again (no last.pt yet)"]
    assert take(sessions, q, settings, "w3", 41003) == Claim(job, 0, 2, 3, False)


def test_the_reaper_requeues_a_gang_whose_node_0_died(settings, sessions, new_queue):
    """Node 0's worker died: the job's lease (node 0's) expires, the reaper re-queues the
    job with one wake-up per node, and the next gang gathers for attempt 2."""
    q = new_queue()
    job = add_job(sessions, new_user(sessions), q)
    assert take(sessions, q, settings, "w0", 41000) is not None
    assert take(sessions, q, settings, "w1", 41001) is not None
    with sessions() as s:
        s.execute(update(Job).where(Job.id == job)
                  .values(lease_expires_at=utcnow() - timedelta(seconds=1)))
        s.commit()
    sent: list[tuple[str, str, int]] = []
    reap_once(sessions, settings, lambda *m: sent.append(m))
    assert sent.count((job, q, 0)) == 2
    j = row(sessions, job)
    assert (j.status, j.attempt) == ("queued", 1)
    reason = next(e.payload["reason"] for e in reversed(events(sessions, job))
                  if e.kind == "status")
    assert reason.startswith("node 0 (worker w0) lost: its lease expired; re-queued for "
                             "attempt 2 (infrastructure retry 1 of 10) on every node"), reason
    assert take(sessions, q, settings, "w2", 41002) == Claim(job, 0, 2, 2, False)


def test_a_worker_that_died_while_waiting_never_starts_the_gang(make_settings, db_url, sessions,
                                                                new_queue):
    """A waiting slot's lease is short (GATHER_LEASE_S, renewed every second): the gang
    does not start with a slot whose worker stopped renewing it; once it starts, every
    slot holds the running lease (lease_s)."""
    from service.gang import GATHER_LEASE_S

    settings = make_settings(db_url, lease_s=60)
    q = new_queue()
    owner = new_user(sessions, cap=1)
    two = add_job(sessions, owner, q, nodes=2)
    one = add_job(sessions, owner, q, nodes=1)
    c0 = take(sessions, q, settings, "w0", 41000, job_id=two)
    assert take(sessions, q, settings, "w9", job_id=one) is not None  # the owner's cap: 1
    with sessions() as s:
        c1 = take_slot(s, job_id=two, attempt=1, nodes=2, worker_id="w1", where=at(41001),
                       lease_s=settings.lease_s, cap=1)
        s.commit()
    left = (slots(sessions, two)[0].lease_expires_at - utcnow()).total_seconds()
    assert 0 < left <= GATHER_LEASE_S
    with sessions() as s:  # w0 died while waiting: it renews no more
        s.execute(update(JobNode).where(JobNode.job_id == two, JobNode.node_rank == 0)
                  .values(lease_expires_at=utcnow() - timedelta(seconds=1)))
        assert transition(s, one, FINISH, "succeeded", finished_at=utcnow(), lease_owner=None,
                          lease_expires_at=None)
        s.commit()
    assert step(sessions, c1, "w1", settings, cap=1) == ("waiting", 1)
    assert row(sessions, two).status == "queued"
    assert [n.node_rank for n in slots(sessions, two)] == [1]
    assert step(sessions, c0, "w0", settings, cap=1)[0] == "gone"
    c2 = take(sessions, q, settings, "w2", 41002, job_id=two)
    assert c2 == Claim(two, 0, 1, 2, True)
    j = row(sessions, two)
    assert (j.status, j.lease_owner) == ("running", "w2")
    assert all((n.lease_expires_at - utcnow()).total_seconds() > 50 > GATHER_LEASE_S
               for n in slots(sessions, two))


def test_a_gang_larger_than_the_live_workers_does_not_hold_the_queue(settings, sessions,
                                                                       new_queue):
    """One live worker serves the queue: an older 2-node job cannot gather, so the worker
    takes the 1-node job behind it; with two live workers it takes a node slot."""
    from service.db.models import WorkerRow

    q = new_queue()
    two = add_job(sessions, new_user(sessions), q, nodes=2, priority=5)
    one = add_job(sessions, new_user(sessions), q, nodes=1)
    with sessions() as s:
        s.add(WorkerRow(name=f"live-{q}-0", host="h", pid=1, queues=[q], gpus=0))
        s.commit()
    assert take(sessions, q, settings, "w0", 41000) == Claim(one, 0, 1, 1, True)
    with sessions() as s:
        s.add(WorkerRow(name=f"live-{q}-1", host="h", pid=2, queues=[q], gpus=0))
        s.commit()
    assert take(sessions, q, settings, "w1", 41001) == Claim(two, 0, 1, 2, False)


def test_a_worker_coming_online_wakes_its_queues_gangs(sessions, new_queue):
    """The wake-ups a worker sends when it comes online: one per node of each queued
    multi-node job of its queues, best priority first; none for 1-node or running jobs."""
    from worker.runner import wake_gangs_on

    q, other = new_queue(), new_queue()
    user = new_user(sessions)
    low = add_job(sessions, user, q, nodes=2, priority=0)
    high = add_job(sessions, user, q, nodes=3, priority=7)
    add_job(sessions, user, q, nodes=1)
    add_job(sessions, user, q, nodes=2, status="running")
    far = add_job(sessions, user, other, nodes=2)
    sent: list[tuple[str, str, int]] = []
    wake_gangs_on(sessions, [q], lambda *m: sent.append(m))
    assert sent == [(high, q, 7)] * 3 + [(low, q, 0)] * 2
    sent.clear()
    wake_gangs_on(sessions, [q, other], lambda *m: sent.append(m))
    assert sent[-2:] == [(far, other, 0)] * 2 and len(sent) == 7


# -- two nodes as two worker threads (fake engine) -----------------------------------------


@pytest.fixture
def node_settings(make_settings, db_url):
    return make_settings(db_url, worker_addr="127.0.0.1", lease_s=3, heartbeat_s=0.3,
                         poll_interval_s=0.05, grace_s=3, gang_wait_s=20)


class Node:
    """One worker, in a thread, woken by a message for ``job_id`` (``run_next``)."""

    def __init__(self, job_id: str, worker_id: str, settings, sessions):
        self.job_id, self.worker_id = job_id, worker_id
        self.settings, self.sessions = settings, sessions
        self.stop = threading.Event()
        self.sent: list[tuple[str, str, int]] = []
        self.out: str | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.out = run_next(self.job_id, settings=self.settings, sessions=self.sessions,
                            worker_id=self.worker_id, stop=self.stop,
                            on_requeue=lambda *m: self.sent.append(m))

    def start(self) -> Node:
        self.thread.start()
        return self

    def join(self, timeout: float = 60) -> str | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"{self.worker_id} still runs"
        return self.out


def gang(job_id: str, settings, sessions, attempt: int = 1) -> tuple[Node, Node]:
    """Workers w0 (node 0: it claims first) and w1 (node 1) for ``job_id``'s ``attempt``."""
    n0 = Node(job_id, "w0", settings, sessions).start()
    wait_for(lambda: [n.worker for n in slots(sessions, job_id, attempt)] == ["w0"],
             what="w0 to take node 0")
    return n0, Node(job_id, "w1", settings, sessions).start()


def both_running(sessions, job_id: str, attempt: int = 1) -> list[int]:
    """Wait until both nodes' engines run and node 0's engine reported progress; their pids."""
    def ready() -> list[int] | None:
        pids = [n.pid for n in slot_rows(sessions, job_id, attempt) if n.pid is not None]
        progress = any(e.payload.get("event") == "progress" for e in events(sessions, job_id))
        return pids if len(pids) == 2 and progress else None

    return wait_for(ready, what="both engines to run")


def slot_rows(sessions, job_id: str, attempt: int) -> list[JobNode]:
    with sessions() as s:
        return list(s.query(JobNode).filter_by(job_id=job_id, attempt=attempt)
                    .order_by(JobNode.node_rank))


def queued_reasons(sessions, job_id: str) -> list[str]:
    return [e["reason"] for e in status_events(sessions, job_id, "queued") if "reason" in e]


def test_two_nodes_run_a_job_to_success(node_settings, sessions, new_queue):
    q = new_queue()
    job = add_job(sessions, new_user(sessions), q, params={"epochs": 2, "fake_epoch_s": 0.3})
    n0, n1 = gang(job, node_settings, sessions)
    assert n0.join() == "succeeded"
    assert n1.join() == "node 1 exited 0"
    j = row(sessions, job)
    assert (j.status, j.attempt, j.lease_owner) == ("succeeded", 1, None)
    zero, one = slots(sessions, job)
    assert (zero.worker, one.worker) == ("w0", "w1")
    assert (one.exit_code, one.stop) == (0, None)
    store = ArtifactStore(node_settings.artifact_root)
    evs = events(sessions, job)
    assert [e.seq for e in evs] == list(range(1, len(evs) + 1))
    assert [e.payload["status"] for e in evs if e.payload.get("event") == "status"] == \
        ["queued", "running", "succeeded"]
    # node 0's engine events only, each once (node 1 writes none)
    assert [e.payload for e in evs if e.kind != "log" and e.payload.get("event") != "status"] \
        == engine_lines(store.run_dir(job))
    node1_log = (store.job_dir(job) / "train.node1.log").read_text()
    assert "fake engine node 1" in node1_log and node1_log.rstrip().endswith("done")
    assert json.loads((store.job_dir(job) / "job.node1.json").read_text())["resume"] is False


def test_a_cancel_stops_both_nodes(node_settings, sessions, new_queue):
    q = new_queue()
    job = add_job(sessions, new_user(sessions), q, params={"epochs": 50, "fake_epoch_s": 0.4})
    n0, n1 = gang(job, node_settings, sessions)
    pids = both_running(sessions, job)
    with sessions() as s:
        assert not request_cancel(session=s, job_id=job)  # running: cancelling
        s.commit()
    assert n0.join() == "cancelled"
    assert n1.join() == "node 1 exited 143"
    assert row(sessions, job).status == "cancelled"
    assert not any(pid_alive(p) for p in pids)
    one = slots(sessions, job)[1]
    # node 1 sees the cancel, or (if node 0 finished first) the attempt over
    assert one.exit_code == 143 and one.stop in ("cancel", "attempt over")


def test_a_failed_node_requeues_the_whole_attempt_then_fails_the_job(node_settings, sessions,
                                                                     new_queue):
    """Node 1's engine crashes (exit 1, a lost node: infrastructure): node 0 stops its engine
    and re-queues the job as one whole attempt on the infrastructure budget; once it is spent
    the job fails naming node 1. A node's data error (exit 3) is the job's own: it fails at
    once (test_a_node_data_error_fails_the_job_at_once)."""
    q = new_queue()
    settings = node_settings.model_copy(update={"max_infra_retries": 1})
    job = add_job(sessions, new_user(sessions), q,
                  params={"epochs": 50, "fake_epoch_s": 0.4, "fake_node_exit": 1})
    n0, n1 = gang(job, settings, sessions)
    assert n1.join() == "node 1 exited 1"
    assert n0.join() == "queued"
    j = row(sessions, job)
    assert (j.status, j.attempt, j.lease_owner) == ("queued", 1, None)
    assert (j.end_class, j.infra_retries) == ("infrastructure", 1)
    one = slots(sessions, job, 1)[1]
    assert (one.exit_code, one.stop) == (1, None) and "fatal: node 1 broke" in one.detail
    assert queued_reasons(sessions, job)[-1].startswith(
        "node 1 (worker w1) lost: its engine failed, exit code 1; its log ends: fatal: node 1 "
        "broke; re-queued for attempt 2 (infrastructure retry 1 of 1) on every node")
    # one wake-up per node to gather again, and one for the queue's gathering job as node
    # 0's run ends (the same job)
    assert n0.sent == [(job, q, 0)] * 3
    store = ArtifactStore(settings.artifact_root)
    # node 0 saves last.pt on its SIGTERM (unless it came before the engine's handler)
    resumes = (store.run_dir(job) / "weights" / "last.pt").exists()

    n0, n1 = gang(job, settings, sessions, attempt=2)
    assert n1.join() == "node 1 exited 1"
    assert n0.join() == "failed"
    j = row(sessions, job)
    assert (j.status, j.attempt) == ("failed", 2)
    assert j.error["reason"] == ("node 1 (worker w1) lost: its engine failed, exit code 1; its "
                                 "log ends: fatal: node 1 broke on attempt 2, after 1 "
                                 "infrastructure retries")
    for name in ("job.json", "job.node1.json"):  # every node resumes alike
        spec = json.loads((store.job_dir(job) / name).read_text())
        assert spec["resume"] == (str(store.run_dir(job) / "weights" / "last.pt") if resumes
                                  else False), (name, spec)


def test_a_node_data_error_fails_the_job_at_once(node_settings, sessions, new_queue):
    """Node 1's engine fails with a data error (exit 3): a job end, no re-queue."""
    q = new_queue()
    job = add_job(sessions, new_user(sessions), q,
                  params={"epochs": 50, "fake_epoch_s": 0.4, "fake_node_exit": 3})
    n0, n1 = gang(job, node_settings, sessions)
    assert n1.join() == "node 1 exited 3"
    assert n0.join() == "failed"
    j = row(sessions, job)
    assert (j.status, j.attempt, j.end_class) == ("failed", 1, "job")
    assert "exit code 3" in j.error["reason"] and j.error["exit_code"] == 3


def test_a_data_error_on_every_node_fails_the_job_at_once(node_settings, sessions, new_queue):
    """Every node's engine fails with exit 3 (bad data fails everywhere alike): no node was
    lost, so the job fails on its first attempt with node 0's engine error, not re-queued."""
    q = new_queue()
    job = add_job(sessions, new_user(sessions), q, params={"epochs": 2, "fake_exit": 3})
    n0, n1 = gang(job, node_settings, sessions)
    assert n1.join() == "node 1 exited 3"
    assert n0.join() == "failed"
    j = row(sessions, job)
    assert (j.status, j.attempt) == ("failed", 1)
    assert (j.error["reason"], j.error["exit_code"]) == ("data error", 3)
    assert j.error["engine_error"] == "DatasetError: data broke"
    assert queued_reasons(sessions, job) == []


@pytest.mark.parametrize("leaving", [0, 1])
def test_a_worker_shutdown_hands_the_job_back(node_settings, sessions, new_queue, leaving):
    """The worker of node ``leaving`` shuts down: both engines stop and the job is handed
    back (the attempt does not count, its slots are freed: the next attempt has the same
    number); two other workers then run it to the end."""
    q = new_queue()
    job = add_job(sessions, new_user(sessions), q, params={"epochs": 3, "fake_epoch_s": 0.4})
    n0, n1 = gang(job, node_settings, sessions)
    pids = both_running(sessions, job)
    (n0, n1)[leaving].stop.set()
    assert n1.join() == "node 1 exited 143"
    assert n0.join() == "queued"
    j = row(sessions, job)
    assert (j.status, j.attempt, j.lease_owner) == ("queued", 0, None)
    assert slots(sessions, job) == []
    assert queued_reasons(sessions, job)[-1].startswith(
        "node 1 (worker w1) lost: its engine was stopped (worker shutdown), exit code 143; "
        "re-queued, " if leaving else "worker shut down; re-queued, ")
    assert n0.sent[:2] == [(job, q, 0)] * 2  # one wake-up per node
    assert not any(pid_alive(p) for p in pids)

    n2 = Node(job, "w2", node_settings, sessions).start()
    wait_for(lambda: [n.worker for n in slots(sessions, job)] == ["w2"], what="w2 to take node 0")
    n3 = Node(job, "w3", node_settings, sessions).start()
    assert n2.join() == "succeeded" and n3.join() == "node 1 exited 0"
    j = row(sessions, job)
    assert (j.status, j.attempt) == ("succeeded", 1)
    assert [(n.worker, n.exit_code) for n in slots(sessions, job)] == [("w2", 0), ("w3", 0)]


def test_a_gang_that_never_completes_releases_its_slot(make_settings, db_url, sessions,
                                                       new_queue):
    """Only one worker comes: after gang_wait_s it gives its slot back, the job stays queued,
    a ``gang`` event says why, and a wake-up is put back on the queue."""
    settings = make_settings(db_url, worker_addr="127.0.0.1", heartbeat_s=0.2, gang_wait_s=1)
    q = new_queue()
    job = add_job(sessions, new_user(sessions), q)
    n0 = Node(job, "w0", settings, sessions).start()
    assert n0.join() == "skipped"
    j = row(sessions, job)
    assert (j.status, j.attempt) == ("queued", 0) and slots(sessions, job) == []
    assert gang_lines(sessions, job) == [
        "node 0 of 2 claimed by w0; 1 of 2 nodes gathered",
        "gang wait: 1 of 2 nodes after 1 s (gang_wait_s); w0 released node slot 0; the job "
        "stays queued"]
    assert n0.sent == [(job, q, 0)]


def test_a_worker_shutting_down_while_gathering_releases_its_slot(node_settings, sessions,
                                                                   new_queue):
    q = new_queue()
    job = add_job(sessions, new_user(sessions), q)
    n0 = Node(job, "w0", node_settings, sessions).start()
    wait_for(lambda: slots(sessions, job), what="w0 to take node 0")
    n0.stop.set()
    assert n0.join() == "skipped"
    assert row(sessions, job).status == "queued" and slots(sessions, job) == []
    assert gang_lines(sessions, job)[-1] == "worker w0 shutting down: node slot 0 released"
    assert n0.sent == [(job, q, 0)]


# -- submit through the API ----------------------------------------------------------------


@pytest.fixture(scope="module")
def api(db_url, tmp_path_factory):
    """A real API server (max_nodes 4) on the backend's database."""
    from service.app import create_app
    from service.settings import Settings

    home = tmp_path_factory.mktemp("gang-api")
    settings = Settings(home=home, database_url=db_url, broker_url="memory://",
                        reaper_enabled=False, max_nodes=4)
    app = create_app(settings)
    srv = ServerThread(app).start()
    srv.app, srv.sessions = app, app.state.sessions
    # outside the service's home: a dataset there is the service's own storage (refused)
    srv.data = str(write_data_yaml(tmp_path_factory.mktemp("gang-data") / "ds"))
    yield srv
    srv.stop()


@pytest.fixture
def sent(api, monkeypatch) -> list[dict[str, Any]]:
    """The ``run_job`` messages the API sends (kept here, not sent)."""
    out: list[dict[str, Any]] = []
    monkeypatch.setattr(api.app.state.celery, "send_task",
                        lambda name, args, **kw: out.append({"args": args, **kw}))
    return out


def submit(c, data: str, **over):
    body = {"kind": "train", "model": "yolo9-t", "data": data,
            "params": {"epochs": 1, "imgsz": 64, "batch": 4}, "gpus": 0} | over
    return c.post("/v1/jobs", json=body)


@pytest.mark.parametrize("over, field, words", [
    ({"nodes": 5}, "nodes", "nodes: 5 is more than this service allows (max_nodes=4)"),
    ({"nodes": 2, "kind": "profile"}, "nodes", "a profile job runs on one device of one host"),
    ({"nodes": 2, "params": {"epochs": 1, "preflight": True}}, "nodes", "a preflight runs"),
    ({"nodes": 2, "procs": 2, "params": {"epochs": 1, "batch": 6}}, "params.batch",
     "(procs=2 on each of nodes=2)"),
])
def test_submit_checks_nodes(api, sent, over, field, words):
    _, token = make_user(api.sessions)
    with client(api.url, token) as c:
        r = submit(c, api.data, **over)
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["field"] == field and words in body["detail"], body
        assert c.get("/v1/jobs").json()["data"] == [] and sent == []


def test_a_two_node_submit_sends_one_message_per_node(api, sent):
    """A 2-node job (2 ranks per node): two wake-ups; GET shows nodes, world_size and the
    nodes claimed so far."""
    _, token = make_user(api.sessions)
    with client(api.url, token) as c:
        r = submit(c, api.data, nodes=2, procs=2, params={"epochs": 1, "batch": 8})
        assert r.status_code == 201, r.text
        job = r.json()
        assert (job["nodes"], job["world_size"], job["node_workers"]) == (2, 4, [])
        assert [m["args"] for m in sent] == [[job["id"]], [job["id"]]]
        assert {m["queue"] for m in sent} == {"cpu"}
        with api.sessions() as s:
            got = claim(s, "cpu", "w0", api.app.state.settings, job_id=job["id"], where=at(41000))
        assert got == Claim(job["id"], 0, 1, 2, False)
        view = c.get(f"/v1/jobs/{job['id']}").json()
        assert (view["status"], view["nodes"], view["world_size"]) == ("queued", 2, 4)
        assert view["node_workers"] == [{"node_rank": 0, "worker": "w0", "host": "host-x",
                                         "addr": "127.0.0.1", "exit_code": None, "stop": None}]
        one = submit(c, api.data, procs=2).json()
        assert (one["nodes"], one["world_size"], one["node_workers"]) == (1, 2, None)
        for j in (job, one):  # no queued job left for later tests
            assert c.post(f"/v1/jobs/{j['id']}/cancel").json()["status"] == "cancelled"
