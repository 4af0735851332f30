"""Slack for approvals, outbound: a notifier that posts and updates approval messages.

`SlackNotifier` is a Keel notifier (see keel.core.notification_outbox): the outbox hands it each
notification once.
A request becomes a message with the wait's payload and Approve/Reject buttons (their value is
the wait id); reminders and escalations are replies in its thread; a decision or an expired
deadline edits the message in place. Every message carries Slack message metadata naming the
outbox intent that posted it, so when a dispatcher died between posting and recording, Keel's
reconciler finds the message in the channel history instead of posting it twice.

The clicks on those buttons come back through `keel.service.slack` (`POST /slack/actions`).
See docs/slack.md for wiring a Slack app.
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import re
from collections.abc import Callable
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from keel.core import notification_outbox, notifications
from keel.core.deadlines import DECISION_ON_TIMEOUT
from keel.core.decisions import check_answer
from keel.core.errors import TransientError, UsageError, WrongWaitKind
from keel.core.lifecycle import Decision
from keel.core.notifications import Notification

EVENT_TYPE = "keel_notification"
APPROVE, REJECT = "keel_approve", "keel_reject"
BUTTONS = (("Approve", APPROVE, "primary"), ("Reject", REJECT, "danger"))
MAX_FIELDS = 20
_USER_ID = re.compile(r"[UW][A-Z0-9]{2,}")
_CHANNEL_ID = re.compile(r"[CGD][A-Z0-9]{2,}")


# -- rendering -------------------------------------------------------------------------------


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


_BROADCAST = re.compile(r"@(?=(?:channel|here|everyone)\b)", re.IGNORECASE)


def plain(text: Any) -> str:
    """`text` shown as itself: Slack's control characters escaped (`<@U123>`, `<!channel>`
    become text), and `@channel`, `@here`, `@everyone` kept from notifying anyone."""
    return _BROADCAST.sub("@\u2060", _escape(str(text)))


def decider(details: dict[str, Any]) -> str:
    """Who decided, for the decision message. A mention only for an identity Slack vouched
    for: a click on Slack's buttons, whose user id Slack signed (`principal` "slack:U..." and
    `by` the same, channel slack). Any other `by` is what its caller typed (the console, the
    HTTP API): shown as plain text, with the identity that made the call beside it."""
    by, principal = details.get("by"), details.get("principal")
    if details.get("channel") == "slack" and by and by == principal:
        user = str(by).removeprefix("slack:")
        if str(by).startswith("slack:") and _USER_ID.fullmatch(user):
            return f"<@{user}>"
    shown = plain(by or "someone")
    if principal and principal != by:
        shown += f" (as {plain(principal)})"
    return shown


def mention(who: Any) -> str:
    """`U123`/`slack:U123` -> a Slack user mention; `C123` -> a channel link; else the text.
    For the names the workflow's code gives (approvers, escalate_to), not a caller's `by`."""
    name = str(who)
    bare = name.removeprefix("slack:")
    if _USER_ID.fullmatch(bare):
        return f"<@{bare}>"
    if _CHANNEL_ID.fullmatch(bare):
        return f"<#{bare}>"
    if name in ("@here", "@channel"):
        return f"<!{name[1:]}>"
    return _escape(name)


def _deadline(deadline: Any) -> str:
    if deadline is None:
        return "no deadline"
    at = int(float(deadline))
    fallback = dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{at}^{{date_short_pretty}} at {{time}}|{fallback}>"


def _value_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "```" + json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "```"


def _mrkdwn(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": _clip(text, 3000)}}


def _context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": _clip(text, 3000)}]}


def payload_blocks(payload: Any) -> list[dict[str, Any]]:
    """The wait's payload, one section per top-level field (Slack allows 50 blocks)."""
    if payload is None:
        return []
    items = list(payload.items()) if isinstance(payload, dict) else [("payload", payload)]
    blocks = [
        _mrkdwn(f"*{_escape(str(key))}*\n{_clip(_escape(_value_text(value)), 2900)}")
        for key, value in items[:MAX_FIELDS]
    ]
    if len(items) > MAX_FIELDS:
        blocks.append(_context(f"… and {len(items) - MAX_FIELDS} more fields"))
    return blocks


