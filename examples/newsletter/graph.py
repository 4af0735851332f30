"""The `newsletter` workflow: draft -> supervisor review loop -> editor approval -> finalize the
artifacts -> announce once.

```
prepare -> draft -> review --accepted--> approve --approved--> finalize -> notify -> announced
             ^         |                     \\--rejected / timed out--> END
             \\-revise--/--max revisions reached--> END (max_revisions_exceeded)
```

Each node does one thing, because a node that crashes re-runs from its start: drafting and
reviewing are reads; the approval is a durable wait; finalize rewrites the same three files
(keyed by the run, atomically), so a crash half-way and a re-run leave whole, identical files;
the announcement is the only side effect, alone in its node, recorded in the outbox with that
step and delivered by a dispatcher; the last node waits for the delivery.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import operator
import os
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

import keel
from examples.newsletter.content import (
    Draft,
    Drafter,
    Note,
    Review,
    Reviewer,
    load_notes,
    make_drafter,
    select_notes,
)
from examples.newsletter.delivery import announce
from keel.core.clock import parse_duration

WORKFLOW = "newsletter"
VERSION = "1"
FILES = ("newsletter.md", "report.json", "report.md")
MAX_REVISIONS_LIMIT = 10
BASE_URL_ENV = "NEWSLETTER_BASE_URL"
DEFAULT_APPROVAL = {
    "timeout": "48h",
    "remind_after": "4h",
    "escalate_after": "24h",
    "escalate_to": ["chief-editor@example.com"],
}


class Approval(TypedDict):
    decision: str
    by: str | None
    comment: str | None
    at: float | None
    channel: str | None


class NewsletterState(TypedDict, total=False):
    topic: str
    date: str
    editor: str
    accept_on_revision: int | None
    max_revisions: int
    notify_to: str
    approval: dict[str, Any]
    notes: list[Note]
    draft: Draft
    reviews: Annotated[list[Review], operator.add]
    outcome: str
    decision: Approval
    report: dict[str, Any]
    announcement: str
    notified: dict[str, Any]


def newsletter_job_id(date: str | dt.date, topic: str) -> str:
    return keel.job_id("newsletter", date, topic)


def termination(state: Any) -> str | None:
    """The run's termination reason when the review loop gave up; else Keel's default."""
    if isinstance(state, dict) and state.get("outcome") == "max_revisions_exceeded":
        return "max_revisions_exceeded"
    return None


# -- nodes -----------------------------------------------------------------------------------


def prepare(state: NewsletterState) -> dict[str, Any]:
    """Check the input and pick the notes; bad input fails the run here, before any work."""
    topic = str(state.get("topic") or "").strip()
    if not topic:
        raise ValueError("the input needs a `topic`")
    date = dt.date.fromisoformat(str(state.get("date") or "")).isoformat()
    max_revisions = state.get("max_revisions", 3)
    accept = state.get("accept_on_revision", 1)
    if not isinstance(max_revisions, int) or not 0 <= max_revisions <= MAX_REVISIONS_LIMIT:
        raise ValueError(f"max_revisions must be an integer from 0 to {MAX_REVISIONS_LIMIT}")
    if accept is not None and (not isinstance(accept, int) or accept < 0):
        raise ValueError("accept_on_revision must be a non-negative integer or null (never)")
    approval = {**DEFAULT_APPROVAL, **(state.get("approval") or {})}
    for key in ("timeout", "remind_after", "escalate_after"):
        if approval.get(key) is not None:
            parse_duration(approval[key])
    return {
        "topic": topic,
        "date": date,
        "max_revisions": max_revisions,
        "accept_on_revision": accept,
        "editor": state.get("editor") or "editor@example.com",
        "notify_to": state.get("notify_to") or "team@example.com",
        "approval": approval,
        "notes": select_notes(topic, load_notes()),
    }


def make_draft_node(drafter: Drafter) -> Any:
    def draft(state: NewsletterState) -> dict[str, Any]:
        reviews = state.get("reviews") or []
        written = drafter.draft(
            state["topic"],
            state["date"],
            state["notes"],
            state.get("draft"),
            reviews[-1] if reviews else None,
        )
        return {"draft": written}

    return draft


def make_review_node(reviewer: Reviewer) -> Any:
    def review(state: NewsletterState) -> dict[str, Any]:
        draft = state["draft"]
        verdict = reviewer.review(draft, state["notes"], state.get("accept_on_revision"))
        if verdict["accepted"]:
            outcome = "accepted"
        elif draft["revision"] >= state["max_revisions"]:
            outcome = "max_revisions_exceeded"
        else:
            outcome = "revise"
        return {"reviews": [verdict], "outcome": outcome}

    return review


def after_review(state: NewsletterState) -> str:
    return {"accepted": "approve", "revise": "draft"}.get(state["outcome"], END)


def approve(state: NewsletterState) -> dict[str, Any]:
    draft, config = state["draft"], state["approval"]
    answer = keel.approval(
        "editor",
        payload={
            "title": draft["title"],
            "topic": state["topic"],
            "date": state["date"],
            "revision": draft["revision"],
            "reviewer": state["reviews"][-1]["comments"],
            "newsletter": draft["markdown"][:2500],
        },
        approvers=[state["editor"]],
        timeout=config["timeout"],
        on_timeout="reject",
        remind_after=config.get("remind_after"),
        escalate_after=config.get("escalate_after"),
        escalate_to=list(config.get("escalate_to") or []),
    )
    return {
        "decision": Approval(
            decision=answer.decision,
            by=answer.by,
            comment=answer.comment,
            at=answer.at,
            channel=answer.channel,
        )
    }


def after_approval(state: NewsletterState) -> str:
    return "finalize" if state["decision"]["decision"] == "approved" else END


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def render_files(run_id: str, state: NewsletterState) -> dict[str, str]:
    """The three artifacts, from the run and its checkpointed state only: the same bytes on
    every re-run (no clock, no randomness)."""
    draft, decision, reviews = state["draft"], state["decision"], state["reviews"]
    at = decision.get("at")
    approved_at = (
        dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if at is not None
        else None
    )
    newsletter = draft["markdown"]
    summary = {
        "file": "newsletter.md",
        "sha256": _sha256(newsletter),
        "words": len(newsletter.split()),
    }
    job_id = newsletter_job_id(state["date"], state["topic"])
    report = {
        "workflow": WORKFLOW,
        "version": VERSION,
        "run_id": run_id,
        "job_id": job_id,
        "topic": state["topic"],
        "date": state["date"],
        "title": draft["title"],
        "drafted_by": draft["drafted_by"],
        "revisions": draft["revision"],
        "reviews": reviews,
        "approval": {**decision, "approved_at": approved_at},
        "sources": draft["sources"],
        "newsletter": summary,
    }
    lines = [
        f"# Report: {draft['title']}",
        "",
        f"- run: `{run_id}`",
        f"- job: `{job_id}`",
        f"- drafted by: {draft['drafted_by']}",
        f"- revisions: {draft['revision']}",
        f"- approved by: {decision.get('by')} via {decision.get('channel')} at {approved_at}",
        f"- newsletter.md: {summary['words']} words, sha256 `{summary['sha256']}`",
        "",
        "## Reviews",
        "",
    ]
    for r in reviews:
        verdict = "accepted" if r["accepted"] else "changes requested"
        lines.append(f"- revision {r['revision']}: {verdict}. " + " ".join(r["comments"]))
    lines += ["", "## Sources", "", *[f"- <{s}>" for s in draft["sources"]]]
    return {
        "newsletter.md": newsletter,
        "report.json": json.dumps(report, indent=2, sort_keys=True) + "\n",
        "report.md": "\n".join(lines) + "\n",
    }


def finalize(state: NewsletterState, config: RunnableConfig) -> dict[str, Any]:
    run_id = str(config["configurable"]["thread_id"])
    files = render_files(run_id, state)
    folder = keel.artifacts()
    # A worker killed mid-write leaves a hidden temp file; the re-run clears it.
    if folder.folder.is_dir():
        for name in FILES:
            for stale in folder.folder.glob(f".{name}.*.tmp"):
                stale.unlink(missing_ok=True)
    for name in FILES:
        folder.write_text(name, files[name])
    return {"report": {name: _sha256(files[name]) for name in FILES}}


def newsletter_link(run_id: str) -> str:
    base = os.environ.get(BASE_URL_ENV, "http://127.0.0.1:8000").rstrip("/")
    return f"{base}/v1/runs/{run_id}/artifacts/newsletter.md"


def notify(state: NewsletterState, config: RunnableConfig) -> dict[str, Any]:
    run_id = str(config["configurable"]["thread_id"])
    # Recorded with this step, sent by a dispatcher; Keel derives `idempotency_key`.
    handle = announce(
        state["notify_to"],
        f"Published: {state['draft']['title']}",
        newsletter_link(run_id),
        state["report"]["newsletter.md"],
    )
    return {"announcement": handle}


def announced(state: NewsletterState) -> dict[str, Any]:
    # A wait (no worker held) until the dispatcher delivered it: the run ends announced.
    return {"notified": keel.await_effect(state["announcement"])}


def build(drafter: Drafter | Any = None, reviewer: Reviewer | None = None) -> StateGraph:
    """The uncompiled graph; `drafter` is a Drafter, a LangChain chat model, or None (offline)."""
    graph = StateGraph(NewsletterState)
    graph.add_node("prepare", prepare)
    graph.add_node("draft", make_draft_node(make_drafter(drafter)))
    graph.add_node("review", make_review_node(reviewer or Reviewer()))
    graph.add_node("approve", approve)
    graph.add_node("finalize", finalize)
    graph.add_node("notify", notify)
    graph.add_node("announced", announced)
    graph.add_edge(START, "prepare")
    graph.add_edge("prepare", "draft")
    graph.add_edge("draft", "review")
    graph.add_conditional_edges("review", after_review, ["approve", "draft", END])
    graph.add_conditional_edges("approve", after_approval, ["finalize", END])
    graph.add_edge("finalize", "notify")
    graph.add_edge("notify", "announced")
    graph.add_edge("announced", END)
    return graph


def register(
    app: keel.App, *, drafter: Drafter | Any = None, reviewer: Reviewer | None = None
) -> keel.App:
    """Register `newsletter` (version 1) on `app`; pass a chat model to draft with an LLM."""
    app.workflow(WORKFLOW, version=VERSION, termination=termination)(
        lambda: build(drafter, reviewer)
    )
    return app
