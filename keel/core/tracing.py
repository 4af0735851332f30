"""Where the core asks for a span: the seam an optional tracer fills in.

The core is standard library only, so it does not draw spans itself: it says where one begins
and ends (an effect's call through the ledger) and what it found (its key, its outcome), and the
tracer on the run's context draws it. Without one (`NO_TRACER`, the default: no
OpenTelemetry installed or configured) each mark is a shared object whose methods do nothing,
so an untraced run pays one attribute read and a `with` per effect.

The OpenTelemetry tracer is `keel.langgraph.traces`; docs/operations.md ("Traces") says what a
run's trace holds.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Protocol

from keel.core.ids import StepRef


class Mark(Protocol):
    """An open span: what the core learns while it is open becomes its attributes."""

    def note(self, **attributes: Any) -> None: ...


class Tracer(Protocol):
    def effect(self, where: StepRef, name: str) -> AbstractContextManager[Mark]:
        """A span for one call of effect `name` by the node at `where`, closed when it settles
        (a raised GraphInterrupt — the effect waits for a person — is not an error)."""
        ...


class _Untraced:
    """The no-op span and tracer in one object: nothing is allocated per call."""

    def note(self, **attributes: Any) -> None:
        pass

    def effect(self, where: StepRef, name: str) -> _Untraced:
        return self

    def __enter__(self) -> _Untraced:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


NO_TRACER: Tracer = _Untraced()
