"""Ed25519 identities: key pairs bound to one agent id, key ids, sign and verify.

Encodings (docs/ENVELOPE.md §Keys):

* a public key travels as the unpadded base64url of its 32 raw bytes (43 chars);
* a key id (``kid``) is the lowercase hex of the first 16 bytes of SHA-256 over
  the 32 raw public-key bytes (32 hex chars);
* a signature is the unpadded base64url of the 64-byte Ed25519 signature (86 chars).

Signing uses libsodium through PyNaCl: on this project's machines it verifies in about
half the time of the ``cryptography`` package (docs/PERFORMANCE.md). Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from nacl import bindings as _sodium
from nacl.exceptions import BadSignatureError

from .errors import InvalidKeyError
from .subjects import validate_agent_id

__all__ = [
    "ALGORITHM",
    "KeyPair",
    "PublicKey",
    "b64url_decode",
    "b64url_encode",
    "key_id",
]

ALGORITHM = "Ed25519"


def b64url_encode(raw: bytes) -> str:
    """Unpadded base64url (RFC 4648 §5)."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Decode unpadded (or padded) base64url; raise ValueError on bad input."""
    if not isinstance(text, str):
        raise ValueError("expected a base64url string")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not base64url: {exc}") from None


def key_id(public_raw: bytes) -> str:
    """Key id of a raw 32-byte Ed25519 public key."""
    return hashlib.sha256(public_raw).digest()[:16].hex()


@dataclass(frozen=True, slots=True)
class PublicKey:
    """A public key bound to the one agent id it may sign as.

    ``verify`` returns True or False and never raises for a bad signature.
    """

    agent_id: str
    raw: bytes
    kid: str = field(init=False)

    def __post_init__(self) -> None:
        validate_agent_id(self.agent_id)
        if len(self.raw) != 32:
            raise InvalidKeyError(f"an Ed25519 public key has 32 bytes, not {len(self.raw)}")
        object.__setattr__(self, "kid", key_id(self.raw))

    @classmethod
    def from_b64(cls, agent_id: str, text: str) -> PublicKey:
        """Parse the base64url form; raise InvalidKeyError with the reason."""
        try:
            raw = b64url_decode(text)
        except ValueError as exc:
            raise InvalidKeyError(f"public key of {agent_id!r}: {exc}") from None
        return cls(agent_id, raw)

    @property
    def b64(self) -> str:
        """The unpadded base64url text form."""
        return b64url_encode(self.raw)

    def verify(self, message: bytes, signature: bytes) -> bool:
        """True when ``signature`` is a valid Ed25519 signature of ``message``."""
        if len(signature) != 64:
            return False
        try:
            _sodium.crypto_sign_open(signature + message, self.raw)
        except BadSignatureError:
            return False
        return True


@dataclass(frozen=True, slots=True)
class KeyPair:
    """An agent's signing identity. Build with :meth:`generate` or :meth:`from_seed`."""

    agent_id: str
    seed: bytes = field(repr=False)
    public: PublicKey = field(init=False)
    _secret: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.seed) != 32:
            raise InvalidKeyError(f"an Ed25519 seed has 32 bytes, not {len(self.seed)}")
        pk, sk = _sodium.crypto_sign_seed_keypair(self.seed)
        object.__setattr__(self, "public", PublicKey(self.agent_id, pk))
        object.__setattr__(self, "_secret", sk)

    @classmethod
    def generate(cls, agent_id: str) -> KeyPair:
        """A fresh key pair from the OS random source."""
        return cls(agent_id, os.urandom(32))

    @classmethod
    def from_seed(cls, agent_id: str, seed: bytes) -> KeyPair:
        """The deterministic key pair of a 32-byte seed (RFC 8032 private key)."""
        return cls(agent_id, seed)

    @property
    def kid(self) -> str:
        """Key id of the public half."""
        return self.public.kid

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``message``."""
        return bytes(_sodium.crypto_sign(message, self._secret)[:64])

    def signer(self) -> Callable[[bytes], bytes]:
        """A closure that signs with this key (what the hot path holds)."""
        secret = self._secret
        crypto_sign = _sodium.crypto_sign

        def sign(message: bytes) -> bytes:
            return bytes(crypto_sign(message, secret)[:64])

        return sign
