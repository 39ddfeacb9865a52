"""The agent runtime: declare, start, serve, stop."""

from __future__ import annotations

from typing import Any

import pytest

from agents import Agent
from bus import Context, KeyPair, TrustStore, UsageError
from bus.transport import MemoryBroker


async def test_declared_intents_are_served_after_start(nats_url: str) -> None:
    trust = TrustStore()
    executor = Agent("executor-1", labels={"env": "test"}, trust=trust)
    caller = Agent("caller", trust=trust)
    trust.add(executor.public_key)
    trust.add(caller.public_key)

    @executor.handles("task.execute")
    async def execute(payload: Any, ctx: Context) -> Any:
        return {"sum": sum(payload), "for": ctx.sender}

    await executor.start(nats_url)
    await caller.start(nats_url)
    try:
        reply = await caller.bus.request("task.execute", [1, 2, 3], timeout=5)
        assert reply.payload == {"sum": 6, "for": "caller"}
        assert executor.intents == ["task.execute"] and executor.labels == {"env": "test"}
    finally:
        await caller.stop()
        await executor.stop()
        await executor.stop()  # idempotent


async def test_misuse_is_refused_with_clear_errors() -> None:
    agent = Agent("a1")

    @agent.handles("x.y")
    async def one(payload: Any, ctx: Context) -> Any:
        return None

    with pytest.raises(UsageError, match="declared twice"):
        agent.handles("x.y")(one)
    with pytest.raises(UsageError, match="not started"):
        _ = agent.bus
    with pytest.raises(UsageError, match="belongs to"):
        Agent("a2", key=KeyPair.generate("a3"))
    broker = MemoryBroker()
    await agent.start(transport=broker.connect())
    with pytest.raises(UsageError, match="already started"):
        await agent.start(transport=broker.connect())
    await agent.stop()
