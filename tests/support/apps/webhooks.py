"""An app for completion webhooks (the test sets KEEL_WEBHOOK_SECRET and
KEEL_WEBHOOK_ALLOW_HOSTS): `echo` ends at once; `ask` pauses on an interrupt."""

from __future__ import annotations

import keel
from tests.support.graphs import ask_graph, echo_graph

app = keel.App()
app.workflow("echo")(echo_graph)
app.workflow("ask")(ask_graph)
