"""Regenerate envelope.json: ``python tests/vectors/generate.py``.

Only run this when the wire format changes on purpose; the test compares against the
committed file so that an accidental change to canonicalization or signing fails.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bus.canonical import canonicalize
from bus.keys import KeyPair, b64url_encode

SEED = bytes(range(32))


def _case(name: str, key: KeyPair, unsigned: dict[str, Any]) -> dict[str, Any]:
    canonical = canonicalize(unsigned)
    sig = b64url_encode(key.sign(canonical))
    signed = dict(unsigned, signature={"alg": "Ed25519", "kid": key.kid, "sig": sig})
    return {
        "name": name,
        "unsigned": unsigned,
        "canonical": canonical.decode(),
        "signature": sig,
        "signed": signed,
    }


def build() -> dict[str, Any]:
    key = KeyPair.from_seed("planner", SEED)
    base = {
        "v": 1,
        "kind": "request",
        "message_id": "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
        "correlation_id": "c0rre1a7ed",
        "trace": {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
        "sender": {"agent_id": "planner", "framework": "intentbus"},
        "recipient": {"agent_id": "executor-1", "framework": ""},
        "intent": "task.execute",
        "payload": {"q": "nats", "limit": 3},
        "reply_to": "_INBOX.abc.1",
        "created_at": 1780000000000,
        "expires_at": 1780000030000,
        "a2a_version": "1.0",
    }
    reply = {k: v for k, v in base.items() if k not in ("reply_to", "recipient")} | {
        "kind": "reply",
        "message_id": "a1b2c3d4e5f60718293a4b5c6d7e8f90",
        "in_reply_to": base["message_id"],
        "sender": {"agent_id": "planner", "framework": "intentbus"},
        "payload": None,
        "status": "error",
        "error": {"code": "order.over_limit", "message": "amount 12000 > limit 10000"},
    }
    exotic = base | {
        "message_id": "exotic-1",
        "payload": {
            "€": 1.5,
            "z": [1e21, 1e-7, -0.0, 0.1],
            "\U0001f600": "ü\n\u2028",
            "a": {"b": None},
        },
        "trace": {"traceparent": base["trace"]["traceparent"], "tracestate": "vendor=x"},
    }
    return {
        "key": {
            "agent_id": key.agent_id,
            "seed_hex": SEED.hex(),
            "public_key": key.public.b64,
            "kid": key.kid,
        },
        "cases": [
            _case("request", key, base),
            _case("error-reply", key, reply),
            _case("exotic-payload", key, exotic),
        ],
    }


if __name__ == "__main__":
    out = Path(__file__).with_name("envelope.json")
    out.write_text(json.dumps(build(), indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {out}")
