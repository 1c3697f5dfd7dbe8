"""Fair-share scheduling (service/scheduler.py) on SQLite and PostgreSQL: the claim order,
per-user caps under concurrent workers, aging, wake-ups when a cap frees, the queue outlook.

Each test uses a queue of its own (the scheduler works per queue) and new users, so jobs
other tests leave queued in the shared database do not take part.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from testkit import make_user, queued_job, wait_for

from service.db.models import Job, User, WorkerRow, utcnow
from service.lifecycle import ACTIVE, CLAIM, FINISH
from service.ops import transition
from service.reaper import reap_once
from service.scheduler import (
    claim,
    claim_order,
    effective_priority,
    outlook,
    predicted_order,
    read_queue,
)
from service.users import set_user_cap
from worker.runner import run_job, run_next


def new_user(sessions, cap: int | None = None) -> tuple[str, str]:
    """(user id, name) of a new user, with its own cap when given."""
    name, _ = make_user(sessions)
    with sessions() as s:
        if cap is not None:
            set_user_cap(s, name, cap)
            s.commit()
        return s.query(User).filter_by(name=name).one().id, name


def add_job(sessions, owner: str, queue: str, priority: int = 0, params=None, **over) -> str:
    return queued_job(sessions, owner, queue=queue, priority=priority,
                      params=params or {"epochs": 1}, sent_at=utcnow(), **over)


def _id(got) -> str | None:
    return None if got is None else got.job_id


def take(sessions, queue: str, settings, worker: str = "w1", **kw) -> str | None:
    with sessions() as s:
        return _id(claim(s, queue, worker, settings, **kw))


def finish(sessions, job_id: str, status: str = "succeeded") -> None:
    with sessions() as s:
        assert transition(s, job_id, FINISH, status, finished_at=utcnow(), lease_owner=None,
                          lease_expires_at=None)
        s.commit()


def row(sessions, job_id: str) -> Job:
    with sessions() as s:
        return s.get(Job, job_id)


def running_of(sessions, owner: str) -> int:
    with sessions() as s:
        return s.query(Job).filter(Job.owner_id == owner, Job.status.in_(ACTIVE)).count()


def test_fair_share_the_other_users_job_starts_next(settings, sessions, new_queue):
    """User A queues 10 jobs, then user B queues 1, on one worker: B's job starts right
    after the one that is running, then A's others in their order."""
    q = new_queue()
    a, _ = new_user(sessions)
    b, _ = new_user(sessions)
    a_jobs = [add_job(sessions, a, q) for _ in range(10)]
    first = take(sessions, q, settings)
    assert first == a_jobs[0]
    b_job = add_job(sessions, b, q)
    with sessions() as s:  # what GET /v1/jobs/{id} says while A's first job runs
        where = outlook(s, settings, [q], {q: 1})
    assert where[b_job].position == 1 and where[a_jobs[1]].position == 2
    assert [where[j].position for j in a_jobs[1:]] == list(range(2, 11))
    order = [first]
    while True:  # one worker: the running job ends, then it claims the next
        finish(sessions, order[-1])
        nxt = take(sessions, q, settings)
        if nxt is None:
            break
        order.append(nxt)
    assert order == [a_jobs[0], b_job, *a_jobs[1:]]
    assert all(row(sessions, j).attempt == 1 for j in order)


def test_fewest_running_jobs_first_across_queues(settings, sessions, new_queue):
    """The owner's running jobs count over every queue: A runs a job in another queue, so
    B's younger job goes before A's older one."""
    q, other = new_queue(), new_queue()
    a, _ = new_user(sessions)
    b, _ = new_user(sessions)
    add_job(sessions, a, other)
    assert take(sessions, other, settings) is not None
    a_job = add_job(sessions, a, q)
    b_job = add_job(sessions, b, q)
    assert take(sessions, q, settings) == b_job
    assert take(sessions, q, settings) == a_job


def test_priority_first_then_oldest(settings, sessions, new_queue):
    q = new_queue()
    a, _ = new_user(sessions)
    low = add_job(sessions, a, q, priority=1)
    high = add_job(sessions, a, q, priority=7)
    assert take(sessions, q, settings) == high
    assert take(sessions, q, settings) == low


