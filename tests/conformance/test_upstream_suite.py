"""LangGraph's checkpoint conformance suite against Keel's fenced savers, on both backends.

Keel subclasses the official savers and reaches into their private parts (docs/savers.md);
this suite is what tells an upgrade of langgraph-checkpoint-* that breaks the seam apart from
one that does not. Each upstream spec test is its own pytest test here, so a failure names the
test, and a deliberate incompatibility can be marked by id in EXPECTED_FAILURES.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from langgraph.checkpoint.conformance import validate
from langgraph.checkpoint.conformance.capabilities import (
    BASE_CAPABILITIES,
    Capability,
    DetectedCapabilities,
)
from langgraph.checkpoint.conformance.spec import test_copy_thread as copy_thread_spec
from langgraph.checkpoint.conformance.spec import test_delete_for_runs as delete_for_runs_spec
from langgraph.checkpoint.conformance.spec import test_delete_thread as delete_thread_spec
from langgraph.checkpoint.conformance.spec import test_get_tuple as get_tuple_spec
from langgraph.checkpoint.conformance.spec import test_list as list_spec
from langgraph.checkpoint.conformance.spec import test_prune as prune_spec
from langgraph.checkpoint.conformance.spec import test_put as put_spec
from langgraph.checkpoint.conformance.spec import test_put_writes as put_writes_spec

from keel.langgraph.savers import FencedPostgresSaver, FencedSqliteSaver
from tests.conformance.conftest import Conformance

SpecTest = Callable[[Any], Awaitable[None]]

# The lists the suite's own runners iterate (validate() -> run_<capability>_tests).
SPEC: dict[Capability, list[SpecTest]] = {
    Capability.PUT: put_spec.ALL_PUT_TESTS,
    Capability.PUT_WRITES: put_writes_spec.ALL_PUT_WRITES_TESTS,
    Capability.GET_TUPLE: get_tuple_spec.ALL_GET_TUPLE_TESTS,
    Capability.LIST: list_spec.ALL_LIST_TESTS,
    Capability.DELETE_THREAD: delete_thread_spec.ALL_DELETE_THREAD_TESTS,
    Capability.DELETE_FOR_RUNS: delete_for_runs_spec.ALL_DELETE_FOR_RUNS_TESTS,
    Capability.COPY_THREAD: copy_thread_spec.ALL_COPY_THREAD_TESTS,
    Capability.PRUNE: prune_spec.ALL_PRUNE_TESTS,
}

SAVERS = {"sqlite": FencedSqliteSaver, "postgres": FencedPostgresSaver}
BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]

# What the upstream savers implement, as the suite detects it. A saver that gains
# `acopy_thread` or `adelete_for_runs` gains a write path Keel's fencing does not cover.
EXPECTED_CAPABILITIES: dict[str, frozenset[Capability]] = {
    "sqlite": BASE_CAPABILITIES,
    "postgres": BASE_CAPABILITIES | {Capability.PRUNE},
}

# (backend, spec test name) -> why Keel's fencing makes it fail on purpose. Every upstream spec
# test passes on both backends today, so this is empty; add entries by id, never by capability.
EXPECTED_FAILURES: dict[tuple[str, str], str] = {}


def detected(backend: str) -> frozenset[Capability]:
    cls = SAVERS[backend]
    # Detection only looks at the type: which methods override BaseCheckpointSaver's.
    return DetectedCapabilities.from_instance(cls.__new__(cls)).detected


def cases() -> Iterator[Any]:
    for backend in BACKENDS:
        name = backend.values[0]
        found = detected(name)
        for capability in Capability:
            if capability not in found:
                continue  # the suite skips what the saver does not implement; so do we
            for spec_test in SPEC[capability]:
                marks = list(backend.marks)
                if reason := EXPECTED_FAILURES.get((name, spec_test.__name__)):
                    marks.append(pytest.mark.xfail(strict=True, reason=reason))
                yield pytest.param(
                    name,
                    spec_test,
                    id=f"{name}-{capability.value}-{spec_test.__name__}",
                    marks=marks,
                )


@pytest.mark.parametrize(("backend", "spec_test"), list(cases()))
def test_spec(backend: str, spec_test: SpecTest, conformance: Conformance) -> None:
    conformance.call(spec_test(conformance.saver))


@pytest.mark.parametrize("backend", BACKENDS)
def test_validate_reports_every_detected_capability_passing(
    backend: str, conformance: Conformance
) -> None:
    """The suite's own entry point, as its README plugs a backend in, agrees with test_spec."""
    report = conformance.call(validate(conformance.registered))
    ran = {cap for cap, result in report.results.items() if result.detected}
    assert ran == {c.value for c in EXPECTED_CAPABILITIES[backend]}
    failed = {
        failure.split(":", 1)[0]
        for result in report.results.values()
        for failure in result.failures
    }
    expected = {test for b, test in EXPECTED_FAILURES if b == backend}
    assert failed == expected
    if not expected:
        assert report.conformance_level() == "FULL"


@pytest.mark.parametrize("dialect", sorted(SAVERS))
def test_upstream_savers_implement_the_capabilities_keel_reviewed(dialect: str) -> None:
    found = detected(dialect)
    expected = EXPECTED_CAPABILITIES[dialect]
    assert found == expected, (
        f"the {dialect} saver now implements {sorted(c.value for c in found - expected)} and "
        f"no longer {sorted(c.value for c in expected - found)}: new write paths bypass Keel's "
        "fencing unless keel/langgraph/savers.py covers them; review it and docs/savers.md"
    )


def test_every_capability_of_the_suite_is_run_here() -> None:
    assert set(SPEC) == set(Capability), "the conformance suite has a capability SPEC misses"
