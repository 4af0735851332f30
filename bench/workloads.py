"""The Keel app that bench worker processes run: `python -m keel worker bench.workloads:app`.

Its database comes from $KEEL_DATABASE_URL (and the lease TTL from $KEEL_LEASE_TTL), so the
bench points each worker process at the database of the case it is measuring.
"""

from __future__ import annotations

import keel
from bench.graphs import register

app = register(keel.App())
