"""A worker whose disk is below ``min_free_disk_mb`` starts no job: the job stays queued
with the reason in its ``waiting`` field (API, ``jobs show``, the jobs page), the wake-up
is sent again, and a worker with room takes the job (real runs, fake engine, the real free
space of the disk: the floors are set above and below it)."""

from __future__ import annotations

import shutil

from testkit import make_user, queued_job

from service.db.models import Job, User, utcnow
from worker.runner import low_disk, run_next


def test_a_worker_below_the_disk_floor_leaves_the_job_to_one_with_room(
        make_settings, db_url, sessions, new_queue, tmp_path):
    from service.api.jobs import job_public
    from service.web.views import job_progress

    free_mb = shutil.disk_usage(tmp_path).free / 2**20  # the disk of artifact_root
    full = make_settings(db_url, min_free_disk_mb=free_mb * 4, disk_recheck_s=0.1)
    roomy = make_settings(db_url, min_free_disk_mb=1)
    assert low_disk(full) is not None and low_disk(roomy) is None
    name, _ = make_user(sessions)
    with sessions() as s:
        owner = s.query(User).filter_by(name=name).one().id
    q = new_queue()
    job_id = queued_job(sessions, owner, queue=q, params={"epochs": 1}, sent_at=utcnow())
    sent: list[tuple] = []
    assert run_next(job_id, settings=full, sessions=sessions, worker_id="w-full",
                    on_requeue=lambda *m: sent.append(m)) == "skipped"
    assert sent == [(job_id, q, 0)]  # the wake-up again, for a worker with room
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job.status == "queued" and job.attempt == 0
        waiting = job_public(job, {q: 1}).waiting
        page_text = job_progress(job, {q: 1})[1]
    assert waiting is not None and "w-full" in waiting and "min_free_disk_mb" in waiting, waiting
    assert waiting in page_text
    assert run_next(sent[0][0], settings=roomy, sessions=sessions,
                    worker_id="w-roomy") == "succeeded"
    with sessions() as s:
        job = s.get(Job, job_id)
        assert job.attempt == 1 and job.waiting_note is None
