"""Dropping a test's PostgreSQL database reliably.

`DROP DATABASE ... WITH (FORCE)` terminates the sessions on the database, but an unprivileged
role may not terminate an autovacuum worker that happens to be vacuuming it (PostgreSQL 15:
"must be a member of the role whose process is being terminated"). Autovacuum finishes a fresh
test database in well under a second, so the drop is retried for a while instead of failing
the test's teardown.
"""

from __future__ import annotations

import time


def drop_database(server_url: str, name: str, *, timeout: float = 15.0) -> None:
    """Drop database `name` on the server at `server_url`, retrying while something that is
    not ours to terminate (an autovacuum worker) is still on it."""
    import psycopg
    from psycopg import errors

    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(server_url, autocommit=True, connect_timeout=5) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except (errors.InsufficientPrivilege, errors.ObjectInUse):
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.25)
