"""``AsyncClient`` and ``AsyncJob`` are twins of ``Client`` and ``Job``: the same public
members with the same parameters and defaults (async-ness aside), so that a member added
to one and not the other fails here."""

from __future__ import annotations

import inspect

import pytest

from libreyolo_client import AsyncClient, AsyncJob, Client, Job

#: members only one side has, by design: the sync client closes with ``close`` and is a
#: context manager; the async one closes with ``aclose`` and is an async context manager.
SYNC_ONLY = {"close"}
ASYNC_ONLY = {"aclose"}


def public(cls: type) -> dict[str, object]:
    """The public members of ``cls`` (dunder methods and ``_`` names left out)."""
    return {name: inspect.getattr_static(cls, name) for name in dir(cls)
            if not name.startswith("_")}


def shape(member: object) -> tuple[str, list[tuple[str, str, object]]]:
    """``(kind, [(parameter, kind, default)])`` of a method or property; async-ness and
    annotations (``Job`` vs ``AsyncJob``, a sync vs async transport) aside."""
    if isinstance(member, property):
        return "property", []
    if isinstance(member, staticmethod | classmethod):
        member = member.__func__
    if not callable(member):
        return "attribute", []
    params = inspect.signature(member).parameters.values()  # type: ignore[arg-type]
    return "method", [(p.name, p.kind.name, p.default) for p in params]


@pytest.mark.parametrize(("sync", "twin"), [(Client, AsyncClient), (Job, AsyncJob)],
                         ids=["Client", "Job"])
def test_the_async_twin_has_the_same_public_members(sync, twin):
    ours, theirs = public(sync), public(twin)
    assert set(ours) - SYNC_ONLY == set(theirs) - ASYNC_ONLY, (
        f"only in {sync.__name__}: {sorted(set(ours) - set(theirs) - SYNC_ONLY)}; "
        f"only in {twin.__name__}: {sorted(set(theirs) - set(ours) - ASYNC_ONLY)}")
    differ = {name: (shape(ours[name]), shape(theirs[name]))
              for name in set(ours) & set(theirs) if shape(ours[name]) != shape(theirs[name])}
    assert not differ, differ


@pytest.mark.parametrize(("sync", "twin"), [(Client, AsyncClient), (Job, AsyncJob)],
                         ids=["Client", "Job"])
def test_the_constructors_take_the_same_arguments(sync, twin):
    assert shape(sync.__init__) == shape(twin.__init__)


def test_the_async_methods_are_awaited_where_the_sync_ones_do_io():
    """Every public method of ``AsyncClient`` is a coroutine function, and every method of
    ``AsyncJob`` but the iterators ``events`` and ``logs`` (async iterators)."""
    not_async = {name for name, m in public(AsyncClient).items()
                 if callable(m) and not isinstance(m, property)
                 and not inspect.iscoroutinefunction(m)}
    assert not_async == {"page_url"}  # a URL, no request
    job = {name for name, m in public(AsyncJob).items()
           if callable(m) and not isinstance(m, property) and not inspect.iscoroutinefunction(m)}
    assert job == {"events", "logs"}


def test_the_shape_check_sees_a_drifted_default():
    """The comparison itself: a default that differs is a difference."""

    class A:
        def f(self, x: int = 1) -> None: ...

    class B:
        async def f(self, x: int = 2) -> None: ...

    assert shape(A.f) != shape(B.f)
    assert shape(A.f) == shape(type("C", (), {"f": lambda self, x=1: None}).f)
