"""Tokens can be listed, revoked and expire (issue 27, section 6): ``libreyolo-service
token list | revoke | create --expires-in`` and ``/v1/admin/tokens``, on real servers; a
revoked token is refused by every API process within TOKEN_CACHE_S (one second)."""

from __future__ import annotations

import time

import pytest
from testkit import ServerThread, client, make_user, wait_for
from typer.testing import CliRunner

from service.users import TOKEN_CACHE_S


@pytest.fixture(scope="module")
def second_server(api_settings):
    """Another API process on the same database (its own token cache)."""
    from service.app import create_app

    srv = ServerThread(create_app(api_settings)).start()
    yield srv
    srv.stop()


def _cli(api_settings, *args):
    from service.cli import app

    env = {"LIBREYOLO_HOME": str(api_settings.home),
           "LIBREYOLO_DATABASE_URL": api_settings.database_url, "COLUMNS": "200"}
    r = CliRunner().invoke(app, list(args), env=env)
    assert r.exit_code == 0, r.output
    return r.stdout


def test_cli_token_create_list_revoke_refused_by_every_process(api_settings, server, second_server):
    name = f"cli-{time.time_ns()}"
    token = _cli(api_settings, "token", "create", "--name", name, "--expires-in", "30d").strip()
    with client(server.url, token) as one, client(second_server.url, token) as two:
        assert one.get("/v1/jobs").status_code == 200 and two.get("/v1/jobs").status_code == 200
        listed = [ln for ln in _cli(api_settings, "token", "list", "--user", name).splitlines()[1:]]
        assert len(listed) == 1 and " active " in listed[0] and token not in listed[0]
        token_id = listed[0].split()[0]
        assert _cli(api_settings, "token", "revoke", token_id).strip() == f"revoked {token_id}"
        revoked_at = time.monotonic()
        # both processes had the token cached: each refuses it once its entry is older
        # than TOKEN_CACHE_S
        wait_for(lambda: one.get("/v1/jobs").status_code == 401, timeout=10, interval=0.05)
        wait_for(lambda: two.get("/v1/jobs").status_code == 401, timeout=10, interval=0.05)
        print(f"revoked token refused by both processes after {time.monotonic() - revoked_at:.2f} s "
              f"(TOKEN_CACHE_S={TOKEN_CACHE_S})")
        assert " revoked " in _cli(api_settings, "token", "list", "--user", name)
        assert "revoked already" in _cli(api_settings, "token", "revoke", token_id)


def test_admin_endpoints_create_list_revoke_and_expiry(server, second_server, sessions):
    _, admin_token = make_user(sessions, admin=True)
    _, plain = make_user(sessions)
    with client(server.url, admin_token) as admin, client(server.url, plain) as user:
        for r in (user.get("/v1/admin/tokens"), user.post("/v1/admin/tokens", json={"user": "x"}),
                  user.post("/v1/admin/tokens/tnope/revoke")):
            assert r.status_code == 403, r.text
        name = f"api-{time.time_ns()}"
        made = admin.post("/v1/admin/tokens", json={"user": name, "name": "ci"})
        assert made.status_code == 201 and made.json()["state"] == "active", made.text
        token, token_id = made.json()["token"], made.json()["id"]
        listed = admin.get("/v1/admin/tokens", params={"user": name}).json()["data"]
        assert [t["id"] for t in listed] == [token_id] and "token" not in listed[0]
        with client(server.url, token) as c, client(second_server.url, token) as c2:
            assert c.get("/v1/jobs").status_code == 200 and c2.get("/v1/jobs").status_code == 200
            r = admin.post(f"/v1/admin/tokens/{token_id}/revoke")
            assert r.status_code == 200 and r.json()["state"] == "revoked", r.text
            assert c.get("/v1/jobs").status_code == 401  # the revoking process: at once
            wait_for(lambda: c2.get("/v1/jobs").status_code == 401, timeout=10, interval=0.05)
        assert admin.post("/v1/admin/tokens/tnope/revoke").status_code == 404
        assert admin.get("/v1/admin/tokens", params={"user": "nobody-here"}).status_code == 404
        assert admin.post("/v1/admin/tokens", json={"user": "a\nb"}).status_code == 422
        r = admin.post("/v1/admin/tokens", json={"user": "   "})
        assert r.status_code == 422 and "blank" in r.text, r.text
        # expiry
        short = admin.post("/v1/admin/tokens", json={"user": name, "expires_in_s": 1.5}).json()
        assert short["expires_at"] is not None
        with client(server.url, short["token"]) as c:
            assert c.get("/v1/jobs").status_code == 200
            wait_for(lambda: c.get("/v1/jobs").status_code == 401, timeout=10, interval=0.1)
        states = {t["id"]: t["state"] for t in admin.get("/v1/admin/tokens", params={"user": name}).json()["data"]}
        assert states == {token_id: "revoked", short["id"]: "expired"}
