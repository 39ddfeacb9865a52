"""Fixtures: a real nats-server per session (never skipped), and bus factories that
run the same scenario on the in-memory twin and on real NATS."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from bus import Bus, EmbeddedServer, KeyPair
from bus.transport import MemoryBroker
from bus.transport.nats import connect as nats_connect

BusFactory = Callable[..., Awaitable[Bus]]


@pytest.fixture(scope="session")
def nats_server() -> Iterator[EmbeddedServer]:
    """One real nats-server with JetStream, on an ephemeral loopback port."""
    with EmbeddedServer() as server:
        yield server


@pytest.fixture(scope="session")
def nats_url(nats_server: EmbeddedServer) -> str:
    return nats_server.url


@pytest.fixture(params=["memory", "nats"])
def transport_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def make_bus(transport_kind: str, nats_url: str) -> AsyncIterator[BusFactory]:
    """``await make_bus(key, trust=[...], **options)`` on the parametrized transport."""
    broker = MemoryBroker()
    made: list[Bus] = []

    async def factory(key: KeyPair, **options: Any) -> Bus:
        if transport_kind == "memory":
            transport: Any = broker.connect()
        else:
            transport = await nats_connect(nats_url, name=key.agent_id, reconnect=False)
        bus = Bus(transport, key, **options)
        await bus.start()
        made.append(bus)
        return bus

    yield factory
    for bus in reversed(made):
        await bus.close(timeout=2)


@pytest.fixture
def keys() -> dict[str, KeyPair]:
    """Deterministic key pairs for the usual cast."""
    names = ["planner", "executor", "executor-b", "sub", "mallory"]
    return {n: KeyPair.from_seed(n, bytes([i + 1]) * 32) for i, n in enumerate(names)}
