"""Key files and trust files."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from bus import InvalidKeyError, KeyPair, load_key, load_trust_file, write_key_pair


def test_round_trip_with_private_mode(tmp_path: Path) -> None:
    key = KeyPair.generate("executor-1")
    private, public = write_key_pair(key, tmp_path / "keys")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    loaded = load_key(private)
    assert loaded.agent_id == "executor-1" and loaded.public == key.public
    (pub,) = load_trust_file(public)
    assert pub == key.public
    doc = json.loads(public.read_text())
    assert doc == {
        "agent_id": "executor-1",
        "alg": "Ed25519",
        "kid": key.kid,
        "public_key": key.public.b64,
    }


def test_never_overwrites_a_private_key(tmp_path: Path) -> None:
    write_key_pair(KeyPair.generate("a"), tmp_path)
    with pytest.raises(FileExistsError):
        write_key_pair(KeyPair.generate("a"), tmp_path)


def test_refuses_a_world_readable_key(tmp_path: Path) -> None:
    private, _ = write_key_pair(KeyPair.generate("a"), tmp_path)
    os.chmod(private, 0o644)
    with pytest.raises(InvalidKeyError, match="chmod 600"):
        load_key(private)


def test_trust_file_errors_are_clear(tmp_path: Path) -> None:
    bad = tmp_path / "t.json"
    bad.write_text("{nope")
    with pytest.raises(InvalidKeyError, match="not JSON"):
        load_trust_file(bad)
    key = KeyPair.generate("a").public
    bad.write_text(json.dumps([{"agent_id": "a", "public_key": key.b64, "kid": "0" * 32}]))
    with pytest.raises(InvalidKeyError, match="does not match"):
        load_trust_file(bad)
    bad.write_text(json.dumps({"agent_id": "a", "public_key": "!!"}))
    with pytest.raises(InvalidKeyError):
        load_trust_file(bad)
