"""docker-compose.yml: valid (Debian's `docker-compose config -q` when installed) and
holding the parts the design needs."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml
from testkit import REPO

COMPOSE = REPO / "docker-compose.yml"


def test_compose_structure():
    doc = yaml.safe_load(COMPOSE.read_text())
    services = doc["services"]
    assert {"postgres", "redis", "api", "worker", "migrate"} <= set(services)
    for name in ("postgres", "redis", "api"):
        assert "healthcheck" in services[name], name
    worker = services["worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    for name in ("api", "worker"):
        assert any(v.startswith("artifacts:") for v in services[name]["volumes"])
        env = services[name]["environment"]
        assert env["LIBREYOLO_BROKER_URL"].startswith("redis://")
        assert env["LIBREYOLO_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert services[name]["depends_on"]["migrate"]["condition"] == \
            "service_completed_successfully"
    assert services["migrate"]["command"] == ["libreyolo-service", "db", "upgrade"]
    assert (REPO / "Dockerfile").read_text().count("FROM ") == 1


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="docker-compose not installed (apt-get install docker-compose)")
def test_compose_config_validates():
    subprocess.run(["docker-compose", "-f", str(COMPOSE), "config", "-q"], check=True,
                   cwd=REPO)
