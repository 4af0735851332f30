"""One completion webhook's HTTP request: to the addresses its host was checked at, within a
deadline.

The host is resolved once (`WebhookSettings.destination`) and the connection goes to one of
the addresses checked then: a resolver answering differently a moment later (DNS rebinding)
cannot send the request somewhere the check never saw. The host name still goes in the Host
header and, on https, in the TLS handshake (SNI) and the certificate check. No proxy is used:
a proxy would resolve the host again.

`timeout` bounds each wait on the receiver (to connect, for the next bytes of its answer);
`deadline` bounds the whole exchange, so a receiver that answers a byte every few seconds
cannot hold a delivery lane: past it the socket is shut down and the attempt is a network
failure, retried with back-off.
"""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import ipaddress
import socket
import ssl
import threading
import time

from keel.core.errors import TransientError
from keel.core.ids import whole_number
from keel.core.webhooks import Destination, IPAddress


class WebhookFailed(Exception):
    """The receiver refused the delivery for good (a 4xx other than 429): dead, for a person."""


def _connect(addresses: tuple[IPAddress, ...], port: int, timeout: float | None) -> socket.socket:
    """A TCP connection to the first of `addresses` that answers (no name is resolved)."""
    last: OSError = OSError("the webhook host resolved to no address")
    for address in addresses:
        family = socket.AF_INET6 if isinstance(address, ipaddress.IPv6Address) else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect((str(address), port))
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise last


class _Checked(http.client.HTTPConnection):
    """HTTP to the host's checked addresses."""

    def __init__(self, to: Destination, timeout: float) -> None:
        super().__init__(to.host, to.port, timeout=timeout)
        self.to = to

    def connect(self) -> None:
        self.sock = _connect(self.to.addresses, self.to.port, self.timeout)


class _CheckedTLS(http.client.HTTPSConnection):
    """HTTPS to the host's checked addresses, the certificate verified for the host name."""

    def __init__(self, to: Destination, timeout: float) -> None:
        self.tls = ssl.create_default_context()
        super().__init__(to.host, to.port, timeout=timeout, context=self.tls)
        self.to = to

    def connect(self) -> None:
        sock = self.sock = _connect(self.to.addresses, self.to.port, self.timeout)
        try:  # the deadline's watchdog can shut `sock` mid-handshake
            self.sock = self.tls.wrap_socket(sock, server_hostname=self.to.host)
        except BaseException:
            sock.close()
            raise


def retry_after(value: str | None) -> float | None:
    """Seconds a `Retry-After` asks for (a number, or an HTTP date); None if unreadable."""
    if not value:
        return None
    value = value.strip()
    seconds = whole_number(value, digits=12)
    if seconds is not None:
        return float(seconds)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def post(
    to: Destination, body: bytes, headers: dict[str, str], *, timeout: float, deadline: float
) -> int:
    """POST `body` to a checked destination; the receiver's 2xx status. TransientError for a
    network failure, a passed deadline, 429 or 5xx (with its Retry-After); WebhookFailed for
    any other answer (redirects are answers: following one could lead past the check)."""
    kind = _CheckedTLS if to.scheme == "https" else _Checked
    conn = kind(to, timeout=min(timeout, deadline))
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed
                sock.shutdown(socket.SHUT_RDWR)  # the blocked read returns now

    watchdog = threading.Timer(deadline, expire)
    watchdog.daemon = True
    started = time.monotonic()
    watchdog.start()
    try:
        conn.request("POST", to.target, body=body, headers=headers)
        answer = conn.getresponse()
        status, wait = int(answer.status), answer.getheader("Retry-After")
    except (OSError, http.client.HTTPException) as exc:
        # The socket's own timeout can fire a moment before the watchdog when both are the
        # deadline (timeout >= deadline): that is still the deadline passing.
        if expired.is_set() or time.monotonic() - started >= deadline:
            raise TransientError(
                f"webhook not delivered: no complete answer within its {deadline:g}s deadline"
            ) from None
        raise TransientError(f"webhook not delivered: {str(exc) or repr(exc)}") from None
    finally:
        watchdog.cancel()
        conn.close()
    if 200 <= status < 300:
        return status
    if status == 429 or status >= 500:
        raise TransientError(f"webhook receiver answered {status}", retry_after=retry_after(wait))
    raise WebhookFailed(f"webhook receiver answered {status}")
