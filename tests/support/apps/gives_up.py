"""An app whose workers give up at start inside a chaos cell (as one missing a credential
would): `keel chaos` must stop at once with the worker's last line, not wait out the cell."""

from __future__ import annotations

import os

import keel
from tests.support.graphs import echo_graph

if os.environ.get("KEEL_CHAOS_SMTP_URL"):  # set in a cell's worker only
    raise SystemExit("no SMTP password in this environment: set MAIL_PASSWORD")


app = keel.App()


app.workflow("echo")(echo_graph)
