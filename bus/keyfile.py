"""Key files: ``ID.key`` (private, PKCS#8 PEM, mode 0600) and ``ID.pub`` (public, JSON).

``ID.pub`` is one JSON object (docs/ENVELOPE.md §Keys)::

    {"agent_id": "planner", "alg": "Ed25519", "kid": "<32 hex>", "public_key": "<base64url>"}

A trust file is such an object, or a JSON array of them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .errors import InvalidKeyError
from .keys import ALGORITHM, KeyPair, PublicKey

__all__ = ["load_key", "load_trust_file", "parse_public_key", "public_key_json", "write_key_pair"]


def write_key_pair(key: KeyPair, directory: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write ``<agent_id>.key`` (0600, never world-readable, even briefly) and ``.pub``.

    Raises:
        FileExistsError: a private key file of that name exists (never overwritten).
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    private = out / f"{key.agent_id}.key"
    pem = Ed25519PrivateKey.from_private_bytes(key.seed).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    os.chmod(private, 0o600)  # the umask may have narrowed it further, never widened
    public = out / f"{key.agent_id}.pub"
    public.write_text(json.dumps(public_key_json(key.public), indent=2) + "\n")
    return private, public


def public_key_json(key: PublicKey) -> dict[str, str]:
    """The JSON object of a ``.pub`` file."""
    return {"agent_id": key.agent_id, "alg": ALGORITHM, "kid": key.kid, "public_key": key.b64}


def load_key(path: str | os.PathLike[str], agent_id: str | None = None) -> KeyPair:
    """Load a private key file; the agent id defaults to the file's stem.

    Raises:
        InvalidKeyError: unreadable, not Ed25519, or readable by group/others.
    """
    p = Path(path)
    try:
        mode = p.stat().st_mode
        data = p.read_bytes()
    except OSError as exc:
        raise InvalidKeyError(f"cannot read key file {p}: {exc.strerror}") from None
    if mode & 0o077:
        raise InvalidKeyError(
            f"key file {p} is readable by others (mode {mode & 0o777:o}); chmod 600 it"
        )
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise InvalidKeyError(f"{p} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise InvalidKeyError(f"{p} holds a {type(private).__name__}, not an Ed25519 key")
    seed = private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return KeyPair(agent_id or p.stem, seed)


def parse_public_key(obj: Any, source: str = "input") -> PublicKey:
    """Parse one ``.pub`` JSON object, checking ``kid`` when present."""
    if not isinstance(obj, dict) or not isinstance(obj.get("public_key"), str):
        raise InvalidKeyError(f"{source}: expected an object with agent_id and public_key")
    if obj.get("alg", ALGORITHM) != ALGORITHM:
        raise InvalidKeyError(f"{source}: algorithm {obj.get('alg')!r} is not {ALGORITHM}")
    key = PublicKey.from_b64(str(obj.get("agent_id", "")), obj["public_key"])
    if "kid" in obj and obj["kid"] != key.kid:
        raise InvalidKeyError(f"{source}: kid {obj['kid']!r} does not match the key ({key.kid})")
    return key


def load_trust_file(path: str | os.PathLike[str]) -> list[PublicKey]:
    """Public keys from a ``.pub`` file or a JSON array of such objects."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as exc:
        raise InvalidKeyError(f"cannot read trust file {p}: {exc.strerror}") from None
    except ValueError as exc:
        raise InvalidKeyError(f"trust file {p} is not JSON: {exc}") from None
    items = data if isinstance(data, list) else [data]
    return [parse_public_key(item, f"{p}[{i}]") for i, item in enumerate(items)]
