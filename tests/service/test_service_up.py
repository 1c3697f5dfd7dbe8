"""``libreyolo-service up``: its help, and the admin token it reuses or saves per URL."""

from __future__ import annotations

import json

from typer.testing import CliRunner


def test_up_help_is_plain_text_with_values():
    from service.cli import MAX_RESTARTS, RESTART_WINDOW_S, app

    r = CliRunner().invoke(app, ["up", "--help"], env={"COLUMNS": "100"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "``" not in r.stdout and "MAX_RESTARTS" not in r.stdout
    assert f"up to {MAX_RESTARTS} times in {RESTART_WINDOW_S:.0f} s" in text, text


def test_second_up_reuses_the_token_and_keeps_other_services(tmp_path, monkeypatch):
    from service.cli import _admin_token
    from service.credentials import save_credentials
    from service.db.migrate import upgrade
    from service.settings import Settings

    creds = tmp_path / "credentials"
    settings = Settings(home=tmp_path / "home", broker_url="memory://", credentials_path=creds)
    settings.ensure_dirs()
    upgrade(settings.database_url)
    first, reused = _admin_token(settings, "http://127.0.0.1:8000")
    assert not reused
    save_credentials(creds, "http://127.0.0.1:8000", first)
    again, reused = _admin_token(settings, "http://127.0.0.1:8000")
    assert (again, reused) == (first, True)  # no new admin token on every start
    other, reused = _admin_token(settings, "http://127.0.0.1:8001")
    assert other != first and not reused
    assert save_credentials(creds, "http://127.0.0.1:8001", other) == "http://127.0.0.1:8000"
    saved = json.loads(creds.read_text())
    assert saved["url"] == "http://127.0.0.1:8000" and saved["token"] == first
    assert saved["services"] == {"http://127.0.0.1:8000": first, "http://127.0.0.1:8001": other}
    # a token this database does not know (another home's) is not reused
    fresh = Settings(home=tmp_path / "home2", broker_url="memory://", credentials_path=creds)
    fresh.ensure_dirs()
    upgrade(fresh.database_url)
    new, reused = _admin_token(fresh, "http://127.0.0.1:8000")
    assert new != first and not reused
