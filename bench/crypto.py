"""The crypto floor: Ed25519 sign and verify of an envelope-sized body, per library."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from nacl.signing import SigningKey

from bus import KeyPair, Party, Sealer, TraceContext
from bus.canonical import canonicalize

from .roundtrip import PAYLOAD


def envelope_canonical_bytes() -> bytes:
    """The canonical bytes the bus signs for the benchmark's request."""
    key = KeyPair.generate("bench-planner")
    env, _ = Sealer(key).seal(
        kind="request",
        intent="bench.echo",
        payload=PAYLOAD,
        correlation_id=os.urandom(16).hex(),
        trace=TraceContext(os.urandom(16).hex(), os.urandom(8).hex()),
        created_at=int(time.time() * 1000),
        expires_at=int(time.time() * 1000) + 10_000,
        recipient=Party("bench-executor"),
        reply_to="_INBOX.bench.1",
    )
    return canonicalize(env.unsigned_dict())


def _per_op_us(fn: Callable[[], object], n: int = 4000) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - t) / n * 1e6)
    return best


def crypto_costs(body: bytes) -> dict[str, float]:
    """µs per operation: libsodium (PyNaCl) and OpenSSL (cryptography)."""
    nacl_sk = SigningKey.generate()
    nacl_vk = nacl_sk.verify_key
    nacl_sig = nacl_sk.sign(body).signature
    ossl_sk = Ed25519PrivateKey.generate()
    ossl_pk = ossl_sk.public_key()
    ossl_sig = ossl_sk.sign(body)
    return {
        "pynacl_sign": _per_op_us(lambda: nacl_sk.sign(body)),
        "pynacl_verify": _per_op_us(lambda: nacl_vk.verify(body, nacl_sig)),
        "cryptography_sign": _per_op_us(lambda: ossl_sk.sign(body)),
        "cryptography_verify": _per_op_us(lambda: ossl_pk.verify(ossl_sig, body)),
    }
