"""A `keel worker` process collects its youngest generation less often than CPython's default
(keel.runtime.upkeep.collect_less_often), unless the process chose its own threshold."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from keel.runtime.upkeep import PYTHON_GEN0, WORKER_GEN0, collect_less_often


@pytest.fixture
def thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*before)


@pytest.mark.usefixtures("thresholds")
def test_python_s_default_is_raised_and_the_older_generations_kept() -> None:
    gc.set_threshold(PYTHON_GEN0, 11, 12)
    assert collect_less_often() is True
    assert gc.get_threshold() == (WORKER_GEN0, 11, 12)


@pytest.mark.usefixtures("thresholds")
def test_a_threshold_the_process_chose_is_left_alone() -> None:
    gc.set_threshold(50_000, 5, 5)
    assert collect_less_often() is False
    assert gc.get_threshold() == (50_000, 5, 5)