def message(note: Notification, outcome: str | None = None) -> tuple[str, list[dict[str, Any]]]:
    """The approval message: fallback text and blocks; with buttons until `outcome` is set."""
    wait = note.wait
    name = str(wait.get("name") or "approval")
    title = f"Approval needed: {name}" if outcome is None else f"Approval {name}: decided"
    approvers = ", ".join(mention(a) for a in wait.get("approvers") or []) or "anyone"
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": _clip(title, 150)}},
        _context(
            f"*{_escape(note.workflow)}* · job `{_escape(note.job_id)}` · run `{note.run_id}`"
        ),
        *payload_blocks(wait.get("payload")),
        _context(f"Approvers: {approvers} · Deadline: {_deadline(wait.get('deadline'))}"),
    ]
    if outcome is not None:
        blocks.append(_mrkdwn(outcome))
    elif takes_verdict(str(wait.get("kind"))):
        blocks.append(
            {
                "type": "actions",
                "block_id": "keel_decision",
                "elements": [
                    {
                        "type": "button",
                        "text": {"type": "plain_text", "text": label},
                        "action_id": action_id,
                        "value": wait["wait_id"],
                        "style": style,
                    }
                    for label, action_id, style in BUTTONS
                ],
            }
        )
    else:
        blocks.append(
            _mrkdwn(
                f"This wait is a `{wait.get('kind')}`, not an approval: resolve it with "
                f"`keel resolve-effect {note.run_id} --wait-id {wait['wait_id']}`."
            )
        )
    return f"{title} ({note.job_id})", blocks[:50]


def takes_verdict(wait_kind: str) -> bool:
    """Whether Approve/Reject answers a wait of this kind (an in-doubt effect takes neither)."""
    # Not a check before an operation (the click's decision is refused by the core itself):
    # the message is drawn before anyone clicks, and buttons go only where a click can count.
    # The core's rule is asked, not restated; no wait is named, so no wait_id.
    try:
        check_answer(wait_kind, Decision.APPROVED, wait_id="")
    except WrongWaitKind:
        return False
    return True


def outcome_text(note: Notification) -> str:
    if note.kind == "expired":
        policy = str(note.details.get("policy", ""))
        decision = DECISION_ON_TIMEOUT.get(policy, "timed_out")
        return f":hourglass: The deadline passed: *{decision}* (policy `{policy}`)."
    decision = str(note.details.get("decision", "decided"))
    icon = {"approved": ":white_check_mark:", "rejected": ":x:"}.get(decision, ":ballot_box:")
    by = decider(note.details)
    via = plain(note.details.get("channel"))
    text = f"{icon} *{_escape(decision.capitalize())}* by {by} via {via}"
    if comment := note.details.get("comment"):
        text += f"\n> {plain(comment)}"
    return text


def follow_up_text(note: Notification) -> str:
    wait = note.wait
    # An escalation names its people (the wait's `escalate_to`, at a stage or at the deadline's
    # `escalate` policy); the approvers only when the approval names nobody to escalate to.
    who = note.details.get("to") if note.kind == "escalate" else None
    people = ", ".join(mention(p) for p in (who or wait.get("approvers") or []))
    when = _deadline(wait.get("deadline"))
    if note.kind == "escalate":
        return (
            f":rotating_light: Escalated to {people or 'the channel'}: still no decision "
            f"(deadline {when})."
        )
    for_whom = f" for {people}" if people else ""
    return f":bell: Reminder{for_whom}: this is waiting for a decision (deadline {when})."


# -- the notifier ----------------------------------------------------------------------------


