"""Help-center retrieval: SQLite FTS5 over the shipped docs/*.md, ranked by bm25.

The index is built in memory for each search: seven short articles index in well under a
millisecond, and a fresh connection per call needs no locking across the worker's node threads.
"""

from __future__ import annotations

import functools
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

DOCS_DIR = Path(__file__).parent / "docs"
HELP_URL = "https://help.nimbus.example/"
_STOPWORDS = """
a about after again all also am an and any are as at be been but by can could did do does
doesn don for from get got had has have hello hey hi how i i'm if in into is it its just me
my no not of on or our please so some than thank thanks that the their them then there this
to too up us was we were what when where which who why will with would you your yours
"""
STOPWORDS = frozenset(_STOPWORDS.split())
_WORD = re.compile(r"[a-z0-9]+")
# What each analysis category adds to the query: the ticket's own words may be vague ("I was
# charged twice") where the category the rules found names the article ("billing").
CATEGORY_TERMS = {
    "account_deletion": "delete account",
    "refund": "refund",
    "billing": "billing invoice",
    "password": "password reset",
    "two_factor": "two-factor authentication",
    "shipping": "shipping delivery",
    "api": "api key",
}
MIN_SCORE = 0.01
# Up to `limit` hits, but only those within this fraction of the best: an article matching a
# stray word ("kept", "back") is noise next to one that matches the ticket's topic.
RELATIVE_CUTOFF = 0.5


@dataclass(frozen=True)
class Doc:
    slug: str
    title: str
    summary: str
    text: str


class DocHit(TypedDict):
    slug: str
    title: str
    summary: str
    url: str
    score: float


@functools.cache
def load_docs(folder: Path = DOCS_DIR) -> tuple[Doc, ...]:
    docs = []
    for path in sorted(folder.glob("*.md")):
        text = path.read_text(encoding="utf-8")
        head, _, rest = text.partition("\n")
        paragraphs = [p.strip() for p in rest.strip().split("\n\n") if p.strip()]
        summary = " ".join(paragraphs[0].split()) if paragraphs else ""
        docs.append(Doc(path.stem, head.lstrip("# ").strip(), summary, rest))
    if not docs:
        raise FileNotFoundError(f"no help-center articles in {folder}")
    return tuple(docs)


def query_terms(text: str, limit: int = 40) -> list[str]:
    """The ticket's distinct content words, in order (FTS5's porter stemmer does the rest)."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text.lower()):
        if len(word) >= 3 and word not in STOPWORDS:
            seen.setdefault(word, None)
    return list(seen)[:limit]


def search(
    text: str, *, category: str | None = None, limit: int = 3, folder: Path = DOCS_DIR
) -> list[DocHit]:
    """The `limit` articles most relevant to `text`, best first (empty if nothing matches)."""
    terms = query_terms(f"{CATEGORY_TERMS.get(category or '', '')} {text}")
    if not terms:
        return []
    # Quoted terms are literal strings to FTS5: ticket text can never inject query syntax.
    match = " OR ".join(f'"{t}"' for t in terms)
    with sqlite3.connect(":memory:") as db:
        db.execute(
            "CREATE VIRTUAL TABLE docs USING fts5(slug UNINDEXED, title, body, "
            "tokenize='porter unicode61')"
        )
        db.executemany(
            "INSERT INTO docs (slug, title, body) VALUES (?, ?, ?)",
            [(d.slug, d.title, d.text) for d in load_docs(folder)],
        )
        # A title match says more about an article than a word somewhere in its body.
        rows = db.execute(
            "SELECT slug, bm25(docs, 0.0, 4.0, 1.0) AS rank FROM docs WHERE docs MATCH ? "
            "ORDER BY rank, slug LIMIT ?",
            (match, limit),
        ).fetchall()
    by_slug = {d.slug: d for d in load_docs(folder)}
    best = -rows[0][1] if rows else 0.0
    return [
        DocHit(
            slug=slug,
            title=by_slug[slug].title,
            summary=by_slug[slug].summary,
            url=HELP_URL + slug,
            score=round(-rank, 4),
        )
        for slug, rank in rows
        # Matching only words that every article uses (bm25 ~ 0) is not relevance.
        if -rank >= max(MIN_SCORE, best * RELATIVE_CUTOFF)
    ]
