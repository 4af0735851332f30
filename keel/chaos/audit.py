"""`keel audit APP`: the production-hardening checklist, checked against a registered App.

What it looks at, without running anything (docs/chaos.md, "Audit before you deploy"):

- each workflow's nodes, read from the builder its factory returns: their functions' code, and
  the functions of the same package they reach (transitively, through globals, closures and
  attributes of modules and of objects whose class is the package's own);
- the effects those functions use (`@keel.effect`, outbox or not): a reconciler alone, or
  nothing, between a crash mid-call and a second call; no declared timeout; a timeout longer
  than the lease TTL;
- calls of known network clients (smtplib, requests, httpx, ...) outside any effect;
- waits: `keel.approval()` without `timeout=`, LangGraph's plain `interrupt()`;
- workflows registered without `version=`;
- with a database: runs whose checkpoint the graph registered under their version no longer
  fits, or names nodes and state keys that graph lacks (the graph changed under the same
  version);
- the API tokens of $KEEL_API_TOKENS and $KEEL_TOKEN_SECRET (weak ones).

Each finding is one line with its fix and a stable `code`; errors make the command fail.
The code reading is a heuristic: it sees what the functions name, not what they do at run time
(a read over HTTP is not a side effect; a client reached through a parameter is not seen).

This module loads what to audit and runs the checks; the code reading is in
keel/chaos/audit_code.py, the findings and the checks that make them in
keel/chaos/audit_checks.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from keel.chaos.audit_checks import (
    AuditReport,
    Finding,
    Level,
    Skipped,
    drift_findings,
    effect_findings,
    node_findings,
    token_findings,
    version_findings,
)
from keel.chaos.audit_code import CLIENTS, AnyEffect, read_nodes
from keel.core.errors import KeelError
from keel.core.workflows import Workflow
from keel.langgraph.graphs import compile_graph
from keel.runtime import preflight
from keel.runtime.app import App

__all__ = ["CLIENTS", "AuditReport", "Finding", "Level", "Skipped", "audit"]


def audit(
    app: App,
    *,
    spec: str,
    db: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> AuditReport:
    """Audit `app` (loaded from `spec`); `db` (default: the App's own URL) is read, never
    written, for the checks that need recorded runs; `environ` holds $KEEL_API_TOKENS."""
    env = os.environ if environ is None else environ
    workflows = app.aio.runtime.workflows.all()
    url = db or app.url
    report = AuditReport(spec, preflight.redact(url), [w.key for w in workflows])
    lease_ttl = float(app.aio.runtime.lease_ttl)
    default_timeout = app.aio.runtime.services.effect_timeout
    for workflow in workflows:
        report.findings.extend(_workflow_findings(workflow, lease_ttl, default_timeout))
    report.findings.extend(drift_findings(app, workflows, url, report.skipped))
    report.findings.extend(token_findings(env, report.skipped))
    report.findings[:] = _unique(report.findings)
    return report


def workflow_findings(app: App) -> list[Finding]:
    """What the app's workflows alone show (no database, no environment): `keel chaos` prints
    the effects among them that rely on reconcile alone."""
    lease_ttl, default_timeout = (
        float(app.aio.runtime.lease_ttl),
        app.aio.runtime.services.effect_timeout,
    )
    found = [
        finding
        for workflow in app.aio.runtime.workflows.all()
        for finding in _workflow_findings(workflow, lease_ttl, default_timeout)
    ]
    return _unique(found)


def _unique(findings: Iterable[Finding]) -> list[Finding]:
    """Each finding once (e.g. the same wait written twice in one function is one finding)."""
    seen: set[tuple[Any, ...]] = set()
    kept = []
    for f in findings:
        mark = (f.workflow, f.subject, f.code, f.message)
        if mark not in seen:
            seen.add(mark)
            kept.append(f)
    return kept


def _workflow_findings(
    workflow: Workflow, lease_ttl: float, default_timeout: float
) -> list[Finding]:
    """One workflow's: its registration, then each node's code, then the effects they use."""
    key = workflow.key
    findings = version_findings(workflow)
    try:
        graph = compile_graph(workflow)
    except KeelError as exc:
        return [
            *findings,
            Finding(
                Level.ERROR,
                key,
                workflow.name,
                "workflow.invalid",
                str(exc),
                "fix the factory so that it returns a StateGraph that compiles",
            ),
        ]
    builder = getattr(graph, "builder", None)
    if builder is None or not isinstance(getattr(builder, "nodes", None), Mapping):
        return [
            *findings,
            Finding(
                Level.INFO,
                key,
                workflow.name,
                "workflow.unread",
                f"workflow {key} is not a StateGraph: its nodes were not read",
                "audit its functions by hand (effects, waits, network calls)",
            ),
        ]
    effects: dict[str, AnyEffect] = {}
    for node, reader in read_nodes(builder):
        effects.update(reader.effects)
        findings.extend(node_findings(key, node, reader))
    for name in sorted(effects):
        findings.extend(effect_findings(key, effects[name], lease_ttl, default_timeout))
    return findings
