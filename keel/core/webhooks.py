"""Webhook signatures and where a webhook may go: the one implementation of each rule, for the
completion webhooks Keel sends (keel.runtime.webhooks) and the ones it receives
(keel.service.hooks).

- Standard Webhooks (https://www.standardwebhooks.com): headers `webhook-id`,
  `webhook-timestamp` and `webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">`,
  the key being the base64 part of a `whsec_` secret. Keel signs with it and verifies it.
- GitHub: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`, keyed by the secret's text.
- Stripe: `Stripe-Signature: t=<timestamp>,v1=<hex HMAC-SHA256 of "t.body">`, keyed likewise.

A verifier raises `BadSignature` with a `code` (missing_signature, bad_signature,
stale_timestamp, bad_timestamp) and never puts a secret or a signature in its message.

`WebhookSettings` say which private destinations a completion webhook may reach: loopback,
link-local, private and other non-public addresses are refused unless allowed by address,
network or host name; every address a host resolves to is checked.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from keel.core.errors import KeelError, UsageError, WebhookRefused
from keel.core.ids import whole_number

SECRET_PREFIX = "whsec_"
TOLERANCE = 300.0
"""Seconds a signed timestamp may be off the receiver's clock (Standard Webhooks and Stripe both
recommend five minutes)."""

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class BadSignature(KeelError):
    """A webhook's signature is missing, wrong or stale."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- Standard Webhooks -----------------------------------------------------------------------


def secret_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret: the base64 after `whsec_`."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise UsageError("a webhook secret is `whsec_` followed by base64 (Standard Webhooks)")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise UsageError("the webhook secret after `whsec_` is not base64") from None
    if len(key) < 16:
        raise UsageError("a webhook secret needs at least 16 bytes of key (24 base64 characters)")
    return key


def new_secret() -> str:
    """A fresh Standard Webhooks secret (32 random bytes)."""
    return SECRET_PREFIX + base64.b64encode(os.urandom(32)).decode()


def sign(secret: str, delivery_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header of one delivery: `v1,<base64 HMAC-SHA256>`."""
    signed = f"{delivery_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_headers(secret: str, delivery_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers of one delivery."""
    return {
        "webhook-id": delivery_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, delivery_id, timestamp, body),
    }


def verify_standard(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float,
    tolerance: float = TOLERANCE,
) -> str:
    """Check a Standard Webhooks delivery (`headers` by lower-case name); its id. Any one of
    the space-separated `v1,` signatures may match (a sender rotating its secret sends two)."""
    delivery_id = headers.get("webhook-id")
    timestamp = headers.get("webhook-timestamp")
    signatures = headers.get("webhook-signature")
    if not delivery_id or not timestamp or not signatures:
        raise BadSignature(
            "missing_signature", "webhook-id, webhook-timestamp and webhook-signature are needed"
        )
    seconds = _timestamp(timestamp, now, tolerance)
    candidates = [c for c in signatures.split() if c.startswith("v1,")]
    _one_matches(candidates, sign(secret, delivery_id, seconds, body))
    return delivery_id


# -- GitHub and Stripe -----------------------------------------------------------------------


def _hex_hmac(secret: str, data: bytes) -> str:
    return hmac.new(secret.encode(), data, hashlib.sha256).hexdigest()


def verify_github(secret: str, headers: Mapping[str, str], body: bytes) -> str:
    """Check GitHub's `X-Hub-Signature-256`; the delivery's id (`X-GitHub-Delivery`). GitHub
    signs no timestamp: its replays are told apart by the delivery id alone."""
    signature = headers.get("x-hub-signature-256")
    delivery_id = headers.get("x-github-delivery")
    if not signature or not delivery_id:
        raise BadSignature(
            "missing_signature", "X-Hub-Signature-256 and X-GitHub-Delivery are needed"
        )
    _one_matches([signature.strip()], "sha256=" + _hex_hmac(secret, body))
    return delivery_id


def stripe_header(secret: str, timestamp: int, body: bytes) -> str:
    """A `Stripe-Signature` header as Stripe computes it (for tests and for senders)."""
    return f"t={timestamp},v1=" + _hex_hmac(secret, f"{timestamp}.".encode() + body)


def verify_stripe(
    secret: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float,
    tolerance: float = TOLERANCE,
) -> None:
    """Check Stripe's `Stripe-Signature` (`t=...,v1=...`, any `v1` may match). The delivery id
    is the event's own `id`, read from the body once it is trusted."""
    header = headers.get("stripe-signature")
    if not header:
        raise BadSignature("missing_signature", "Stripe-Signature is needed")
    parts = [p.split("=", 1) for p in header.split(",") if "=" in p]
    stamps = [v for k, v in parts if k.strip() == "t"]
    candidates = [v.strip() for k, v in parts if k.strip() == "v1"]
    if len(stamps) != 1 or not candidates:
        raise BadSignature("missing_signature", "Stripe-Signature needs one t= and a v1=")
    seconds = _timestamp(stamps[0], now, tolerance)
    _one_matches(candidates, _hex_hmac(secret, f"{seconds}.".encode() + body))


def _one_matches(candidates: Iterable[str], expected: str) -> None:
    """Raise bad_signature unless one of the signatures sent is `expected` (compared in
    constant time: a sender may send several, rotating its secret)."""
    wanted = expected.encode()
    if not any(hmac.compare_digest(c.encode(), wanted) for c in candidates):
        raise BadSignature("bad_signature", "the signature does not match")


def _timestamp(text: str, now: float, tolerance: float) -> int:
    seconds = whole_number(text, digits=12)
    if seconds is None:
        raise BadSignature("bad_timestamp", "the signed timestamp is not a number of seconds")
    if abs(now - seconds) > tolerance:
        raise BadSignature(
            "stale_timestamp", f"the signed timestamp is more than {tolerance:g}s off"
        )
    return seconds