class SlackNotifier:
    """Post approval requests to `channel` (a channel id, e.g. C0123ABCD); see module doc."""

    kinds: tuple[str, ...] = notifications.KINDS

    def __init__(
        self, client: WebClient, channel: str, name: str = "slack", *, history_pages: int = 5
    ) -> None:
        if not channel or channel.startswith("#"):
            raise UsageError(
                f"SlackNotifier needs a channel id (like C0123ABCD), not {channel!r}: "
                "reconciling reads the channel's history, which Slack serves by id only"
            )
        self.client = client
        self.channel = channel
        self.name = name
        self.history_pages = history_pages
        # Intents whose last attempt may have reached Slack (timeout, 5xx): look before posting.
        self._unsure: set[str] = set()

    def send(self, note: Notification) -> dict[str, Any]:
        if note.intent_id in self._unsure:
            found = self.reconcile(note)
            if found is not None:
                self._unsure.discard(note.intent_id)
                return found
        if note.kind == "request":
            result = self._request(note)
        elif note.kind in ("remind", "escalate"):
            result = self._follow_up(note)
        else:
            result = self._conclude(note)
        self._unsure.discard(note.intent_id)
        return result

    def reconcile(self, note: Notification) -> dict[str, Any] | None:
        """The message this notification posted (or the edit it made), if Slack has it."""
        if note.kind in ("decided", "expired"):
            anchor = self._anchor(note, read=True)
            if anchor is not None and anchor["meta"].get("concluded_by") == note.intent_id:
                return self._result(note, anchor["channel"], anchor["ts"], updated=True)
        elif note.kind in ("remind", "escalate"):
            request = _posted(note.earlier.get("request"))
            if request is not None:
                found = self._search(
                    note, "conversations_replies", channel=request["channel"], ts=request["ts"]
                )
                if found is not None:
                    return self._result(note, request["channel"], found["ts"])
        found = self._search(note, "conversations_history", channel=self.channel)
        return None if found is None else self._result(note, self.channel, found["ts"])

    # -- deliveries ----------------------------------------------------------------------

    def _request(self, note: Notification) -> dict[str, Any]:
        if "decided" in note.earlier or "expired" in note.earlier:
            return {"skipped": "the wait was decided before its request was delivered"}
        return self._post(note, *message(note))

    def _post(self, note: Notification, text: str, blocks: list[dict[str, Any]]) -> dict[str, Any]:
        resp = self._api(
            note,
            "chat_postMessage",
            channel=self.channel,
            text=text,
            blocks=blocks,
            metadata=self._metadata(note, note.intent_id),
        )
        return self._result(note, resp["channel"], resp["ts"])

    def _follow_up(self, note: Notification) -> dict[str, Any]:
        if "decided" in note.earlier or "expired" in note.earlier:
            return {"skipped": "the wait was decided before this was delivered"}
        request = _posted(note.earlier.get("request"))
        thread = {"thread_ts": request["ts"]} if request else {}
        resp = self._api(
            note,
            "chat_postMessage",
            channel=request["channel"] if request else self.channel,
            text=follow_up_text(note),
            metadata=self._metadata(note, note.intent_id),
            reply_broadcast=note.kind == "escalate" and bool(request),
            **thread,
        )
        return {**self._result(note, resp["channel"], resp["ts"]), **thread}

    def _conclude(self, note: Notification) -> dict[str, Any]:
        text, blocks = message(note, outcome_text(note))
        anchor = self._anchor(note, read=False)
        if anchor is None:  # the request never made it to Slack: say it in a message of its own
            return self._post(note, text, blocks)
        # The message keeps the request's intent id (its own reconciler still finds it) and
        # names the edit, so a retried edit can tell it was already made.
        meta = self._metadata(note, anchor["meta"].get("intent_id") or "", note.intent_id)
        self._api(
            note,
            "chat_update",
            channel=anchor["channel"],
            ts=anchor["ts"],
            text=text,
            blocks=blocks,
            metadata=meta,
        )
        return self._result(note, anchor["channel"], anchor["ts"], updated=True)

    # -- Slack calls ---------------------------------------------------------------------

    def _anchor(self, note: Notification, *, read: bool) -> dict[str, Any] | None:
        """The wait's request message and its metadata (as Slack has it now if `read`)."""
        request_id = notification_outbox.notification_id(
            note.run_id, note.wait["wait_id"], "request", 0, self.name
        )
        known = _posted(note.earlier.get("request"))
        if known is not None and not read:
            meta = {"intent_id": known.get("intent_id") or request_id}
            return {"channel": known["channel"], "ts": known["ts"], "meta": meta}
        if known is not None:
            resp = self._api(
                note,
                "conversations_history",
                channel=known["channel"],
                latest=known["ts"],
                oldest=known["ts"],
                inclusive=True,
                limit=1,
                include_all_metadata=True,
            )
            found = next((m for m in resp.get("messages", []) if m.get("ts") == known["ts"]), None)
            meta = _meta(found) if found else {}
            return {"channel": known["channel"], "ts": known["ts"], "meta": meta}
        message_ = self._search(
            note, "conversations_history", channel=self.channel, intent=request_id
        )
        if message_ is None:
            return None
        return {"channel": self.channel, "ts": message_["ts"], "meta": _meta(message_)}

    def _search(
        self, note: Notification, method: str, *, intent: str | None = None, **kwargs: Any
    ) -> dict[str, Any] | None:
        """Page through recent messages for the one whose metadata names `intent`."""
        wanted = intent or note.intent_id
        cursor = None
        for _ in range(self.history_pages):
            resp = self._api(
                note, method, limit=200, include_all_metadata=True, cursor=cursor, **kwargs
            )
            for found in resp.get("messages", []):
                if _meta(found).get("intent_id") == wanted:
                    return dict(found)
            cursor = (resp.get("response_metadata") or {}).get("next_cursor")
            if not resp.get("has_more") or not cursor:
                break
        return None

    def _api(self, note: Notification, method: str, **kwargs: Any) -> Any:
        call: Callable[..., Any] = getattr(self.client, method)
        try:
            return call(**kwargs)
        except SlackApiError as exc:
            status = int(getattr(exc.response, "status_code", 0) or 0)
            if status == 429:
                wait = _retry_after(getattr(exc.response, "headers", {}) or {})
                raise TransientError(f"Slack {method}: rate limited", retry_after=wait) from exc
            if status >= 500:
                self._unsure.add(note.intent_id)
                raise TransientError(f"Slack {method}: HTTP {status}") from exc
            raise
        except (OSError, http.client.HTTPException) as exc:  # URLError, timeouts, resets
            self._unsure.add(note.intent_id)
            raise TransientError(f"Slack {method}: {exc!r}") from exc

    def _metadata(
        self, note: Notification, intent_id: str, concluded_by: str | None = None
    ) -> dict[str, Any]:
        payload = {"intent_id": intent_id, "wait_id": note.wait["wait_id"], "run_id": note.run_id}
        if concluded_by:
            payload["concluded_by"] = concluded_by
        return {"event_type": EVENT_TYPE, "event_payload": payload}

    def _result(
        self, note: Notification, channel: str, ts: str, *, updated: bool = False
    ) -> dict[str, Any]:
        result = {"channel": channel, "ts": ts, "intent_id": note.intent_id}
        return {**result, "updated": True} if updated else result


def _posted(result: Any) -> dict[str, Any] | None:
    if isinstance(result, dict) and result.get("channel") and result.get("ts"):
        return result
    return None


def _meta(msg: dict[str, Any]) -> dict[str, Any]:
    meta = msg.get("metadata") or {}
    if meta.get("event_type") != EVENT_TYPE:
        return {}
    payload = meta.get("event_payload")
    return payload if isinstance(payload, dict) else {}


def _retry_after(headers: dict[str, Any]) -> float | None:
    for key, value in headers.items():
        if key.lower() == "retry-after":
            raw = value[0] if isinstance(value, list) else value
            try:
                return max(0.0, float(raw))
            except (TypeError, ValueError):
                return None
    return None
