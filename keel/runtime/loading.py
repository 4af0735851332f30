"""Finding the user's App: `load_app("module:attribute")`, as `keel worker`, `keel serve` and
`keel chaos` are given it."""

from __future__ import annotations

import importlib
import os
import sys

from keel.core.errors import UsageError
from keel.runtime.app import App


class BadAppSpec(UsageError):
    """The MODULE:ATTRIBUTE given does not name a keel.App."""


def load_app(spec: str) -> App:
    """Import `module:attribute` (the current folder is importable, as with uvicorn).

    BadAppSpec when the spec is malformed, its module does not exist or its attribute is not an
    App; errors raised while importing an existing module propagate as they are.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise BadAppSpec(f"expected MODULE:ATTRIBUTE, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only the module named in the spec (or a parent package) is the spec's fault; a module
        # that the user's module imports and lacks is a bug to show in full.
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise BadAppSpec(f"cannot import {module_name!r}: {exc}") from None
        raise
    app = getattr(module, attr, None)
    if app is None:
        raise BadAppSpec(f"module {module_name!r} has no attribute {attr!r}")
    if not isinstance(app, App):
        raise BadAppSpec(f"{spec} is a {type(app).__name__}, not a keel.App")
    return app