# -- where a completion webhook may go ----------------------------------------------------------


def _allowed(entries: Iterable[str]) -> tuple[frozenset[str], tuple[IPNetwork, ...]]:
    hosts: set[str] = set()
    networks: list[IPNetwork] = []
    for raw in entries:
        entry = raw.strip()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            hosts.add(entry.lower().rstrip("."))
    return frozenset(hosts), tuple(networks)


@dataclass(frozen=True)
class Destination:
    """A checked webhook URL: its host (for the Host header and TLS), and the addresses it
    resolved to when checked, the only ones a delivery connects to."""

    scheme: str
    host: str
    port: int
    target: str
    """The path and query the request asks for."""
    addresses: tuple[IPAddress, ...]


@dataclass(frozen=True)
class WebhookSettings:
    """How this process signs completion webhooks and where it lets them go: from the App's
    configuration, else `KEEL_WEBHOOK_SECRET` and `KEEL_WEBHOOK_ALLOW_HOSTS` (comma-separated
    addresses, networks such as `10.0.0.0/8`, or host names)."""

    secret: str | None = None
    allow_hosts: tuple[str, ...] = ()
    max_attempts: int = 10
    """Deliveries of one webhook before it is dead (`keel effects retry` revives it)."""
    timeout: float = 10.0
    """Seconds one delivery may wait for the receiver at a time (to connect, or between two
    bytes of its answer)."""
    deadline: float = 30.0
    """Seconds one delivery may take in all: a receiver answering a byte at a time cannot hold
    it longer (the attempt is a network failure, retried)."""
    _hosts: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)
    _networks: tuple[IPNetwork, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.secret is not None:
            secret_key(self.secret)  # refused now, not at the first delivery
        if self.max_attempts < 1:
            raise UsageError("webhook max_attempts must be at least 1")
        if not self.timeout > 0 or not self.deadline > 0:
            raise UsageError("webhook timeout and deadline are seconds, more than zero")
        hosts, networks = _allowed(self.allow_hosts)
        object.__setattr__(self, "_hosts", hosts)
        object.__setattr__(self, "_networks", networks)

    @classmethod
    def configure(
        cls,
        secret: str | None = None,
        allow_hosts: Iterable[str] | str | None = None,
        *,
        max_attempts: int = 10,
        timeout: float = 10.0,
        deadline: float | None = None,
    ) -> WebhookSettings:
        """The App's settings, the environment's where the App gives none
        (`KEEL_WEBHOOK_DEADLINE` too)."""
        secret = secret or os.environ.get("KEEL_WEBHOOK_SECRET") or None
        if allow_hosts is None:
            allow_hosts = os.environ.get("KEEL_WEBHOOK_ALLOW_HOSTS", "")
        if isinstance(allow_hosts, str):
            allow_hosts = allow_hosts.split(",")
        if deadline is None:
            try:
                deadline = float(os.environ.get("KEEL_WEBHOOK_DEADLINE") or 30.0)
            except ValueError:
                raise UsageError("KEEL_WEBHOOK_DEADLINE is seconds, e.g. 30") from None
        return cls(
            secret,
            tuple(allow_hosts),
            max_attempts=max_attempts,
            timeout=timeout,
            deadline=deadline,
        )

    def signing_secret(self) -> str:
        if not self.secret:
            raise WebhookRefused(
                "completion webhooks are signed: set KEEL_WEBHOOK_SECRET (or the App's "
                "webhook_secret) to a `whsec_` secret"
            )
        return self.secret

    def check_url(self, url: str) -> tuple[str, int]:
        """The URL's host and port if Keel may call it: http(s), a host, and every address the
        host resolves to public or allowed (a host name allowed is not resolved).
        WebhookRefused otherwise; OSError if the host does not resolve now."""
        _, host, port, _ = _parts(url)
        if host not in self._hosts:
            self._checked(host, resolve(host, port))
        return host, port

    def destination(self, url: str) -> Destination:
        """Where a delivery to `url` connects, checked as `check_url` checks it. The host is
        resolved once: the delivery connects to these addresses, never to a second answer a
        resolver might give in between."""
        scheme, host, port, target = _parts(url)
        addresses = resolve(host, port)
        if host not in self._hosts:
            self._checked(host, addresses)
        return Destination(scheme, host, port, target, tuple(addresses))

    def _checked(self, host: str, addresses: list[IPAddress]) -> None:
        for address in addresses:
            if not self.may_reach(address):
                raise WebhookRefused(
                    f"webhook host {host} resolves to {address}, a private address; allow it "
                    "with KEEL_WEBHOOK_ALLOW_HOSTS (or the App's webhook_allow_hosts)"
                )

    def may_reach(self, address: IPAddress) -> bool:
        forms: list[IPAddress] = [address]
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            forms.append(address.ipv4_mapped)  # ::ffff:127.0.0.1 is 127.0.0.1
        if any(form in network for form in forms for network in self._networks):
            return True
        return all(form.is_global and not form.is_multicast for form in forms)


def _parts(url: str) -> tuple[str, str, int, str]:
    """A webhook URL's scheme, host, port and request target; WebhookRefused if it is not one."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookRefused(f"a webhook URL is http(s)://host/...; not {url!r}")
    if parts.username or parts.password:
        raise WebhookRefused("a webhook URL carries no credentials: sign with the secret")
    host = parts.hostname.lower().rstrip(".")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise WebhookRefused(f"a webhook URL's port is not a number: {url!r}") from None
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, host, port, target


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to now (an address literal is itself)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted(
        {ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in found}, key=str
    )
