"""Webhook signatures against published vectors, and where a completion webhook may go."""

from __future__ import annotations

import ipaddress

import pytest

from keel.core.errors import UsageError, WebhookRefused
from keel.core.ids import whole_number
from keel.core.webhooks import (
    BadSignature,
    WebhookSettings,
    new_secret,
    sign,
    signed_headers,
    stripe_header,
    verify_github,
    verify_standard,
    verify_stripe,
)
from keel.runtime.inbound import BadPayload, InboundHook, job_id_from
from keel.runtime.webhook_http import retry_after

# Standard Webhooks' published test vector (its reference libraries test against it).
VECTOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VECTOR_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
VECTOR_TS = 1614265330
VECTOR_BODY = b'{"test": 2432232314}'
VECTOR_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_standard_webhooks_signature_matches_the_published_vector() -> None:
    assert sign(VECTOR_SECRET, VECTOR_ID, VECTOR_TS, VECTOR_BODY) == VECTOR_SIG
    headers = signed_headers(VECTOR_SECRET, VECTOR_ID, VECTOR_TS, VECTOR_BODY)
    assert verify_standard(VECTOR_SECRET, headers, VECTOR_BODY, now=VECTOR_TS + 10) == VECTOR_ID


BAD_TS = "bad_timestamp"


def test_standard_verification_refuses_forged_stale_and_missing() -> None:
    headers = signed_headers(VECTOR_SECRET, VECTOR_ID, VECTOR_TS, VECTOR_BODY)
    cases = [
        (VECTOR_SECRET, headers, b'{"test": 1}', VECTOR_TS, "bad_signature"),
        (new_secret(), headers, VECTOR_BODY, VECTOR_TS, "bad_signature"),
        (VECTOR_SECRET, headers, VECTOR_BODY, VECTOR_TS + 301, "stale_timestamp"),
        (VECTOR_SECRET, headers, VECTOR_BODY, VECTOR_TS - 301, "stale_timestamp"),
        (VECTOR_SECRET, {**headers, "webhook-timestamp": "soon"}, VECTOR_BODY, 0, "bad_timestamp"),
        # Digits to str.isdigit, not to int(): a 401, never a 500 the sender would retry.
        (VECTOR_SECRET, {**headers, "webhook-timestamp": "\xb2"}, VECTOR_BODY, 0, "bad_timestamp"),
        (VECTOR_SECRET, {**headers, "webhook-timestamp": "9" * 5000}, VECTOR_BODY, 0, BAD_TS),
        (VECTOR_SECRET, {"webhook-id": VECTOR_ID}, VECTOR_BODY, VECTOR_TS, "missing_signature"),
        (
            VECTOR_SECRET,
            {**headers, "webhook-id": "msg_other"},
            VECTOR_BODY,
            VECTOR_TS,
            "bad_signature",
        ),
    ]
    for secret, given, body, now, code in cases:
        with pytest.raises(BadSignature) as refused:
            verify_standard(secret, given, body, now=now)
        assert refused.value.code == code
        assert VECTOR_SIG not in str(refused.value) and VECTOR_SECRET not in str(refused.value)


def test_standard_verification_takes_any_of_several_signatures() -> None:
    rotated = {
        "webhook-id": VECTOR_ID,
        "webhook-timestamp": str(VECTOR_TS),
        "webhook-signature": f"v1,bm9wZQ== {VECTOR_SIG}",
    }
    assert verify_standard(VECTOR_SECRET, rotated, VECTOR_BODY, now=VECTOR_TS) == VECTOR_ID


def test_github_signature_matches_its_documented_example() -> None:
    # docs.github.com, "Validating webhook deliveries": this secret and payload, this signature.
    secret, body = "It's a Secret to Everybody", b"Hello, World!"
    expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    headers = {"x-hub-signature-256": expected, "x-github-delivery": "d-1"}
    assert verify_github(secret, headers, body) == "d-1"
    with pytest.raises(BadSignature) as refused:
        verify_github("another secret", headers, body)
    assert refused.value.code == "bad_signature"