def test_cap_holds_while_another_users_job_waits(make_settings, db_url, sessions, new_queue):
    """A user at their cap gets no second running job; another user's job is taken
    instead; raising the cap (the admin's command) lets the held job start."""
    settings = make_settings(db_url, max_running_per_user=1)
    q = new_queue()
    a, a_name = new_user(sessions)  # cap from the setting: 1
    b, _ = new_user(sessions)
    a1, a2 = add_job(sessions, a, q), add_job(sessions, a, q)
    b1 = add_job(sessions, b, q)
    assert take(sessions, q, settings, "w1") == a1
    assert take(sessions, q, settings, "w2") == b1  # not a2, though it is older
    assert take(sessions, q, settings, "w3") is None  # a2 waits: A is at the cap
    # a direct run of the held job is refused the same way, and leaves it queued
    assert run_job(a2, settings=settings, sessions=sessions) == "skipped"
    assert row(sessions, a2).status == "queued" and row(sessions, a2).attempt == 0
    assert running_of(sessions, a) == 1
    with sessions() as s:
        assert outlook(s, settings, [q], {q: 3})[a2].estimated_start is None  # waits for the cap
        set_user_cap(s, a_name, 2)
        s.commit()
    assert take(sessions, q, settings, "w3") == a2
    assert running_of(sessions, a) == 2


def _at_once(db_url: str, calls) -> list:
    """Run ``calls`` (each ``f(session)``) in threads with a connection each, released
    together by a barrier; their results in order. Errors are raised."""
    from service.db.session import make_engine, make_session_factory

    engines = [make_engine(db_url) for _ in calls]
    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            with make_session_factory(engines[i])() as s:
                s.connection()  # connected before the barrier
                barrier.wait(30)
                results[i] = calls[i](s)
        except BaseException as exc:  # raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for e in engines:
        e.dispose()
    assert not errors, errors
    return results


def test_concurrent_claims_keep_the_cap_and_never_double_claim(make_settings, db_url, sessions,
                                                               new_queue):
    """Six workers claim six different jobs of A (cap 2) at the same instant: two win.
    Then four workers claim the best job at once: B's two jobs are taken, each once, and
    A's held jobs stay queued."""
    settings = make_settings(db_url, max_running_per_user=0)  # no cap but A's own
    q = new_queue()
    a, _ = new_user(sessions, cap=2)
    b, _ = new_user(sessions)
    a_jobs = [add_job(sessions, a, q) for _ in range(6)]
    b_jobs = [add_job(sessions, b, q) for _ in range(2)]
    got = _at_once(db_url, [lambda s, j=j, i=i: _id(claim(s, q, f"w{i}", settings, job_id=j))
                            for i, j in enumerate(a_jobs)])
    won = [j for j in got if j is not None]
    assert len(won) == 2 and running_of(sessions, a) == 2
    got = _at_once(db_url, [lambda s, i=i: _id(claim(s, q, f"v{i}", settings)) for i in range(4)])
    claimed = [j for j in got if j is not None]  # losers read again: none gives up early
    assert sorted(claimed) == sorted(b_jobs) and running_of(sessions, a) == 2
    assert take(sessions, q, settings, "late") is None  # A's four others wait for the cap
    assert all(row(sessions, j).attempt == 1 for j in won + claimed)
    statuses = [e.payload["status"] for e in _events(sessions, claimed[0])]
    assert statuses == ["queued", "running"]  # one transition, one status event


def _events(sessions, job_id):
    from service.db.models import JobEvent

    with sessions() as s:
        return list(s.query(JobEvent).filter_by(job_id=job_id).order_by(JobEvent.seq))


def test_effective_priority_rises_with_age_up_to_nine():
    t0 = utcnow()
    assert effective_priority(0, t0, t0, 15) == 0
    assert effective_priority(0, t0, t0 + timedelta(minutes=44), 15) == 2
    assert effective_priority(3, t0, t0 + timedelta(minutes=45), 15) == 6
    assert effective_priority(0, t0, t0 + timedelta(days=3), 15) == 9
    assert effective_priority(9, t0, t0 + timedelta(days=3), 15) == 9


