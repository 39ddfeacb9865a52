"""Agent records: what an agent serves and is, signed by its own key. Pure.

A record is JSON (docs/REGISTRY.md): ``agent_id``, ``intents``, ``labels``,
``public_key``, ``kid``, the A2A ``card``, ``version``, ``registered_at``,
``heartbeat_at``, ``ttl_ms``, an optional operator ``endorsement`` and ``signatures``.

Signatures are JWS with detached payload, as A2A signs agent cards (A2A.md §6): the
protected header is ``{"alg":"EdDSA","kid":…,"typ":"JOSE"}``, the payload is the RFC 8785
form of the record without ``signatures``, and the signing input is
``BASE64URL(protected) "." BASE64URL(payload)``. The endorsement is the same kind of JWS,
by an operator key, over ``{"agent_id","kid","public_key"}``: it vouches for the key, so
an endorsed record survives heartbeats without the operator signing each one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from bus import KeyPair, PublicKey
from bus.canonical import canonicalize
from bus.errors import EnvelopeRejected, InvalidIntentError
from bus.keys import b64url_decode, b64url_encode
from bus.subjects import validate_agent_id, validate_intent

__all__ = [
    "AgentRecord",
    "RecordRejected",
    "decode_record",
    "default_card",
    "endorse",
    "jws_sign",
    "jws_verify",
    "verify_endorsement",
]

RECORD_VERSION = 1
_LABEL = re.compile(
    r"(?:[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?"
)
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?")


class RecordRejected(EnvelopeRejected):
    """A record the registry refuses: ``malformed``, ``bad_signature``, ``unknown_signer``,
    ``revoked`` or ``expired``."""


def jws_sign(key: KeyPair, payload: Any) -> dict[str, str]:
    """A detached-payload JWS (EdDSA) over the canonical form of ``payload``."""
    header = b64url_encode(canonicalize({"alg": "EdDSA", "kid": key.kid, "typ": "JOSE"}))
    signing_input = f"{header}.{b64url_encode(canonicalize(payload))}".encode()
    return {"protected": header, "signature": b64url_encode(key.sign(signing_input))}


def jws_verify(jws: Any, payload: Any, key: PublicKey) -> bool:
    """True when ``jws`` is a valid EdDSA signature by ``key`` over ``payload``."""
    if not isinstance(jws, dict):
        return False
    try:
        header = orjson.loads(b64url_decode(jws["protected"]))
        if header.get("alg") != "EdDSA" or header.get("kid") != key.kid:
            return False
        signing_input = f"{jws['protected']}.{b64url_encode(canonicalize(payload))}".encode()
        return key.verify(signing_input, b64url_decode(jws["signature"]))
    except (KeyError, TypeError, ValueError, orjson.JSONDecodeError):
        return False


def default_card(agent_id: str, intents: list[str], description: str = "") -> dict[str, Any]:
    """A minimal A2A AgentCard: one skill per intent."""
    return {
        "name": agent_id,
        "description": description or f"intentbus agent {agent_id}",
        "version": "1.0.0",
        "capabilities": {},
        "defaultInputModes": ["application/json"],
        "defaultOutputModes": ["application/json"],
        "skills": [
            {"id": i, "name": i, "description": f"serves {i}", "tags": [i.split(".")[0]]}
            for i in intents
        ],
    }


def endorsement_payload(agent_id: str, public: PublicKey) -> dict[str, str]:
    """What an operator signs to vouch for an agent's key."""
    return {"agent_id": agent_id, "kid": public.kid, "public_key": public.b64}


def endorse(operator: KeyPair, agent: PublicKey) -> dict[str, str]:
    """The operator's endorsement of ``agent``'s key (put it in the agent's records)."""
    return jws_sign(operator, endorsement_payload(agent.agent_id, agent))


def verify_endorsement(record: AgentRecord, operators: list[PublicKey]) -> bool:
    """True when one of ``operators`` endorsed this record's key for its agent id."""
    if record.endorsement is None:
        return False
    payload = endorsement_payload(record.agent_id, record.key)
    return any(jws_verify(record.endorsement, payload, op) for op in operators)


