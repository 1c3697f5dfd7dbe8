"""Cookie sign-in of the web pages against the API: CSRF guard, bearer unchanged (no browser).

A cookie-authenticated unsafe request (POST) must come from this service's pages: the
``Origin`` (or ``Referer``) names this host and ``Sec-Fetch-Site``, when sent, is
``same-origin``. Bearer requests are untouched.
"""

from __future__ import annotations

import re

import httpx
import pytest
from testkit import client

from service.web.routes import PAGE_CSP


@pytest.fixture
def signed_in(stack):
    """(token, httpx client holding the sign-in cookie, no Authorization header)."""
    _, token = stack.user()
    c = httpx.Client(base_url=stack.url, timeout=30, follow_redirects=False)
    r = c.post("/signin", data={"token": token, "next": "/jobs"},
               headers={"Origin": stack.url})
    assert r.status_code == 303 and r.headers["location"] == "/jobs"
    set_cookie = r.headers["set-cookie"].lower()
    assert "httponly" in set_cookie and "samesite=strict" in set_cookie
    yield token, c
    c.close()


def _job(data_yaml: str) -> dict:
    return {"kind": "train", "model": "yolo9-t", "data": data_yaml, "gpus": 0,
            "params": {"epochs": 1}}


def test_cookie_reads_work_and_pages_send_the_csp(stack, signed_in):
    _, c = signed_in
    assert c.get("/v1/jobs").status_code == 200
    page = c.get("/jobs")
    assert page.status_code == 200 and page.headers["content-security-policy"] == PAGE_CSP
    assert "unsafe-inline" not in PAGE_CSP
    assert re.search(r"<script(?![^>]*\bsrc=)", page.text) is None  # no inline script
    assert re.search(r"\son[a-z]+\s*=", page.text) is None  # no inline event handler


def test_cookie_post_needs_this_origin(stack, signed_in, data_yaml):
    token, c = signed_in
    refused = [
        {},  # neither Origin nor Referer
        {"Origin": "https://evil.example"},
        {"Referer": "https://evil.example/page"},
        {"Origin": stack.url, "Sec-Fetch-Site": "cross-site"},
        {"Origin": "null"},
    ]
    for headers in refused:
        r = c.post("/v1/jobs", json=_job(data_yaml), headers=headers)
        assert r.status_code == 403, (headers, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
    with client(stack.url, token) as bearer:
        assert bearer.get("/v1/jobs").json()["data"] == []  # nothing was queued
    ok = c.post("/v1/jobs", json=_job(data_yaml),
                headers={"Origin": stack.url, "Sec-Fetch-Site": "same-origin"})
    assert ok.status_code == 201, ok.text
    via_referer = c.post(f"/v1/jobs/{ok.json()['id']}/cancel",
                         headers={"Referer": f"{stack.url}/jobs/{ok.json()['id']}"})
    assert via_referer.status_code == 202 and via_referer.json()["status"] == "cancelled"


def test_bearer_is_unchanged_and_wins_over_the_cookie(stack, signed_in, data_yaml):
    token, c = signed_in
    with client(stack.url, token) as bearer:  # no Origin: scripts are not browsers
        r = bearer.post("/v1/jobs", json=_job(data_yaml))
        assert r.status_code == 201
    r = c.get("/v1/jobs", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401  # the header is checked even with a good cookie
    anon = httpx.get(f"{stack.url}/v1/jobs")
    assert anon.status_code == 401 and "Bearer" in anon.headers["www-authenticate"]


def test_signin_refuses_cross_origin_and_bad_tokens(stack):
    _, token = stack.user()
    r = httpx.post(f"{stack.url}/signin", data={"token": token},
                   headers={"Origin": "https://evil.example"})
    assert r.status_code == 403
    r = httpx.post(f"{stack.url}/signin", data={"token": "nope", "next": "//evil.example"},
                   headers={"Origin": stack.url})
    assert r.status_code == 401 and "unknown or revoked token" in r.text
    assert 'value="/jobs"' in r.text  # an off-site next is replaced
    r = httpx.post(f"{stack.url}/signin", data={"token": token, "next": "//evil.example/x"},
                   headers={"Origin": stack.url})
    assert r.status_code == 303 and r.headers["location"] == "/jobs"


def test_signed_out_pages_redirect_and_fragments_401(stack):
    r = httpx.get(f"{stack.url}/jobs/jabc?x=1")
    assert r.status_code == 303 and r.headers["location"] == "/signin?next=%2Fjobs%2Fjabc%3Fx%3D1"
    assert httpx.get(f"{stack.url}/web/jobs/rows").status_code == 401
    r = httpx.get(f"{stack.url}/v1/jobs/jabc/events/stream")
    assert r.status_code == 401
