"""The `keel_chaos` pytest fixture: the crash matrix on your own graph, as a function.

Loaded automatically through the `pytest11` entry point, beside keel.testing's fixtures.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from keel.chaos.harness import ChaosConfig, Report
from keel.chaos.matrix import run_matrix


@pytest.fixture
def keel_chaos(tmp_path: Path) -> Callable[..., Report]:
    """`keel_chaos("mymodule:app", "my-workflow", {"input": 1}, points=(...))` -> Report."""

    def run(app: str, workflow: str, input: Any, **options: Any) -> Report:
        options.setdefault("workdir", tmp_path / "keel-chaos")
        return run_matrix(ChaosConfig(app=app, workflow=workflow, input=input, **options))

    return run
