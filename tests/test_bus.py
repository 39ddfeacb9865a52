"""Bus behaviour, written once and run on the in-memory twin and on a real nats-server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bus import (
    Bus,
    BusClosedError,
    Context,
    DeadlineExceeded,
    Envelope,
    HandlerError,
    HandlerFailed,
    KeyPair,
    NoHandlerError,
    NoRespondersError,
    Party,
    RequestRefused,
    Sealer,
)
from bus.envelope import decode
from tests.conftest import BusFactory


async def raw_request(bus: Bus, subject: str, body: bytes, timeout: float = 5) -> Envelope:
    """Publish wire bytes as they are and return the (decoded) reply."""
    got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    inbox = bus.transport.new_inbox()

    async def on_msg(msg: Any) -> None:
        if not got.done():
            got.set_result(msg.data)

    sub = await bus.transport.subscribe(inbox, on_msg)
    try:
        await bus.transport.publish(subject, body, reply=inbox)
        return decode(await asyncio.wait_for(got, timeout))[0]
    finally:
        await sub.unsubscribe()


def sealed_request(bus: Bus, key: KeyPair, intent: str, payload: Any, **over: Any) -> bytes:
    now = bus.now_ms()
    fields: dict[str, Any] = dict(
        kind="request",
        intent=intent,
        payload=payload,
        correlation_id="c1",
        trace=__import__("bus").context.new_trace(None),
        created_at=now,
        expires_at=now + 10_000,
    )
    fields.update(over)
    return Sealer(key).seal(**fields)[1]


async def pair(make_bus: BusFactory, keys: dict[str, KeyPair], **opts: Any) -> tuple[Bus, Bus]:
    p, e = keys["planner"], keys["executor"]
    return (
        await make_bus(p, trust=[e.public], **opts),
        await make_bus(e, trust=[p.public], **opts),
    )


async def test_request_reply_is_signed_and_verified(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    planner, executor = await pair(make_bus, keys)

    async def echo(payload: Any, ctx: Context) -> Any:
        return {"got": payload, "from": ctx.sender}

    await executor.handle("demo.echo", echo)
    reply = await planner.request("demo.echo", {"x": [1, 2.5, "ü"]}, timeout=5)
    assert reply.payload == {"got": {"x": [1, 2.5, "ü"]}, "from": "planner"}
    assert reply.kind == "reply" and reply.status == "ok"
    assert reply.sender.agent_id == "executor" and reply.signature is not None
    assert reply.signature.kid == keys["executor"].kid


async def test_queue_group_shares_load_and_runs_each_request_once(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    p, a, b = keys["planner"], keys["executor"], keys["executor-b"]
    planner = await make_bus(p, trust=[a.public, b.public])
    seen: dict[str, list[int]] = {"executor": [], "executor-b": []}
    for k in (a, b):
        bus = await make_bus(k, trust=[p.public])

        async def work(payload: Any, ctx: Context, me: str = k.agent_id) -> Any:
            seen[me].append(payload)
            return me

        await bus.handle("task.execute", work)
    replies = await asyncio.gather(
        *(planner.request("task.execute", i, timeout=5) for i in range(40))
    )
    assert sorted(seen["executor"] + seen["executor-b"]) == list(range(40))
    assert seen["executor"] and seen["executor-b"]
    assert {r.payload for r in replies} == {"executor", "executor-b"}


async def test_no_responders_is_not_a_timeout(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    planner, executor = await pair(make_bus, keys)
    with pytest.raises(NoRespondersError):
        await planner.request("nobody.home", {}, timeout=5)

    async def slow(payload: Any, ctx: Context) -> Any:
        await asyncio.sleep(5)

    await executor.handle("task.slow", slow)
    with pytest.raises(DeadlineExceeded) as info:
        await planner.request("task.slow", {}, timeout=0.2)
    assert isinstance(info.value, TimeoutError)


async def test_handler_failures_become_typed_error_replies(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    planner, executor = await pair(make_bus, keys)

    async def boom(payload: Any, ctx: Context) -> Any:
        raise RuntimeError("disk on fire")

    async def refuse(payload: Any, ctx: Context) -> Any:
        raise HandlerError("order.over_limit", "too much", {"limit": 10})

    async def not_json(payload: Any, ctx: Context) -> Any:
        return {1, 2}

    await executor.handle("task.boom", boom)
    await executor.handle("task.refuse", refuse)
    await executor.handle("task.notjson", not_json)
    with pytest.raises(HandlerFailed) as info:
        await planner.request("task.boom", {}, timeout=5)
    assert info.value.code == "handler_error" and "disk on fire" in info.value.detail
    assert info.value.sender == "executor"
    with pytest.raises(HandlerFailed) as info:
        await planner.request("task.refuse", {}, timeout=5)
    assert (info.value.code, info.value.data) == ("order.over_limit", {"limit": 10})
    with pytest.raises(HandlerFailed, match="non-JSON"):
        await planner.request("task.notjson", {}, timeout=5)
    with pytest.raises(NoHandlerError):
        await planner.request("task.none", {}, agent="executor", timeout=5)


async def test_two_hop_chain_inherits_correlation_trace_and_deadline(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    p, e, s = keys["planner"], keys["executor"], keys["sub"]
    everyone = [p.public, e.public, s.public]
    planner, executor, sub = [await make_bus(k, trust=everyone) for k in (p, e, s)]
    hops: list[Envelope] = []

    async def execute(payload: Any, ctx: Context) -> Any:
        hops.append(ctx.envelope)
        inner = await executor.request("facts.lookup", payload)  # no ctx: inherited anyway
        return inner.payload

    async def lookup(payload: Any, ctx: Context) -> Any:
        hops.append(ctx.envelope)
        return {"fact": payload["q"]}

    await executor.handle("task.execute", execute)
    await sub.handle("facts.lookup", lookup)
    reply = await planner.request("task.execute", {"q": "nats"}, timeout=5)
    first, second = hops
    assert reply.payload == {"fact": "nats"}
    assert first.correlation_id == second.correlation_id == reply.correlation_id
    assert first.trace.trace_id == second.trace.trace_id == reply.trace.trace_id
    assert len({first.trace.span_id, second.trace.span_id, reply.trace.span_id}) == 3
    assert second.expires_at == first.expires_at
    assert second.sender.agent_id == "executor"


async def test_replay_refused_by_every_instance_of_the_group(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    p, a, b = keys["planner"], keys["executor"], keys["executor-b"]
    planner = await make_bus(p, trust=[a.public, b.public])
    calls: list[Any] = []
    for k in (a, b):
        bus = await make_bus(k, trust=[p.public])

        async def work(payload: Any, ctx: Context) -> Any:
            calls.append(payload)
            return "done"

        await bus.handle("task.execute", work)
    body = sealed_request(planner, p, "task.execute", {"pay": 100})
    first = await raw_request(planner, planner.subjects.intent("task.execute"), body)
    assert first.status == "ok"
    for _ in range(4):  # whichever instance the group picks
        again = await raw_request(planner, planner.subjects.intent("task.execute"), body)
        assert again.error is not None and again.error.code == "replayed"
    for agent in ("executor", "executor-b"):  # an agent's own subject: addressed envelopes only
        again = await raw_request(planner, planner.subjects.agent(agent, "task.execute"), body)
        assert again.error is not None and again.error.code == "not_recipient"
    addressed = sealed_request(
        planner, p, "task.execute", {"pay": 7}, recipient=Party("executor-b")
    )
    assert (
        await raw_request(planner, planner.subjects.agent("executor-b", "task.execute"), addressed)
    ).status == "ok"
    for target in (
        planner.subjects.agent("executor-b", "task.execute"),
        planner.subjects.intent("task.execute"),
    ):
        again = await raw_request(planner, target, addressed)
        assert again.error is not None and again.error.code in ("replayed", "not_recipient")
    assert calls == [{"pay": 100}, {"pay": 7}]


async def test_untrusted_sender_is_refused_before_the_handler(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    m, e = keys["mallory"], keys["executor"]
    mallory = await make_bus(m, trust=[e.public])
    executor = await make_bus(e, trust=[])
    calls: list[Any] = []

    async def work(payload: Any, ctx: Context) -> Any:
        calls.append(payload)

    await executor.handle("task.execute", work)
    with pytest.raises(RequestRefused) as info:
        await mallory.request("task.execute", {}, timeout=5)
    assert info.value.code == "unknown_signer" and calls == []
    assert executor.refused == {"unknown_signer": 1}


async def test_forged_reply_is_ignored_and_the_real_one_wins(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    planner, executor = await pair(make_bus, keys)
    mallory = await make_bus(keys["mallory"], trust=[keys["planner"].public])
    released = asyncio.Event()

    async def real(payload: Any, ctx: Context) -> Any:
        await released.wait()
        return "real"

    async def forge(payload: Any, ctx: Context) -> Any:
        released.set()
        return "forged"

    await executor.handle("task.execute", real)
    await mallory.handle("task.execute", forge, queue="mallory-group")  # also hears the request
    reply = await planner.request("task.execute", {}, timeout=5)
    assert reply.payload == "real" and reply.sender.agent_id == "executor"


async def test_executor_does_not_start_expired_work(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    planner, executor = await pair(make_bus, keys)
    calls: list[Any] = []

    async def work(payload: Any, ctx: Context) -> Any:
        calls.append(payload)

    await executor.handle("task.execute", work)
    now = planner.now_ms()
    # expired 1 s ago: inside the 30 s skew, so it verifies, but the deadline has passed
    body = sealed_request(
        planner, keys["planner"], "task.execute", {}, created_at=now - 5000, expires_at=now - 1000
    )
    reply = await raw_request(planner, planner.subjects.intent("task.execute"), body)
    assert reply.error is not None and reply.error.code == "deadline_exceeded" and calls == []


async def test_direct_addressing_reaches_only_that_agent(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    p, a, b = keys["planner"], keys["executor"], keys["executor-b"]
    planner = await make_bus(p, trust=[a.public, b.public])
    for k in (a, b):
        bus = await make_bus(k, trust=[p.public])

        async def whoami(payload: Any, ctx: Context, me: str = k.agent_id) -> Any:
            return me

        await bus.handle("who.am-i", whoami)
    for _ in range(6):
        assert (
            await planner.request("who.am-i", {}, agent="executor-b", timeout=5)
        ).payload == "executor-b"


async def test_events_reach_every_subscriber(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    p = keys["planner"]
    planner = await make_bus(p)
    got: dict[str, asyncio.Future[Any]] = {}
    for name in ("executor", "executor-b"):
        bus = await make_bus(keys[name], trust=[p.public])
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        got[name] = fut

        async def on(payload: Any, ctx: Context, fut: asyncio.Future[Any] = fut) -> None:
            fut.set_result((payload, ctx.sender))

        await bus.on_event("fleet.news", on)
    await planner.publish("fleet.news", {"v": 2})
    for fut in got.values():
        assert await asyncio.wait_for(fut, 5) == ({"v": 2}, "planner")


async def test_close_is_idempotent_and_fails_waiting_requests(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    planner, executor = await pair(make_bus, keys)

    async def hang(payload: Any, ctx: Context) -> Any:
        await asyncio.sleep(30)

    await executor.handle("task.hang", hang)
    waiting = asyncio.ensure_future(planner.request("task.hang", {}, timeout=20))
    await asyncio.sleep(0.1)
    await planner.close()
    await planner.close()
    with pytest.raises(BusClosedError):
        await waiting
    with pytest.raises(BusClosedError):
        await planner.request("task.hang", {})


async def test_local_replay_mode_refuses_replays_to_the_same_instance(
    make_bus: BusFactory, keys: dict[str, KeyPair]
) -> None:
    planner, executor = await pair(make_bus, keys, replay="local")

    async def work(payload: Any, ctx: Context) -> Any:
        return "ok"

    await executor.handle("task.execute", work)
    body = sealed_request(planner, keys["planner"], "task.execute", {})
    subject = planner.subjects.intent("task.execute")
    assert (await raw_request(planner, subject, body)).status == "ok"
    again = await raw_request(planner, subject, body)
    assert again.error is not None and again.error.code == "replayed"


REFUSALS = {
    "bad_signature": lambda body: body.replace(b'"amount":1', b'"amount":9'),
    "not_recipient": None,
    "expired": None,
    "not_yet_valid": None,
    "unknown_signer": None,
}


@pytest.mark.parametrize("code", sorted(REFUSALS))
async def test_refused_envelopes_never_reach_the_handler(
    make_bus: BusFactory, keys: dict[str, KeyPair], code: str
) -> None:
    planner, executor = await pair(make_bus, keys)
    calls: list[Any] = []

    async def work(payload: Any, ctx: Context) -> Any:
        calls.append(payload)

    await executor.handle("task.execute", work)
    now = planner.now_ms()
    signer, over = keys["planner"], {}
    if code == "not_recipient":
        over = {"recipient": Party("executor-b")}
    elif code == "expired":
        over = {"created_at": now - 120_000, "expires_at": now - 60_000}
    elif code == "not_yet_valid":
        over = {"created_at": now + 60_000, "expires_at": now + 70_000}
    elif code == "unknown_signer":
        signer = keys["mallory"]
    body = sealed_request(planner, signer, "task.execute", {"amount": 1}, **over)
    if REFUSALS[code] is not None:
        body = REFUSALS[code](body)
    reply = await raw_request(planner, planner.subjects.intent("task.execute"), body)
    assert reply.error is not None and reply.error.code == code
    assert reply.sender.agent_id == "executor" and reply.signature is not None
    assert calls == [] and executor.refused == {code: 1}