def test_aging_old_low_priority_job_outranks_new_high_priority(make_settings, db_url, sessions,
                                                               new_queue):
    """With +1 priority per 0.3 s of waiting, a priority-0 job queued 2 s before a
    priority-5 job goes first; at the default rate (+1 per 15 min) the new one would."""
    fast = make_settings(db_url, aging_minutes=0.005)
    slow = make_settings(db_url)
    q = new_queue()
    a, _ = new_user(sessions)
    b, _ = new_user(sessions)
    old = add_job(sessions, a, q, priority=0)
    time.sleep(2.0)
    new = add_job(sessions, b, q, priority=5)
    with sessions() as s:
        snap = read_queue(s, q, slow)
        assert [w.id for w in claim_order(snap, slow.aging_minutes)] == [new, old]
        snap = read_queue(s, q, fast)
        ranked = claim_order(snap, fast.aging_minutes)
        assert [w.id for w in ranked] == [old, new]
        assert effective_priority(0, ranked[0].enqueued_at, snap.now, fast.aging_minutes) >= 6
    assert take(sessions, q, fast) == old
    assert take(sessions, q, fast) == new


def test_message_for_a_claimed_job_and_wake_up_when_the_cap_frees(make_settings, db_url,
                                                                  sessions, new_queue):
    """Real runs (fake engine). A (cap 1) has two jobs: the first runs; the second's
    message wakes another worker, which finds nothing it may start and goes back to
    waiting, as does a duplicate of the first's message. When the first ends, its worker
    sends a wake-up, and the held job runs."""
    settings = make_settings(db_url, max_running_per_user=1)
    q = new_queue()
    a, _ = new_user(sessions)
    a1 = add_job(sessions, a, q, params={"epochs": 2, "fake_epoch_s": 0.5})
    a2 = add_job(sessions, a, q, params={"epochs": 1})
    sent: list[tuple] = []
    out: dict[str, str] = {}
    w1 = threading.Thread(target=lambda: out.setdefault("w1", run_next(
        a1, settings=settings, sessions=sessions, worker_id="w1",
        on_requeue=lambda *m: sent.append(m))))
    w1.start()
    wait_for(lambda: row(sessions, a1).status == "running", what="a1 to run")
    assert run_next(a2, settings=settings, sessions=sessions, worker_id="w2") == "skipped"
    assert run_next(a1, settings=settings, sessions=sessions, worker_id="w2") == "skipped"
    assert row(sessions, a2).status == "queued" and row(sessions, a2).attempt == 0
    w1.join(60)
    assert out["w1"] == "succeeded"
    assert sent == [(a2, q, 0)]  # the wake-up for A's held job
    assert run_next(sent[0][0], settings=settings, sessions=sessions, worker_id="w2") == "succeeded"
    assert row(sessions, a2).attempt == 1


def test_reaper_wakes_held_jobs_and_resends_without_resetting_age(settings, sessions, new_queue):
    q = new_queue()
    a, _ = new_user(sessions, cap=1)
    dead = add_job(sessions, a, q)
    held = add_job(sessions, a, q)
    with sessions() as s:  # a worker claimed it with its infrastructure budget spent, and died
        transition(s, dead, CLAIM, attempt=3, lease_owner="dead:1",
                   lease_expires_at=utcnow(), infra_retries=settings.max_infra_retries)
        s.get(Job, held).sent_at = utcnow() - timedelta(days=1)
        s.commit()
    enqueued = row(sessions, held).enqueued_at
    sent: list[tuple] = []
    counts = reap_once(sessions, settings, lambda *m: sent.append(m))
    assert counts["failed"] == 1 and counts["woken"] == 1
    assert sent.count((held, q, 0)) == 2  # re-sent (its message is old) and woken
    after = row(sessions, held)
    assert after.enqueued_at == enqueued  # the scheduler's age is kept
    assert after.sent_at > enqueued
    assert reap_once(sessions, settings, lambda *m: sent.append(m))["resent"] == 0


