"""The newsletter's words: the shipped notes, the drafters and the supervisor's review.

`OfflineDrafter` (the default) stitches the notes that match the topic into a newsletter: no
network, no API key, the same text for the same input every time, and it says so in the text.
`ChatModelDrafter` wraps any LangChain chat model instead. `Reviewer` is the supervisor: a
deterministic checklist, and an acceptance rule taken from the run's input (`accept_on_revision`:
the first revision it accepts; None never accepts, which ends the run at `max_revisions`).

Drafting and reviewing are reads, not side effects: a crash mid-draft just drafts again.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, runtime_checkable

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

NOTES_DIR = Path(__file__).with_name("notes")
OFFLINE_LABEL = "Drafted offline by Keel's deterministic drafter (no LLM)."
MAX_NOTES = 4
SUMMARY_MARK = "**In this issue:**"
CTA_MARK = "**Your turn:**"
CTA = f"{CTA_MARK} reply with the one reliability habit your team would not ship without."

# The supervisor's checklist: code -> what it asks for.
CHECKLIST = {
    "summary": "Open with a one-line summary of the issue.",
    "sources": "Link every item to its source.",
    "call_to_action": "End with a call to action for readers.",
}
TIGHTEN = "tighten"
TIGHTEN_TEXT = "Tighten the items to their key sentence; the editor wants it shorter."


class Note(TypedDict):
    slug: str
    title: str
    source: str
    tags: list[str]
    body: str


class Draft(TypedDict):
    title: str
    markdown: str
    revision: int
    drafted_by: str
    sources: list[str]
    applied: list[str]


class Review(TypedDict):
    revision: int
    accepted: bool
    comments: list[str]
    requests: list[str]
    reviewer: str


def parse_note(slug: str, text: str) -> Note:
    """A note is a small front matter (title, source, tags) and a body."""
    match = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.S)
    if not match:
        raise ValueError(f"note {slug}: expected a front matter between --- lines")
    meta: dict[str, str] = {}
    for line in match.group(1).splitlines():
        key, _, value = line.partition(":")
        meta[key.strip()] = value.strip()
    if not meta.get("title") or not meta.get("source"):
        raise ValueError(f"note {slug}: title and source are required")
    tags = [t.strip().lower() for t in meta.get("tags", "").split(",") if t.strip()]
    return Note(
        slug=slug,
        title=meta["title"],
        source=meta["source"],
        tags=tags,
        body=" ".join(match.group(2).split()),
    )


def load_notes(folder: Path = NOTES_DIR) -> list[Note]:
    return [parse_note(p.stem, p.read_text()) for p in sorted(folder.glob("*.md"))]


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def select_notes(topic: str, notes: list[Note], limit: int = MAX_NOTES) -> list[Note]:
    """The notes sharing most words with the topic (tags count double); all if none match."""

    def score(note: Note) -> int:
        words = _words(topic)
        return 2 * len(words & set(note["tags"])) + len(words & _words(note["title"]))

    ranked = sorted(notes, key=lambda n: (-score(n), n["slug"]))
    matching = [n for n in ranked if score(n) > 0]
    return (matching or ranked)[:limit]


def first_sentence(text: str) -> str:
    match = re.match(r"(.+?[.!?])(\s|$)", text)
    return match.group(1) if match else text


@runtime_checkable
class Drafter(Protocol):
    name: str

    def draft(
        self,
        topic: str,
        date: str,
        notes: list[Note],
        previous: Draft | None,
        review: Review | None,
    ) -> Draft: ...


def newsletter_title(topic: str, date: str) -> str:
    return f"{topic.strip()}: the {date} issue"


class OfflineDrafter:
    """A deterministic drafter: the selected notes, plus what the reviewer asked for so far."""

    name = "keel-offline-drafter (no LLM)"

    def draft(
        self,
        topic: str,
        date: str,
        notes: list[Note],
        previous: Draft | None,
        review: Review | None,
    ) -> Draft:
        applied = list(previous["applied"]) if previous else []
        for request in review["requests"] if review else []:
            if request not in applied:
                applied.append(request)
        revision = previous["revision"] + 1 if previous else 0
        title = newsletter_title(topic, date)
        lines = [f"# {title}", "", f"*{OFFLINE_LABEL}*", ""]
        if "summary" in applied:
            lines += [f"{SUMMARY_MARK} " + "; ".join(n["title"] for n in notes) + ".", ""]
        for note in notes:
            body = first_sentence(note["body"]) if TIGHTEN in applied else note["body"]
            lines += [f"## {note['title']}", "", body, "", f"Source: <{note['source']}>", ""]
        if "call_to_action" in applied:
            lines += [CTA, ""]
        return Draft(
            title=title,
            markdown="\n".join(lines).rstrip() + "\n",
            revision=revision,
            drafted_by=self.name,
            sources=[n["source"] for n in notes],
            applied=applied,
        )


class ChatModelDrafter:
    """Draft with any LangChain chat model; the notes are its only knowledge."""

    def __init__(self, model: BaseChatModel) -> None:
        self.model = model
        self.name = f"chat-model:{type(model).__name__}"

    def draft(
        self,
        topic: str,
        date: str,
        notes: list[Note],
        previous: Draft | None,
        review: Review | None,
    ) -> Draft:
        from langchain_core.messages import HumanMessage, SystemMessage

        sources = "\n\n".join(f"## {n['title']} ({n['source']})\n{n['body']}" for n in notes)
        system = (
            "You write a short engineering newsletter in Markdown. Use only the notes below, "
            "one section per note, each ending with 'Source: <url>'. Reply with the Markdown "
            f"only.\n\nNotes:\n{sources}"
        )
        ask = f"Write the {date} issue about {topic!r}."
        if previous and review:
            ask += "\n\nRevise this draft:\n" + previous["markdown"]
            ask += "\n\nThe editor's comments:\n" + "\n".join(f"- {c}" for c in review["comments"])
        reply = self.model.invoke([SystemMessage(system), HumanMessage(ask)])
        text = reply.content if isinstance(reply.content, str) else str(reply.content)
        applied = list(previous["applied"]) if previous else []
        applied += [r for r in (review["requests"] if review else []) if r not in applied]
        return Draft(
            title=newsletter_title(topic, date),
            markdown=text.strip() + "\n",
            revision=previous["revision"] + 1 if previous else 0,
            drafted_by=self.name,
            sources=[n["source"] for n in notes],
            applied=applied,
        )


class Reviewer:
    """The supervisor: checks the draft against the checklist and applies the acceptance rule."""

    name = "keel-offline-reviewer (rules)"

    def review(self, draft: Draft, notes: list[Note], accept_on_revision: int | None) -> Review:
        text = draft["markdown"]
        missing = []
        if SUMMARY_MARK not in text:
            missing.append("summary")
        if any(n["source"] not in text for n in notes):
            missing.append("sources")
        if CTA_MARK not in text:
            missing.append("call_to_action")
        accepted = accept_on_revision is not None and draft["revision"] >= accept_on_revision
        requests = missing or ([] if accepted or TIGHTEN in draft["applied"] else [TIGHTEN])
        comments = [CHECKLIST.get(code, TIGHTEN_TEXT) for code in requests]
        if accepted:
            comments.insert(0, f"Accepted revision {draft['revision']}.")
        elif not comments:
            comments = ["Not convinced yet; one more pass, please."]
        return Review(
            revision=draft["revision"],
            accepted=accepted,
            comments=comments,
            requests=[] if accepted else requests,
            reviewer=self.name,
        )


def make_drafter(drafter: Drafter | Any = None) -> Drafter:
    """None -> OfflineDrafter; a Drafter as is; a LangChain chat model -> ChatModelDrafter."""
    if drafter is None:
        return OfflineDrafter()
    if isinstance(drafter, Drafter):
        return drafter
    return ChatModelDrafter(drafter)
