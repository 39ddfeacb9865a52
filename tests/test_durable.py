"""Async requests with callbacks on a real nats-server (JetStream): durability under
restarts of either side, HTTP callbacks with retries, pending_review."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from bus import (
    Bus,
    CallbackPolicy,
    Context,
    DurableConfig,
    EmbeddedServer,
    KeyPair,
    PendingReview,
    RemoteError,
    TransportError,
)
from bus.callbacks import DEAD_LETTERS_BUCKET

FAST = DurableConfig(
    ack_wait=1.0, lease=2.0, workers=2, callbacks=CallbackPolicy(attempts=4, base=0.05)
)


@pytest.fixture
def server() -> Any:
    """A server of its own: streams and consumers do not leak between tests."""
    with EmbeddedServer() as s:
        yield s


@pytest.fixture
def cast() -> dict[str, KeyPair]:
    return {n: KeyPair.generate(n) for n in ("planner", "exec-a", "exec-b", "reviewer", "outsider")}


@pytest.fixture
async def connect(server: EmbeddedServer, cast: dict[str, KeyPair]) -> AsyncIterator[Any]:
    buses: list[Bus] = []
    trusted = [cast[n].public for n in ("planner", "exec-a", "exec-b", "reviewer")]

    async def factory(name: str) -> Bus:
        bus = await Bus.connect(server.url, key=cast[name], trust=trusted)
        buses.append(bus)
        return bus

    yield factory
    for bus in buses:
        await bus.close(timeout=2)


async def final_result(results: Any, timeout: float = 10) -> Any:
    while True:
        reply = await results.next(timeout=timeout)
        assert reply is not None, "no result in time"
        if reply.status in ("ok", "error"):
            return reply


async def test_result_reaches_a_requester_that_restarted(connect: Any) -> None:
    planner = await connect("planner")
    request = await planner.send("order.place", {"amount": 5})  # nobody serves it yet
    await planner.close()  # the requester goes away before anything happens

    executor = await connect("exec-a")

    async def place(payload: Any, ctx: Context) -> Any:
        return {"placed": payload["amount"], "by": ctx.bus.agent_id}

    await executor.serve_durable("order.place", place, config=FAST)
    again = await connect("planner")  # same agent, new process
    results = await again.results(FAST)
    reply = await final_result(results)
    assert reply.in_reply_to == request.message_id and reply.payload == {
        "placed": 5,
        "by": "exec-a",
    }
    assert reply.sender.agent_id == "exec-a" and reply.signature is not None
    await results.close()


async def test_an_executor_killed_mid_request_is_replaced_and_it_completes_once(
    connect: Any,
) -> None:
    started: list[str] = []
    completed: list[str] = []
    stuck = asyncio.Event()

    async def place_slowly(payload: Any, ctx: Context) -> Any:
        started.append(ctx.bus.agent_id)
        if ctx.bus.agent_id == "exec-a":
            stuck.set()
            await asyncio.sleep(3600)  # never finishes: its process dies first
        completed.append(ctx.bus.agent_id)
        return {"by": ctx.bus.agent_id}

    a = await connect("exec-a")
    await a.serve_durable("order.place", place_slowly, config=FAST)
    planner = await connect("planner")
    request = await planner.send("order.place", {"n": 1})
    await asyncio.wait_for(stuck.wait(), 10)
    await a.close(timeout=0.1)  # dies without acknowledging the request
    b = await connect("exec-b")
    await b.serve_durable("order.place", place_slowly, config=FAST)
    results = await planner.results(FAST)
    reply = await final_result(results)
    assert reply.in_reply_to == request.message_id and reply.payload == {"by": "exec-b"}
    assert started == ["exec-a", "exec-b"] and completed == ["exec-b"]
    assert await results.next(timeout=2) is None  # delivered once
    await results.close()


async def test_duplicate_requests_with_one_key_run_once_across_instances(connect: Any) -> None:
    runs: list[str] = []

    async def place(payload: Any, ctx: Context) -> Any:
        runs.append(ctx.bus.agent_id)
        await asyncio.sleep(0.2)
        return "placed"

    for name in ("exec-a", "exec-b"):
        await (await connect(name)).serve_durable("order.place", place, config=FAST)
    planner = await connect("planner")
    sent = [await planner.send("order.place", {}, idempotency_key="order-77") for _ in range(4)]
    results = await planner.results(FAST)
    replies = [await final_result(results) for _ in sent]
    assert {r.in_reply_to for r in replies} == {s.message_id for s in sent}
    assert {r.payload for r in replies} == {"placed"} and len(runs) == 1
    await results.close()


async def test_http_callback_failing_twice_is_delivered_once(connect: Any) -> None:
    hits: list[tuple[int, bytes]] = []

    async def endpoint(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        sizes = [
            x.split(b":")[1] for x in head.split(b"\r\n") if x.lower().startswith(b"content-len")
        ]
        length = int(sizes[0])
        body = await reader.readexactly(length)
        status = 500 if len(hits) < 2 else 200
        hits.append((status, body))
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(endpoint, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    executor = await connect("exec-a")

    async def place(payload: Any, ctx: Context) -> Any:
        return {"ok": True}

    await executor.serve_durable("order.place", place, config=FAST)
    planner = await connect("planner")
    request = await planner.send("order.place", {}, reply_to=f"http://127.0.0.1:{port}/hook")
    for _ in range(200):
        if any(status == 200 for status, _ in hits):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    assert [s for s, _ in hits] == [500, 500, 200]  # retried, then delivered once
    delivered = orjson.loads(hits[-1][1])
    assert delivered["in_reply_to"] == request.message_id and delivered["payload"] == {"ok": True}
    server.close()


async def test_a_callback_that_never_succeeds_is_recorded(connect: Any) -> None:
    executor = await connect("exec-a")

    async def place(payload: Any, ctx: Context) -> Any:
        return 1

    await executor.serve_durable("order.place", place, config=FAST)
    planner = await connect("planner")
    request = await planner.send("order.place", {}, reply_to="http://127.0.0.1:9/nothing-listens")
    dead = await planner.transport.key_value(DEAD_LETTERS_BUCKET, storage="file")
    for _ in range(200):
        entry = await dead.get(request.message_id)
        if entry is not None:
            break
        await asyncio.sleep(0.05)
    assert entry is not None
    record = orjson.loads(entry)
    assert record["url"].endswith("/nothing-listens") and "ConnectError" in record["reason"]


async def test_pending_review_then_approve_or_decline(connect: Any) -> None:
    async def place(payload: Any, ctx: Context) -> Any:
        if payload["amount"] > 100 and not (ctx.review and ctx.review.approved):
            raise PendingReview("amount over the agent's limit", {"limit": 100})
        return {"placed": payload["amount"], "approved_by": ctx.review.by if ctx.review else None}

    executor = await connect("exec-a")
    await executor.serve_durable("order.place", place, config=FAST, reviewers={"reviewer"})
    planner = await connect("planner")
    big = await planner.send("order.place", {"amount": 500})
    bigger = await planner.send("order.place", {"amount": 900})
    results = await planner.results(FAST)
    interim = [await results.next(timeout=10) for _ in range(2)]
    assert {r.status for r in interim} == {"pending_review"}  # type: ignore[union-attr]
    assert {p["request_id"] for p in await planner.pending()} == {big.message_id, bigger.message_id}

    outsider = await connect("planner")
    with pytest.raises(RemoteError) as info:
        await outsider.review(big.message_id, approve=True)
    assert info.value.code == "review.forbidden"

    reviewer = await connect("reviewer")
    await reviewer.review(big.message_id, approve=True, note="fine")
    await reviewer.review(bigger.message_id, approve=False, note="too much")
    finals = {r.in_reply_to: r for r in [await final_result(results) for _ in range(2)]}
    assert finals[big.message_id].payload == {"placed": 500, "approved_by": "reviewer"}
    declined = finals[bigger.message_id].error
    assert (
        declined is not None
        and declined.code == "review.declined"
        and declined.message == "too much"
    )
    assert await planner.pending() == []
    await results.close()


async def test_durable_streams_need_a_real_server() -> None:
    from bus.transport import MemoryBroker

    bus = Bus(MemoryBroker().connect(), KeyPair.generate("m"))
    await bus.start()
    with pytest.raises(TransportError, match="real nats-server"):
        await bus.send("order.place", {})
    await bus.close()


async def test_progress_reaches_the_requester_before_the_result(connect: Any) -> None:
    async def crunch(payload: Any, ctx: Context) -> Any:
        await ctx.progress({"done": 0.5})
        await ctx.progress({"done": 0.9})
        return {"rows": 42}

    executor = await connect("exec-a")
    await executor.serve_durable("data.crunch", crunch, config=FAST)
    planner = await connect("planner")
    request = await planner.send("data.crunch", {})
    results = await planner.results(FAST)
    seen = []
    while not seen or seen[-1].status == "working":
        reply = await results.next(timeout=10)
        assert reply is not None and reply.in_reply_to == request.message_id
        seen.append(reply)
    assert [(r.status, r.payload) for r in seen] == [
        ("working", {"done": 0.5}), ("working", {"done": 0.9}), ("ok", {"rows": 42})
    ]  # fmt: skip
    await results.close()


async def test_two_approvals_at_once_run_the_request_once(connect: Any) -> None:
    runs: list[Any] = []

    async def place(payload: Any, ctx: Context) -> Any:
        if not ctx.review:
            raise PendingReview("needs a person")
        runs.append(ctx.review.by)
        await asyncio.sleep(0.2)
        return "placed"

    executor = await connect("exec-a")
    await executor.serve_durable("order.place", place, config=FAST)
    planner = await connect("planner")
    parked = await planner.send("order.place", {})
    for _ in range(100):
        if await planner.pending():
            break
        await asyncio.sleep(0.05)
    a, b = await connect("reviewer"), await connect("planner")
    outcomes = await asyncio.gather(
        a.review(parked.message_id, approve=True), b.review(parked.message_id, approve=True),
        return_exceptions=True,
    )  # fmt: skip
    errors = [o for o in outcomes if isinstance(o, RemoteError)]
    assert len(errors) == 1 and errors[0].code in ("review.in_progress", "review.unknown")
    assert len(runs) == 1
