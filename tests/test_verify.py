"""The verification rules of the pure core, one refusal code at a time."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from bus import EnvelopeRejected, KeyPair, Party, Sealer, TraceContext, TrustStore, Verifier
from bus.canonical import canonicalize
from bus.keys import b64url_encode
from bus.replay import LocalReplayGuard

NOW = 1_780_000_000_000
TRACE = TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7")
REQ = ("request",)


def seal(key: KeyPair, **over: Any) -> bytes:
    fields: dict[str, Any] = dict(
        kind="request",
        intent="task.execute",
        payload={"amount": 10, "items": ["a"]},
        correlation_id="corr-1",
        trace=TRACE,
        created_at=NOW,
        expires_at=NOW + 30_000,
        recipient=Party("executor"),
        reply_to="_INBOX.x.1",
    )
    fields.update(over)
    return Sealer(key).seal(**fields)[1]


def verifier(*keys: KeyPair, me: str = "executor") -> Verifier:
    return Verifier(TrustStore(k.public for k in keys), me)


def code_of(v: Verifier, body: bytes, now: int = NOW, kinds: tuple[str, ...] = REQ) -> str:
    with pytest.raises(EnvelopeRejected) as info:
        v.verify(body, now, kinds)
    return info.value.code


def test_valid_envelope_passes(keys: dict[str, KeyPair]) -> None:
    env = verifier(keys["planner"]).verify(seal(keys["planner"]), NOW, REQ)
    assert env.sender.agent_id == "planner" and env.payload["amount"] == 10


# Each member replaced by another *valid* value, so only the signature can catch it.
TAMPERS: dict[str, Any] = {
    "kind": "event",
    "message_id": "f" * 32,
    "correlation_id": "corr-2",
    "trace": {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4737-00f067aa0ba902b7-01"},
    "intent": "task.cancel",
    "payload": {"amount": 10000, "items": ["a"]},
    "created_at": NOW - 1,
    "expires_at": NOW + 29_999,
    "recipient": {"agent_id": "executor", "framework": "x"},
    "reply_to": "_INBOX.mallory.1",
    "a2a_version": "0.3",
    "extra_member": "smuggled",
}


@pytest.mark.parametrize("member", sorted(TAMPERS))
def test_every_member_tampered_is_bad_signature(keys: dict[str, KeyPair], member: str) -> None:
    raw = orjson.loads(seal(keys["planner"]))
    raw[member] = TAMPERS[member]
    assert (
        code_of(verifier(keys["planner"]), orjson.dumps(raw), kinds=("request", "event"))
        == "bad_signature"
    )


def test_tampered_sender_framework_and_signature_fields(keys: dict[str, KeyPair]) -> None:
    v = verifier(keys["planner"])
    raw = orjson.loads(seal(keys["planner"]))
    for path, value in [
        (("sender", "framework"), "evil"),
        (("signature", "sig"), "A" * 86),
        (("signature", "alg"), "HS256"),
    ]:
        t = copy.deepcopy(raw)
        t[path[0]][path[1]] = value
        assert code_of(v, orjson.dumps(t)) == "bad_signature", path
    del raw["signature"]
    assert code_of(v, orjson.dumps(raw)) == "bad_signature"


def test_unknown_signer(keys: dict[str, KeyPair]) -> None:
    assert code_of(verifier(keys["executor"]), seal(keys["planner"])) == "unknown_signer"


def test_key_may_sign_only_as_its_agent(keys: dict[str, KeyPair]) -> None:
    # mallory's trusted key, claiming to be the planner
    impostor = KeyPair.from_seed("planner", keys["mallory"].seed)
    v = Verifier(TrustStore([keys["planner"].public, keys["mallory"].public]), "executor")
    assert code_of(v, seal(impostor)) == "sender_mismatch"


def test_wrong_key_signature(keys: dict[str, KeyPair]) -> None:
    raw = orjson.loads(seal(keys["planner"]))
    unsigned = {k: v for k, v in raw.items() if k != "signature"}
    raw["signature"]["sig"] = b64url_encode(keys["mallory"].sign(canonicalize(unsigned)))
    assert code_of(verifier(keys["planner"]), orjson.dumps(raw)) == "bad_signature"


def test_expired_and_skew(keys: dict[str, KeyPair]) -> None:
    v, body = verifier(keys["planner"]), seal(keys["planner"])
    assert v.verify(body, NOW + 30_000 + 30_000, REQ)  # inside the 30 s skew
    assert code_of(v, body, now=NOW + 30_000 + 30_001) == "expired"


def test_future_dated(keys: dict[str, KeyPair]) -> None:
    body = seal(keys["planner"], created_at=NOW + 60_000, expires_at=NOW + 90_000)
    assert code_of(verifier(keys["planner"]), body) == "not_yet_valid"


def test_lifetime_cap(keys: dict[str, KeyPair]) -> None:
    body = seal(keys["planner"], expires_at=NOW + 3_600_000)
    assert code_of(verifier(keys["planner"]), body) == "lifetime_exceeded"


def test_wrong_recipient(keys: dict[str, KeyPair]) -> None:
    body = seal(keys["planner"], recipient=Party("executor-b"))
    assert code_of(verifier(keys["planner"]), body) == "not_recipient"


def test_reply_is_not_a_request(keys: dict[str, KeyPair]) -> None:
    body = seal(keys["planner"], kind="reply", in_reply_to="x" * 32)
    assert code_of(verifier(keys["planner"]), body) == "wrong_kind"


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1,2]",
        b'{"v":1}',
        b'{"v":2,"kind":"request"}',
        orjson.dumps({"v": 1, "kind": "request", "message_id": "bad id!"}),
    ],
)
def test_malformed(body: bytes, keys: dict[str, KeyPair]) -> None:
    assert code_of(verifier(keys["planner"]), body) in ("malformed", "unsupported_version")


async def test_local_replay_guard_window() -> None:
    guard = LocalReplayGuard()
    assert await guard.first_seen("k1", NOW + 10, NOW)
    assert not await guard.first_seen("k1", NOW + 10, NOW + 5)
    assert await guard.first_seen("k2", NOW + 100, NOW + 20)  # prunes k1 (expired)
    assert len(guard) == 1


def test_numbers_without_a_canonical_form_are_malformed(keys: dict[str, KeyPair]) -> None:
    raw = orjson.loads(seal(keys["planner"]))
    raw["payload"] = {"big": 2**60}
    assert code_of(verifier(keys["planner"]), orjson.dumps(raw)) == "malformed"