def test_stripe_signature_round_trips_within_its_tolerance_only() -> None:
    secret, body = "whsec_stripe_test", b'{"id": "evt_1"}'
    headers = {"stripe-signature": stripe_header(secret, 1_700_000_000, body)}
    verify_stripe(secret, headers, body, now=1_700_000_100)
    with pytest.raises(BadSignature) as stale:
        verify_stripe(secret, headers, body, now=1_700_000_400)
    assert stale.value.code == "stale_timestamp"
    with pytest.raises(BadSignature) as forged:
        verify_stripe(secret, headers, b'{"id": "evt_2"}', now=1_700_000_000)
    assert forged.value.code == "bad_signature"


def test_secrets_are_whsec_base64() -> None:
    for bad in ("plain", "whsec_not base64!", "whsec_c2hvcnQ="):
        with pytest.raises(UsageError):
            WebhookSettings(secret=bad)
    assert WebhookSettings(secret=new_secret()).signing_secret().startswith("whsec_")
    with pytest.raises(WebhookRefused):
        WebhookSettings().signing_secret()


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "192.168.0.1",
        "172.16.5.5",
        "169.254.169.254",
        "::1",
        "fe80::1",
        "::ffff:127.0.0.1",
        "0.0.0.0",
        "100.64.0.1",
    ],
)
def test_private_addresses_are_refused_unless_allowed(address: str) -> None:
    host = f"[{address}]" if ":" in address else address
    with pytest.raises(WebhookRefused):
        WebhookSettings().check_url(f"http://{host}:8080/hook")
    allowed = WebhookSettings(allow_hosts=(address,))
    assert allowed.may_reach(ipaddress.ip_address(address))


def test_allowed_networks_and_public_addresses() -> None:
    settings = WebhookSettings.configure(allow_hosts="127.0.0.1, 10.0.0.0/8")
    assert settings.check_url("http://10.9.8.7/x") == ("10.9.8.7", 80)
    assert settings.check_url("https://127.0.0.1/x") == ("127.0.0.1", 443)
    assert WebhookSettings().check_url("https://93.184.215.14/hook") == ("93.184.215.14", 443)
    for bad in ("ftp://93.184.215.14/x", "http:///x", "https://user:pw@93.184.215.14/"):
        with pytest.raises(WebhookRefused):
            WebhookSettings().check_url(bad)


def test_inbound_job_ids_come_from_the_payload_or_the_delivery() -> None:
    hook = InboundHook("gh", "wf", "github", "s", job_id="pr-{repository.id}-{pull_request.number}")
    payload = {"repository": {"id": 7}, "pull_request": {"number": 42}}
    assert hook.job_of(payload, "d-1") == "pr-7-42"
    with pytest.raises(BadPayload):
        hook.job_of({"repository": {"id": 7}}, "d-1")
    by_delivery = InboundHook("gh", "wf", "github", "s")
    assert by_delivery.job_of(payload, "abc-1") == "hook-gh-abc-1"
    # Case is kept apart: two ids differing only in case are two jobs.
    assert job_id_from("Msg_A") != job_id_from("msg_a")
    assert InboundHook("f", "wf", "github", "s", job_id=lambda p: p["k"]).job_of({"k": "X"}, "")


def test_inbound_declarations_are_checked() -> None:
    with pytest.raises(UsageError):
        InboundHook("Bad Name", "wf", "github", "s")
    with pytest.raises(UsageError):
        InboundHook("gh", "wf", "github")  # no secret
    with pytest.raises(UsageError):
        InboundHook("sw", "wf", "standard", "not-whsec")
    with pytest.raises(UsageError):
        InboundHook("x", "wf", "hmac", "s")


def test_whole_numbers_are_ascii_digits_that_fit_a_column() -> None:
    assert [whole_number(t) for t in ("0", " 42 ", "007")] == [0, 42, 7]
    for text in ("", None, "-1", "1.5", "\xb2", "\u0663", "9" * 19, "1e3", "soon"):
        assert whole_number(text) is None, text
    assert retry_after("120") == 120.0
    assert retry_after("\xb2") is None and retry_after("9" * 5000) is None
