"""Inbound webhooks: what `app.webhook(name, ...)` declares for `POST /hooks/{name}`
(keel.service.hooks serves it).

A declaration says how a delivery is verified (Standard Webhooks, GitHub, Stripe, or the user's
function), where its delivery id comes from (the sender's: `webhook-id`, `X-GitHub-Delivery`,
the Stripe event's `id`), and how its payload becomes a submit: the workflow, a job id (a
template such as `"pr-{repository.id}-{pull_request.number}"` or a function of the payload;
by default one per delivery id) and the input (a function of the payload; by default the
payload itself). The signature rules are keel.core.webhooks'; the delivery ids seen are the
database's (`keel_hook_deliveries`), so a replay never admits a second run.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from keel.core.errors import InvalidId, InvalidInput, UsageError
from keel.core.ids import validate_job_id
from keel.core.store.store import Store
from keel.core.webhooks import (
    TOLERANCE,
    BadSignature,
    secret_key,
    verify_github,
    verify_standard,
    verify_stripe,
)
from keel.runtime.records import Submission

Verifier = Callable[[Mapping[str, str], bytes], bool | str]
"""A user's verification: (headers by lower-case name, raw body) -> False to refuse, True to
accept, or the delivery's id to accept it under."""
VERIFY = ("standard", "github", "stripe")
MAX_BYTES = 1_000_000
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_FIELD = re.compile(r"\{([^{}]+)\}")
_JOB_CHARS = re.compile(r"[^a-z0-9._-]+")
log = logging.getLogger("keel.runtime.inbound")


class BadPayload(UsageError):
    """A verified delivery whose payload cannot become a submit (no such field for the job id,
    a malformed body)."""


@dataclass(frozen=True)
class InboundHook:
    name: str
    workflow: str
    verify: str | Verifier
    secret: str | None = None
    job_id: str | Callable[[Any], str] | None = None
    input: Callable[[Any], Any] | None = None
    tolerance: float = TOLERANCE
    max_bytes: int = MAX_BYTES

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise UsageError(
                f"webhook name {self.name!r}: lowercase letters, digits, '.', '_' and '-'"
            )
        if isinstance(self.verify, str):
            if self.verify not in VERIFY:
                raise UsageError(f"verify is one of {', '.join(VERIFY)} or a function")
            if not self.secret:
                raise UsageError(f"webhook {self.name!r}: verify={self.verify!r} needs secret=")
            if self.verify == "standard":
                secret_key(self.secret)  # refused at declaration, not at the first delivery
        elif not callable(self.verify):
            raise UsageError("verify is one of standard, github, stripe or a function")
        if self.max_bytes < 1 or self.tolerance <= 0:
            raise UsageError("max_bytes and tolerance must be more than zero")

    def verified(self, headers: Mapping[str, str], body: bytes, *, now: float) -> str | None:
        """Check the delivery's signature (BadSignature otherwise); its id when the headers
        carry it (Stripe's is in the payload: None)."""
        assert self.secret is not None or not isinstance(self.verify, str)
        if self.verify == "standard":
            return verify_standard(
                str(self.secret), headers, body, now=now, tolerance=self.tolerance
            )
        if self.verify == "github":
            return verify_github(str(self.secret), headers, body)
        if self.verify == "stripe":
            verify_stripe(str(self.secret), headers, body, now=now, tolerance=self.tolerance)
            return None
        assert callable(self.verify)
        answer = self.verify(headers, body)
        if answer is False or answer is None:
            raise BadSignature("bad_signature", "the webhook's verify function refused it")
        return answer if isinstance(answer, str) and answer else None

    def delivery_id(self, verified: str | None, payload: Any, body: bytes) -> str:
        """The id a replay of this delivery shares: the sender's, else the body's digest."""
        if verified:
            return verified[:200]
        if self.verify == "stripe":
            event = payload.get("id") if isinstance(payload, dict) else None
            if not isinstance(event, str) or not event:
                raise BadPayload("a Stripe event carries its id")
            return event[:200]
        return "sha256:" + hashlib.sha256(body).hexdigest()

    def job_of(self, payload: Any, delivery_id: str) -> str:
        """The submit's job id: the declaration's template or function, else one per delivery."""
        if callable(self.job_id):
            raw = str(_mapped(self.job_id, payload, "job_id"))
        elif isinstance(self.job_id, str):
            raw = _FIELD.sub(lambda m: str(_field(payload, m.group(1))), self.job_id)
        else:
            raw = f"hook-{self.name}-{delivery_id}"
        return job_id_from(raw)

    def input_of(self, payload: Any) -> Any:
        return _mapped(self.input, payload, "input") if self.input is not None else payload


_MAPPING_ERRORS = (KeyError, IndexError, TypeError, ValueError, AttributeError)


def _mapped(function: Callable[[Any], Any], payload: Any, what: str) -> Any:
    """The declaration's `job_id=`/`input=` function of a verified payload. A payload it cannot
    read (a list where it indexes a field, a field missing) is the sender's mistake, a 400: a
    5xx would have the sender retry the same body for ever."""
    try:
        return function(payload)
    except _MAPPING_ERRORS as exc:
        raise BadPayload(
            f"the webhook's {what}= could not read the payload ({type(exc).__name__}: {exc})"
        ) from None


def _field(payload: Any, path: str) -> Any:
    value = payload
    for part in path.strip().split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise BadPayload(f"the payload has no {path.strip()!r} for the job id")
    if isinstance(value, dict | list) or value is None:
        raise BadPayload(f"the payload's {path.strip()!r} is not a plain value for the job id")
    return value


def job_id_from(raw: str) -> str:
    """A valid job id from any text: lowercased, other characters made '-', and a short digest
    of the original when that changed it (so two ids differing only in case stay two)."""
    cleaned = _JOB_CHARS.sub("-", raw.lower()).strip("-.") or "hook"
    if cleaned != raw:
        # A lone surrogate in the payload's text cannot be digested: the sender's mistake.
        encoded = raw.encode(errors="surrogatepass")
        cleaned = f"{cleaned[:150]}-{hashlib.sha256(encoded).hexdigest()[:10]}"
    try:
        return validate_job_id(cleaned)
    except InvalidId as exc:
        raise BadPayload(str(exc)) from None


async def accept(
    store: Store,
    submit: Callable[..., Awaitable[Submission]],
    hook: str,
    delivery_id: str,
    *,
    workflow: str,
    job_id: str,
    input: Any,
) -> tuple[str, bool]:
    """Admit the run of a verified delivery once; (its run id, whether the delivery was seen
    before). The database decides a replay (the delivery's row); a replay that finds no run
    yet (its first is still submitting, or failed to) submits the same job and input, which
    admission makes the same run."""
    seen = await store.record_hook_delivery(hook, delivery_id)
    if seen is not None and seen["run_id"]:
        return str(seen["run_id"]), True
    try:
        submitted = await submit(workflow, input, job_id=job_id)
    except (InvalidInput, UsageError):
        if seen is None:  # refused (a 400): not remembered, so the delivery fixed is admitted
            await store.forget_hook_delivery(hook, delivery_id)
        raise
    await store.set_hook_delivery_run(hook, delivery_id, submitted.run_id)
    if seen is None and not submitted.created:
        # A new delivery whose job already had its run (a `job_id=` template that maps
        # several events to one job): that run goes on, this payload is not its input.
        log.info(
            "webhook %s: delivery %s admitted no run: its job %s already has run %s",
            hook,
            delivery_id,
            job_id,
            submitted.run_id,
            extra={"event": "webhook.folded", "run_id": submitted.run_id},
        )
    return submitted.run_id, seen is not None
