"""Retries with backoff and executor-side idempotency, on both transports."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from bus import (
    Bus,
    Context,
    HandlerError,
    HandlerFailed,
    KeyPair,
    NoRespondersError,
    RequestRefused,
    UsageError,
)
from bus.bus import IDEMPOTENCY_BUCKET
from bus.retry import RetryPolicy
from tests.conftest import BusFactory

FAST = RetryPolicy(attempts=6, base=0.05, cap=0.2)


async def two_instances(make_bus: BusFactory, keys: dict[str, KeyPair], handler: Any) -> Bus:
    p = keys["planner"]
    planner = await make_bus(p, trust=[keys["executor"].public, keys["executor-b"].public])
    peers = [keys["executor"].public, keys["executor-b"].public, keys["sub"].public]
    for name in ("executor", "executor-b"):
        # instances of a group trust each other: they serve each other's cached outcomes
        bus = await make_bus(keys[name], trust=[p.public, *peers])
        await bus.handle("order.place", handler)
    return planner


async def test_no_responders_is_retried_until_an_executor_appears(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    planner = await make_bus(keys["planner"], trust=[keys["executor"].public])
    executor = await make_bus(keys["executor"], trust=[keys["planner"].public], replay="local")
    with pytest.raises(NoRespondersError):
        await planner.request("late.start", {}, timeout=2, retry=1)

    async def ok(payload: Any, ctx: Context) -> Any:
        return "up"

    async def start_late() -> None:
        await asyncio.sleep(0.15)
        await executor.handle("late.start", ok)

    patient = RetryPolicy(attempts=30, base=0.05, cap=0.3)  # ~4 s of attempts at most
    reply, _ = await asyncio.gather(
        planner.request("late.start", {}, timeout=2, retry=patient), start_late()
    )
    assert reply.payload == "up"


async def test_concurrent_duplicates_across_two_instances_run_once(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    calls: list[Any] = []

    async def place(payload: Any, ctx: Context) -> Any:
        calls.append(ctx.bus.agent_id)
        await asyncio.sleep(0.3)
        return {"order": payload["id"], "by": ctx.bus.agent_id}

    planner = await two_instances(make_bus, keys, place)
    replies = await asyncio.gather(
        *(
            planner.request("order.place", {"id": 42}, idempotency_key="order-42", timeout=5)
            for _ in range(4)
        )
    )
    assert len(calls) == 1
    assert (
        len({orjson.dumps(r.payload) for r in replies}) == 1
    )  # every duplicate got the one result
    again = await planner.request("order.place", {"id": 42}, idempotency_key="order-42", timeout=5)
    assert again.payload == replies[0].payload and len(calls) == 1
    fresh = await planner.request("order.place", {"id": 43}, timeout=5)
    assert fresh.payload["order"] == 43 and len(calls) == 2


async def test_error_outcomes_are_cached_too(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    calls: list[Any] = []

    async def refuse(payload: Any, ctx: Context) -> Any:
        calls.append(payload)
        raise HandlerError("order.over_limit", "limit is 100", {"limit": 100})

    planner = await two_instances(make_bus, keys, refuse)
    for _ in range(3):
        with pytest.raises(HandlerFailed) as info:
            await planner.request(
                "order.place", {"amount": 500}, idempotency_key="big-1", timeout=5
            )
        assert info.value.code == "order.over_limit" and info.value.data == {"limit": 100}
    assert len(calls) == 1


async def test_a_deadline_retry_runs_again_with_the_same_key(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    seen: list[str] = []

    async def slow_once(payload: Any, ctx: Context) -> Any:
        seen.append(ctx.envelope.idempotency_key or "")
        if len(seen) == 1:
            await asyncio.sleep(5)  # cancelled at the attempt's deadline: claim released
        return "done"

    planner = await two_instances(make_bus, keys, slow_once)
    reply = await planner.request("order.place", {}, timeout=0.3, retry=FAST)
    assert reply.payload == "done" and len(seen) == 2 and seen[0] == seen[1]


async def test_refusals_are_never_retried(make_bus: BusFactory, keys: dict[str, KeyPair]) -> None:
    executor = await make_bus(keys["executor"], trust=[])

    async def ok(payload: Any, ctx: Context) -> Any:
        return "ok"

    await executor.handle("order.place", ok)
    mallory = await make_bus(keys["mallory"], trust=[keys["executor"].public])
    with pytest.raises(RequestRefused):
        await mallory.request("order.place", {}, timeout=2, retry=FAST)
    assert executor.refused == {"unknown_signer": 1}


async def test_a_planted_outcome_is_never_served(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    calls: list[Any] = []

    async def place(payload: Any, ctx: Context) -> Any:
        calls.append(payload)
        return "real"

    planner = await two_instances(make_bus, keys, place)
    kv = await planner.transport.key_value(IDEMPOTENCY_BUCKET, ttl=660, storage="file")
    key = "q.order.place.planner.k9"
    planted = {"state": "done", "key": key, "payload": "forged", "error": None,
               "by": "executor", "kid": keys["executor"].kid, "sig": "A" * 86}  # fmt: skip
    await kv.put(key, orjson.dumps(planted))
    with pytest.raises(HandlerFailed, match="not verifiable"):
        await planner.request("order.place", {}, idempotency_key="k9", timeout=5)
    assert calls == []


async def test_call_kinds_set_default_timeouts(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    planner = await make_bus(keys["planner"])
    assert planner.call_timeouts == {"skill": 30.0, "conversation": 60.0, "long": 120.0}
    with pytest.raises(UsageError, match="call must be one of"):
        await planner.request("x.y", {}, call="forever")
    with pytest.raises(UsageError):
        await planner.request("x.y", {}, retry=0)


async def test_a_nested_timeout_is_an_upstream_failure_not_our_deadline(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    calls: list[Any] = []

    async def slow(payload: Any, ctx: Context) -> Any:
        await asyncio.sleep(5)

    async def outer(payload: Any, ctx: Context) -> Any:
        calls.append(payload)
        return await ctx.request("inner.slow", {}, timeout=0.1, retry=1)

    planner = await two_instances(make_bus, keys, outer)
    inner = await make_bus(keys["sub"], trust=[keys["executor"].public, keys["executor-b"].public])
    await inner.handle("inner.slow", slow)
    with pytest.raises(HandlerFailed) as info:
        await planner.request("order.place", {}, timeout=3, retry=3)
    assert info.value.code == "upstream_error"  # an answer: not retried, not run again
    assert len(calls) == 1
