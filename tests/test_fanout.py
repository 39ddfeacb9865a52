"""Fan-out / fan-in on the in-memory twin and on a real nats-server."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest

from bus import Bus, Context, HandlerError, KeyPair, TrustStore, UsageError, Verifier
from registry import Registry
from tests.conftest import BusFactory

NAMES = ["ex-a", "ex-b", "ex-c", "ex-d"]


async def fleet(
    make_bus: BusFactory, behaviours: dict[str, Any], intent: str = "vote.cast"
) -> tuple[Bus, dict[str, list[Any]], dict[str, KeyPair]]:
    keys = {n: KeyPair.generate(n) for n in [*behaviours, "gatherer"]}
    trust = TrustStore(k.public for k in keys.values())
    calls: dict[str, list[Any]] = {n: [] for n in behaviours}
    for name, behaviour in behaviours.items():
        bus = await make_bus(keys[name], trust=trust)

        async def handler(payload: Any, ctx: Context, name: str = name, b: Any = behaviour) -> Any:
            calls[name].append(payload)
            if isinstance(b, float):
                await asyncio.sleep(b)
                return {"from": name}
            if isinstance(b, Exception):
                raise b
            return b

        await bus.handle(intent, handler)
    gatherer = await make_bus(keys["gatherer"], trust=trust)
    return gatherer, calls, keys


async def test_all_ends_as_soon_as_everyone_answered(make_bus: BusFactory) -> None:
    gatherer, calls, _ = await fleet(make_bus, {n: {"v": n} for n in NAMES[:3]})
    start = time.monotonic()
    result = await gatherer.fan_out("vote.cast", {"q": 1}, agents=NAMES[:3], timeout=10)
    assert time.monotonic() - start < 5  # decided early, not at the 10 s deadline
    assert result.satisfied and not result.partial and result.missing == []
    assert sorted(r.agent_id for r in result.ok) == NAMES[:3]
    assert sorted(v["v"] for v in result.value) == NAMES[:3]
    assert all(c == [{"q": 1}] for c in calls.values())


async def test_partial_results_at_the_deadline(make_bus: BusFactory) -> None:
    behaviours = {"ex-a": {"v": 1}, "ex-b": {"v": 2}, "ex-c": 30.0}
    gatherer, _, _ = await fleet(make_bus, behaviours)
    result = await gatherer.fan_out("vote.cast", {}, agents=["ex-a", "ex-b", "ex-c"], timeout=0.5)
    assert result.partial and not result.satisfied
    assert result.missing == ["ex-c"]
    assert sorted(r.agent_id for r in result.ok) == ["ex-a", "ex-b"]


async def test_first_valid_reply_wins_and_errors_are_reported(make_bus: BusFactory) -> None:
    behaviours = {
        "ex-a": {"price": -1},
        "ex-b": HandlerError("quote.none", "no stock"),
        "ex-c": {"price": 42},
    }
    gatherer, _, _ = await fleet(make_bus, behaviours)
    result = await gatherer.fan_out(
        "vote.cast", {}, agents=list(behaviours), policy="first",
        validator=lambda p: p["price"] > 0, timeout=10,
    )  # fmt: skip
    assert result.satisfied and result.value == {"price": 42}
    assert result.ok[0].agent_id == "ex-c"
    await asyncio.sleep(0.05)
    # whatever arrived before the decision is in the result, typed
    if "ex-b" in result.errors:
        assert result.errors["ex-b"].code == "quote.none"


async def test_quorum_met_and_quorum_impossible(make_bus: BusFactory) -> None:
    gatherer, _, _ = await fleet(make_bus, {"ex-a": 1, "ex-b": 2, "ex-c": 30.0})
    met = await gatherer.fan_out(
        "vote.cast", {}, agents=["ex-a", "ex-b", "ex-c"], policy="quorum:2", timeout=10
    )
    assert met.satisfied and sorted(met.value) == [1, 2] and not met.partial

    boom = RuntimeError("down")
    gatherer2, _, _ = await fleet(
        make_bus, {"ex-a": boom, "ex-b": boom, "ex-c": 1}, intent="vote.again"
    )
    start = time.monotonic()
    lost = await gatherer2.fan_out(
        "vote.again", {}, agents=["ex-a", "ex-b", "ex-c"], policy="quorum:2", timeout=10
    )
    assert (
        time.monotonic() - start < 5 and not lost.satisfied
    )  # decided once 2 errors made it impossible
    assert {c.code for c in lost.errors.values()} == {"handler_error"}


async def test_forged_and_outside_replies_never_count(make_bus: BusFactory) -> None:
    gatherer, calls, keys = await fleet(make_bus, {n: n for n in NAMES})
    mallory = await make_bus(KeyPair.generate("mallory"), trust=[keys["gatherer"].public])

    async def forge(payload: Any, ctx: Context) -> Any:
        return "forged"

    await mallory.handle("vote.cast", forge)  # hears the scatter; the gatherer does not trust it
    result = await gatherer.fan_out("vote.cast", {}, agents=["ex-a", "ex-b"], timeout=10)
    assert sorted(result.value) == ["ex-a", "ex-b"]
    assert calls["ex-c"] == [] and calls["ex-d"] == []  # outside the audience: not run


async def test_selector_gives_the_expected_set(make_bus: BusFactory) -> None:
    gatherer, _, keys = await fleet(make_bus, {n: n for n in NAMES})
    bucket = f"reg_{os.urandom(6).hex()}"
    reg = await Registry.open(
        gatherer.transport, trust=gatherer.trust, bucket=bucket, storage="memory"
    )
    for i, name in enumerate(NAMES):
        await reg.register(
            keys[name], ["vote.cast"], {"tier": "gold" if i % 2 else "silver"}, ttl=30
        )
    gatherer.directory = reg
    for _ in range(500):
        if len(reg) == 4:
            break
        await asyncio.sleep(0.01)
    result = await gatherer.fan_out("vote.cast", {}, selector="tier=gold", timeout=10)
    assert result.expected == ["ex-b", "ex-d"] and sorted(result.value) == ["ex-b", "ex-d"]
    none = await gatherer.fan_out("vote.cast", {}, selector="tier=platinum", timeout=10)
    assert none.no_responders and none.replies == []
    await reg.close()


async def test_nobody_listening_is_reported_not_raised(make_bus: BusFactory) -> None:
    gatherer = await make_bus(KeyPair.generate("lonely"))
    result = await gatherer.fan_out("vote.none", {}, timeout=5)
    assert result.no_responders and not result.satisfied
    with pytest.raises(UsageError):
        await gatherer.fan_out("vote.none", {}, policy="most")


async def test_signed_aggregate_names_its_sources(make_bus: BusFactory) -> None:
    gatherer, _, keys = await fleet(make_bus, {n: 10 * i for i, n in enumerate(NAMES[:3])})
    result = await gatherer.fan_out(
        "vote.cast",
        {},
        agents=NAMES[:3],
        aggregate=lambda rs: sum(r.payload for r in rs),
        timeout=10,
    )
    assert result.value == 30
    _, body = result.seal(gatherer._sealer, gatherer.now_ms())
    downstream = Verifier(TrustStore([keys["gatherer"].public]), "auditor")
    checked = downstream.verify(body, gatherer.now_ms(), ("event",))
    sources = checked.payload["sources"]
    assert checked.payload["value"] == 30 and len(sources) == 3
    by_id = {r.envelope.message_id: r.envelope.signature for r in result.replies}
    for s in sources:
        assert by_id[s["message_id"]].sig == s["sig"]  # type: ignore[union-attr]
    assert checked.correlation_id == result.request.correlation_id