def test_outlook_positions_and_estimated_starts(settings, sessions, new_queue):
    """Queue position and estimated start: one live worker busy for 30 s more (the running
    job's eta_s), jobs of this queue lasting 100 s (a finished one), A before B before A."""
    q = new_queue()
    a, _ = new_user(sessions)
    b, _ = new_user(sessions)
    c, _ = new_user(sessions)
    now = utcnow()
    past = add_job(sessions, c, q)
    running = add_job(sessions, c, q)
    with sessions() as s:
        transition(s, past, CLAIM, started_at=now - timedelta(seconds=300))
        transition(s, past, FINISH, "succeeded", finished_at=now - timedelta(seconds=200))
        transition(s, running, CLAIM, started_at=now, lease_owner="w",
                   lease_expires_at=now + timedelta(minutes=5), progress={"eta_s": 30.0})
        s.commit()
    a1, a2 = add_job(sessions, a, q), add_job(sessions, a, q)
    b1 = add_job(sessions, b, q)
    with sessions() as s:
        view = outlook(s, settings, [q], {q: 1}, now=now)
        assert [view[j].position for j in (a1, b1, a2)] == [1, 2, 3]
        assert [(view[j].estimated_start - now).total_seconds() for j in (a1, b1, a2)] == \
            pytest.approx([30, 130, 230])
        assert all(view[j].effective_priority == 0 for j in (a1, b1, a2))
        # two workers: the idle one starts A's job at once
        two = outlook(s, settings, [q], {q: 2}, now=now)
        assert [(two[j].estimated_start - now).total_seconds() for j in (a1, b1, a2)] == \
            pytest.approx([0, 30, 100])
        # no live worker: no estimate, positions all the same
        none = outlook(s, settings, [q], {}, now=now)
        assert none[b1].position == 2 and none[b1].estimated_start is None
        # predicted order agrees with the positions
        order = predicted_order(read_queue(s, q, settings, now=now), settings.aging_minutes)
        assert [w.id for w, _ in order] == [a1, b1, a2]


def test_outlook_without_history_or_eta_is_unknown(settings, sessions, new_queue):
    q = new_queue()
    a, _ = new_user(sessions)
    running = add_job(sessions, a, q)
    with sessions() as s:
        transition(s, running, CLAIM, started_at=utcnow(), lease_owner="w",
                   lease_expires_at=utcnow() + timedelta(minutes=5))
        s.commit()
    waiting = add_job(sessions, a, q)
    with sessions() as s:
        s.add(WorkerRow(name=f"w-{q}", host="h", pid=1, queues=[q], gpus=0))
        s.commit()
        from service.workers import live_queues

        live = live_queues(s, settings.worker_ttl_s)
        assert live[q] == 1
        view = outlook(s, settings, [q], live)
        assert view[waiting].position == 1 and view[waiting].estimated_start is None
        s.query(WorkerRow).filter_by(name=f"w-{q}").delete()
        s.commit()


def test_whole_claim_of_a_cluster_launcher_and_slurms_fair_share(settings, sessions, new_queue):
    """A cluster launcher (whole=True) claims a 3-node job as one (no gang, no live worker
    count); with slurm_fair_share 'ours' the owner's cap holds, with 'slurm' it does not
    (Slurm's fair share decides)."""
    q = new_queue()
    a, _ = new_user(sessions, cap=1)
    big = add_job(sessions, a, q, nodes=3, params={"epochs": 1, "batch": 3})
    second = add_job(sessions, a, q)
    with sessions() as s:
        got = claim(s, q, "w1", settings, whole=True)
    assert got is not None and (got.job_id, got.nodes, got.started, got.whole) == (big, 3, True, True)
    assert row(sessions, big).status == "running" and row(sessions, big).attempt == 1
    assert take(sessions, q, settings, whole=True) is None  # ours: the cap of 1 holds
    theirs = settings.model_copy(update={"slurm_fair_share": "slurm"})
    assert take(sessions, q, theirs, whole=True) == second
