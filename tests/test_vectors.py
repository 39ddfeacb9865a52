"""Known-answer vectors (tests/vectors/envelope.json): canonical bytes and signatures.

The signature is also checked with ``cryptography`` (OpenSSL), an implementation
independent of the libsodium one the bus signs with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from bus import TrustStore, Verifier
from bus.canonical import canonicalize
from bus.keys import KeyPair, b64url_decode, b64url_encode

VECTORS = json.loads((Path(__file__).parent / "vectors" / "envelope.json").read_text())
KEY = VECTORS["key"]
CASES = {c["name"]: c for c in VECTORS["cases"]}


def test_key_encoding_and_kid() -> None:
    key = KeyPair.from_seed(KEY["agent_id"], bytes.fromhex(KEY["seed_hex"]))
    assert key.public.b64 == KEY["public_key"]
    assert key.kid == KEY["kid"]
    assert len(KEY["public_key"]) == 43 and len(KEY["kid"]) == 32


@pytest.mark.parametrize("name", sorted(CASES))
def test_canonical_bytes_and_signature(name: str) -> None:
    case: dict[str, Any] = CASES[name]
    canonical = canonicalize(case["unsigned"])
    assert canonical.decode() == case["canonical"]
    key = KeyPair.from_seed(KEY["agent_id"], bytes.fromhex(KEY["seed_hex"]))
    assert b64url_encode(key.sign(canonical)) == case["signature"]
    public = Ed25519PublicKey.from_public_bytes(b64url_decode(KEY["public_key"]))
    public.verify(b64url_decode(case["signature"]), canonical)  # raises if invalid


@pytest.mark.parametrize("name", sorted(CASES))
def test_signed_vector_verifies_through_the_bus_rules(name: str) -> None:
    case = CASES[name]
    key = KeyPair.from_seed(KEY["agent_id"], bytes.fromhex(KEY["seed_hex"]))
    verifier = Verifier(TrustStore([key.public]), "executor-1")
    body = json.dumps(case["signed"]).encode()
    env = verifier.verify(body, case["unsigned"]["created_at"], ("request", "reply"))
    assert env.message_id == case["unsigned"]["message_id"]
    assert env.payload == case["unsigned"]["payload"]
