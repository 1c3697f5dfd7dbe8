"""Browser-test fixtures: a real service (uvicorn thread, SQLite) whose worker threads run
the fake engine of tests/service/testkit.py (or the real engine for one profile job), and
Debian's Chromium driven by Playwright (sync API).

Every page a test opens records its console errors and requests; the ``web`` fixture
asserts at teardown that there was no console error and no request to another origin.
Screenshots go to ``tests/browser/screenshots/`` (ignored by git).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))

from testkit import ServerThread, fake_engine, fresh_database, make_user  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SHOTS = Path(__file__).resolve().parent / "screenshots"
LAPTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}


class Stack:
    """The API on a port, its settings and sessions, users, and background worker runs."""

    def __init__(self, settings: Any, app: Any, srv: ServerThread):
        self.settings, self.srv, self.app = settings, srv, app
        self.url = srv.url
        self.sessions = app.state.sessions
        self.threads: list[threading.Thread] = []

    def user(self, admin: bool = False) -> tuple[str, str]:
        """A new user: (name, token)."""
        return make_user(self.sessions, admin=admin)

    def run(self, job_id: str, real: bool = False, **env: str) -> threading.Thread:
        """Play the worker for one job in a thread: the fake engine with knobs ``env``
        (``FAKE_EPOCH_S``, ``FAKE_STEPS``, ``FAKE_EXIT``), or the real engine."""
        from worker.runner import run_job

        settings = self.settings
        if real:
            settings = settings.model_copy(update={"engine_command": None,
                                                   "engine_python": sys.executable})
        elif env:
            cmd = ["env", *(f"{k}={v}" for k, v in env.items()), *settings.engine_command]
            settings = settings.model_copy(update={"engine_command": cmd})
        t = threading.Thread(target=run_job, args=(job_id,), daemon=True,
                             kwargs={"settings": settings, "sessions": self.sessions})
        t.start()
        self.threads.append(t)
        return t

    def restart(self, down_s: float = 1.0) -> None:
        """Stop the API (open streams are cut) and start a new one on the same port."""
        import time

        from service.app import create_app

        self.srv.stop()
        time.sleep(down_s)
        self.srv = ServerThread(create_app(self.settings), port=self.srv.port).start()


@pytest.fixture(scope="session")
def stack(tmp_path_factory) -> Iterator[Stack]:
    from service.app import create_app
    from service.settings import Settings

    tmp = tmp_path_factory.mktemp("browser")
    with fresh_database("sqlite", tmp) as url:
        settings = Settings(home=tmp / "home", database_url=url, broker_url="memory://",
                            engine_command=fake_engine(tmp), reaper_enabled=False,
                            sse_poll_s=0.05, sse_ping_s=5, lease_s=10, heartbeat_s=0.5,
                            poll_interval_s=0.05, grace_s=5,
                            credentials_path=tmp / "unused-credentials")
        app = create_app(settings)
        st = Stack(settings, app, ServerThread(app).start())
        yield st
        for t in st.threads:
            t.join(30)
        st.srv.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # Module scope: sync Playwright runs an event loop in this thread until it exits, and
    # a loop left running would break asyncio.run() in tests collected after this folder.
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


class Web:
    """Browser contexts of one test; records console errors and off-origin requests."""

    def __init__(self, browser: Any, stack: Stack):
        self.browser, self.stack = browser, stack
        self.origin = stack.url
        self.console_errors: list[str] = []
        self.foreign: list[str] = []
        self.contexts: list[Any] = []
        #: console messages a test expects (e.g. the 404 of a page it opens on purpose).
        self.allowed_errors: list[str] = []

    def _watch(self, page: Any) -> None:
        page.on("console", lambda m: self.console_errors.append(f"{page.url}: {m.text}")
                if m.type == "error" else None)
        page.on("pageerror", lambda e: self.console_errors.append(f"{page.url}: {e}"))
        page.on("request", self._request)

    def _request(self, req: Any) -> None:
        parts = urlsplit(req.url)
        if parts.scheme in ("data", "blob", "about"):
            return
        if f"{parts.scheme}://{parts.netloc}" != self.origin:
            self.foreign.append(req.url)

    def page(self, token: str | None = None, viewport: dict | None = None) -> Any:
        """A page in a new context (own cookies), signed in with ``token`` when given."""
        ctx = self.browser.new_context(viewport=viewport or LAPTOP, base_url=self.origin)
        ctx.set_default_timeout(15_000)
        ctx.on("page", self._watch)
        self.contexts.append(ctx)
        page = ctx.new_page()
        if token:
            self.sign_in(page, token)
        return page

    def sign_in(self, page: Any, token: str) -> None:
        page.goto("/signin")
        page.get_by_label("API token").fill(token)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url("**/jobs")

    def errors(self) -> list[str]:
        return [e for e in self.console_errors
                if not any(a in e for a in self.allowed_errors)]

    def close(self) -> None:
        for ctx in self.contexts:
            ctx.close()


@pytest.fixture
def web(browser, stack) -> Iterator[Web]:
    """Pages for one test; at the end: no console error, no request to another origin."""
    w = Web(browser, stack)
    try:
        yield w
    finally:
        w.close()
    assert w.errors() == [], f"console errors: {w.errors()}"
    assert w.foreign == [], f"requests to other origins: {w.foreign}"


@pytest.fixture
def shot():
    """``shot(page, name)``: save a full-page screenshot under tests/browser/screenshots/."""
    SHOTS.mkdir(exist_ok=True)

    def take(page: Any, name: str) -> Path:
        path = SHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


@pytest.fixture
def data_yaml(tmp_path) -> str:
    from testkit import write_data_yaml

    return str(write_data_yaml(tmp_path / "ds"))
