"""How an attempt ended, shown everywhere: ``GET /v1/jobs/{id}``, the job's status events,
the job page and ``jobs show`` name the class (infrastructure / job / user) and why."""

from __future__ import annotations

from testkit import client, make_user, queued_job
from typer.testing import CliRunner


def test_an_infrastructure_end_and_a_cancel_are_named_everywhere(server, sessions):
    from service.db.models import User, utcnow
    from service.job_store import expire, expired_leases
    from service.lifecycle import CLAIM
    from service.ops import transition

    name, token = make_user(sessions)
    with sessions() as s:
        owner = s.query(User).filter_by(name=name).one().id
    job_id = queued_job(sessions, owner, queue="q-ends")
    with sessions() as s:  # a worker claimed it and died: its lease ran out
        transition(s, job_id, CLAIM, attempt=1, lease_owner="gone:1", lease_expires_at=utcnow())
        s.commit()
    settings = server.app.state.settings
    with sessions() as s:  # the reaper's step for this job alone (the database is shared)
        [lease] = [r for r in expired_leases(session=s, now=utcnow()) if r.id == job_id]
        assert expire(session=s, lease=lease, now=utcnow(), store=server.app.state.store,
                      max_infra_retries=settings.max_infra_retries) == "queued"
        s.commit()
    with client(server.url, token) as c:
        job = c.get(f"/v1/jobs/{job_id}").json()
        assert (job["status"], job["end_class"], job["end_reason"], job["infra_retries"]) == \
            ("queued", "infrastructure", "lease expired (worker lost)", 1)
        evs = c.get(f"/v1/jobs/{job_id}/events", params={"limit": 100}).json()["data"]
        last = [e["data"] for e in evs if e["data"].get("event") == "status"][-1]
        assert (last["end_class"], last["why"]) == ("infrastructure", "lease expired (worker lost)")
        page = c.get(f"/jobs/{job_id}").text
        assert 'id="end-class"' in page and "lease expired (worker lost)" in page
        assert "1 infrastructure re-queue, not counted" in page

        from service.cli import app as cli_app

        env = {"LIBREYOLO_URL": server.url, "LIBREYOLO_TOKEN": token, "LIBREYOLO_NO_BROWSER": "1"}
        shown = CliRunner().invoke(cli_app, ["jobs", "show", job_id], env=env)
        assert shown.exit_code == 0, shown.output
        assert "ended:    infrastructure: lease expired (worker lost) (1 infrastructure " \
               "re-queue)" in shown.stdout, shown.stdout
        # the status line too, as the page says it (a re-queue costs no attempt)
        assert "(attempt 1/3; 1 infrastructure re-queue, not counted)" in shown.stdout, shown.stdout

        assert c.post(f"/v1/jobs/{job_id}/cancel").status_code in (200, 202)
        job = c.get(f"/v1/jobs/{job_id}").json()
        assert (job["status"], job["end_class"], job["end_reason"]) == \
            ("cancelled", "user", "cancelled while queued")
