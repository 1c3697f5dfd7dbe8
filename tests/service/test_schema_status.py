"""The API's status literal lists exactly the lifecycle's statuses (written out for type checkers)."""

from typing import get_args

from service.api.schemas import JobStatusName
from service.lifecycle import JobStatus


def test_status_literal_equals_the_enum():
    assert get_args(JobStatusName) == tuple(s.value for s in JobStatus)