@dataclass(slots=True)
class AgentRecord:
    """One agent's registration. Build with :meth:`build`, read with :func:`decode_record`."""

    agent_id: str
    intents: tuple[str, ...]
    labels: dict[str, str]
    key: PublicKey
    card: dict[str, Any]
    version: str
    registered_at: int
    heartbeat_at: int
    ttl_ms: int
    endorsement: dict[str, str] | None = None
    signatures: list[dict[str, str]] = field(default_factory=list)

    @property
    def expires_at(self) -> int:
        """When the record stops counting as alive without a new heartbeat (Unix ms)."""
        return self.heartbeat_at + self.ttl_ms

    def unsigned_dict(self) -> dict[str, Any]:
        """The JSON object without ``signatures``: what the agent's JWS covers."""
        d: dict[str, Any] = {
            "v": RECORD_VERSION,
            "agent_id": self.agent_id,
            "intents": list(self.intents),
            "labels": self.labels,
            "public_key": self.key.b64,
            "kid": self.key.kid,
            "card": self.card,
            "version": self.version,
            "registered_at": self.registered_at,
            "heartbeat_at": self.heartbeat_at,
            "ttl_ms": self.ttl_ms,
        }
        if self.endorsement is not None:
            d["endorsement"] = self.endorsement
        return d

    def signed(self, key: KeyPair) -> AgentRecord:
        """This record with a fresh self-signature (``key`` must be the record's)."""
        if key.public != self.key:
            raise RecordRejected("bad_signature", "a record is signed by its own agent's key")
        self.signatures = [jws_sign(key, self.unsigned_dict())]
        return self

    def to_bytes(self) -> bytes:
        """Wire form."""
        return orjson.dumps(dict(self.unsigned_dict(), signatures=self.signatures))

    def self_signed(self) -> bool:
        """True when a signature by the record's own key covers it."""
        payload = self.unsigned_dict()
        return any(jws_verify(s, payload, self.key) for s in self.signatures)

    @classmethod
    def build(
        cls,
        key: KeyPair,
        intents: list[str],
        labels: dict[str, str],
        *,
        now_ms: int,
        ttl_ms: int,
        card: dict[str, Any] | None = None,
        version: str = "0",
        endorsement: dict[str, str] | None = None,
    ) -> AgentRecord:
        """A new, signed record for ``key``'s agent; labels and intents are validated."""
        _check_labels(labels)
        for intent in intents:
            validate_intent(intent)
        record = cls(
            key.agent_id,
            tuple(intents),
            dict(labels),
            key.public,
            card if card is not None else default_card(key.agent_id, intents),
            version,
            now_ms,
            now_ms,
            ttl_ms,
            endorsement,
        )
        return record.signed(key)


def _check_labels(labels: Any) -> None:
    if not isinstance(labels, dict):
        raise RecordRejected("malformed", "labels must be an object")
    for k, v in labels.items():
        if not isinstance(k, str) or _LABEL.fullmatch(k) is None:
            raise RecordRejected("malformed", f"invalid label key {k!r}")
        if not isinstance(v, str) or _LABEL_VALUE.fullmatch(v) is None:
            raise RecordRejected("malformed", f"invalid value {v!r} for label {k!r}")


def decode_record(data: bytes) -> AgentRecord:
    """Parse and validate a record (its signature is checked by the caller).

    Raises:
        RecordRejected: code ``malformed``.
    """
    try:
        raw = orjson.loads(data)
        if not isinstance(raw, dict) or raw.get("v") != RECORD_VERSION:
            raise ValueError("not a version-1 record object")
        _check_labels(raw["labels"])
        key = PublicKey.from_b64(validate_agent_id(raw["agent_id"]), raw["public_key"])
        if raw.get("kid") != key.kid:
            raise ValueError("kid does not match public_key")
        intents = tuple(validate_intent(i) for i in raw["intents"])
        ints = [raw[k] for k in ("registered_at", "heartbeat_at", "ttl_ms")]
        if not all(type(i) is int and i >= 0 for i in ints) or not isinstance(raw["card"], dict):
            raise ValueError("times must be non-negative integers and card an object")
        sigs = raw.get("signatures")
        if not isinstance(sigs, list):
            raise ValueError("signatures must be a list")
        return AgentRecord(
            key.agent_id, intents, raw["labels"], key, raw["card"], str(raw.get("version", "")),
            ints[0], ints[1], ints[2], raw.get("endorsement"), sigs,
        )  # fmt: skip
    except RecordRejected:
        raise
    except (KeyError, TypeError, ValueError, InvalidIntentError, orjson.JSONDecodeError) as exc:
        raise RecordRejected("malformed", f"bad record: {exc}") from None
