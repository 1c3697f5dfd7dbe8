"""Error answers as documented: problem+json, malformed JSON, ``allowed`` lists, Allow."""

from __future__ import annotations

import pytest
from testkit import client, make_user


@pytest.fixture
def carol(server, sessions):
    _, token = make_user(sessions)
    with client(server.url, token) as c:
        yield c


def test_malformed_json_body_says_so_without_a_field(carol):
    r = carol.post("/v1/jobs", content=b'{"model": "yolo9-t", "data": "/x.yaml" "gpus": 0}',
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert problem["detail"] == "the body is not valid JSON (at character 39: Expecting ',' delimiter)", problem
    assert "field" not in problem


@pytest.mark.parametrize("params, field, allowed", [
    ({"optimizer": "lion"}, "params.optimizer", ["sgd", "adam", "adamw"]),
    ({"epochs": -1}, "params.epochs", None),
    ({"epohcs": 3}, "params.epohcs", None),
])
def test_allowed_is_a_list_of_values_or_absent(carol, data_yaml, params, field, allowed):
    r = carol.post("/v1/jobs", json={"model": "yolo9-t", "data": data_yaml, "gpus": 0,
                                     "params": params})
    problem = r.json()
    assert r.status_code == 422 and problem["field"] == field, problem
    assert problem.get("allowed") == allowed, problem


def test_unknown_model_lists_the_models(carol, data_yaml):
    problem = carol.post("/v1/jobs", json={"model": "yolo99-q", "data": data_yaml}).json()
    assert problem["field"] == "model" and "yolo9-t" in problem["allowed"], problem


def test_options_and_405_name_every_method_of_the_path(server):
    with client(server.url, None) as c:
        r = c.options("/v1/jobs")
        assert r.status_code == 204 and r.headers["allow"] == "GET, OPTIONS, POST"
        r = c.delete("/v1/jobs")
        assert r.status_code == 405 and r.headers["allow"] == "GET, OPTIONS, POST"
        assert "use GET, POST" in r.json()["detail"]
        assert c.options("/v1/nothing-here").status_code == 404


def test_openapi_documents_errors_as_problem_json(server):
    with client(server.url, None) as c:
        doc = c.get("/openapi.json").json()
    op = doc["paths"]["/v1/jobs/{job_id}"]["get"]
    for code in ("401", "404", "422"):
        assert list(op["responses"][code]["content"]) == ["application/problem+json"], code
    assert doc["paths"]["/v1/jobs"]["get"]["parameters"][0]["schema"]["anyOf"][0]["items"][
        "enum"] == ["queued", "running", "cancelling", "succeeded", "failed", "cancelled"]
    upload = doc["paths"]["/v1/datasets"]["post"]["requestBody"]["content"]
    assert upload["application/zip"]["schema"] == {"type": "string", "format": "binary"}
    assert "HTTPValidationError" not in doc["components"]["schemas"]
