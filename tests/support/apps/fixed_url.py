"""An App whose database URL is fixed in code, the README's own pattern: `keel chaos` cannot
hand its workers a throwaway database, and must say so in one line."""

from __future__ import annotations

import tempfile
from pathlib import Path

import keel
from tests.support.graphs import echo_graph

app = keel.App(f"sqlite:///{Path(tempfile.gettempdir()) / 'keel-fixed-url' / 'app.db'}")


app.workflow("echo")(echo_graph)
