"""The demo ensemble: a planner, an executor and a facts agent that trust each other.

* ``executor-1`` serves ``demo.echo`` (replies with the payload it received) and
  ``task.execute`` (asks ``facts.lookup`` first: a two-hop conversation);
* ``facts-1`` serves ``facts.lookup``;
* both serve ``quote.get`` (for fan-out), and ``executor-1`` serves ``order.place`` as
  an async (durable) request, parking orders above 1,000 for a reviewer (the planner);
* ``planner`` serves nothing; it is the caller in :func:`run_scenario`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from bus import (
    Context,
    HandlerError,
    NoExecutorError,
    NoRespondersError,
    PendingReview,
    PublicKey,
    RemoteError,
    Sealer,
    TrustStore,
)
from bus.envelope import decode

from .agent import Agent

__all__ = ["build_demo_agents", "run_patterns", "run_scenario"]

Say = Callable[[str], None]
ORDER_LIMIT = 1000
FACTS = {"nats": "a subject-based messaging system", "ed25519": "a signature scheme"}


def _hop(say: Say, agent: str, ctx: Context) -> None:
    env = ctx.envelope
    say(
        f"  [{agent}] <- {env.intent} from {ctx.sender} "
        f"corr={env.correlation_id[:8]} trace={env.trace.trace_id[:8]} span={env.trace.span_id[:8]}"
    )


def build_demo_agents(say: Say, extra_trust: Iterable[PublicKey] = ()) -> list[Agent]:
    """The three demo agents, sharing one trust store with every demo key in it."""
    trust = TrustStore(extra_trust)
    planner = Agent("planner", labels={"role": "planner", "env": "demo"}, trust=trust)
    executor = Agent(
        "executor-1", labels={"role": "executor", "framework": "hermes", "env": "demo"}, trust=trust
    )
    facts = Agent("facts-1", labels={"role": "facts", "env": "demo"}, trust=trust)
    for agent in (planner, executor, facts):
        trust.add(agent.public_key)

    @executor.handles("demo.echo")
    async def echo(payload: Any, ctx: Context) -> Any:
        _hop(say, executor.agent_id, ctx)
        return payload

    @executor.handles("task.execute")
    async def execute(payload: Any, ctx: Context) -> Any:
        _hop(say, executor.agent_id, ctx)
        if not isinstance(payload, dict) or not isinstance(payload.get("q"), str):
            raise HandlerError("bad_request", "payload must be an object with a string 'q'")
        found = await ctx.request("facts.lookup", {"q": payload["q"]})
        return {"q": payload["q"], "answer": found.payload["fact"], "by": ctx.bus.agent_id}

    @facts.handles("facts.lookup")
    async def lookup(payload: Any, ctx: Context) -> Any:
        _hop(say, facts.agent_id, ctx)
        q = str(payload.get("q", "")).lower() if isinstance(payload, dict) else ""
        if q not in FACTS:
            raise HandlerError("facts.unknown", f"no fact about {q!r}")
        return {"fact": FACTS[q]}

    prices = {executor.agent_id: 101, facts.agent_id: 99}
    for agent in (executor, facts):

        @agent.handles("quote.get")
        async def quote(payload: Any, ctx: Context, me: str = agent.agent_id) -> Any:
            _hop(say, me, ctx)
            return {"price": prices[me], "by": me}

    @executor.handles("order.place", durable=True, reviewers={"planner"})
    async def place(payload: Any, ctx: Context) -> Any:
        _hop(say, executor.agent_id, ctx)
        amount = int(payload.get("amount", 0)) if isinstance(payload, dict) else 0
        if amount > ORDER_LIMIT and not (ctx.review and ctx.review.approved):
            raise PendingReview(f"order of {amount} is over the limit of {ORDER_LIMIT}")
        return {"placed": amount, "approved_by": ctx.review.by if ctx.review else None}

    return [planner, executor, facts]


async def run_scenario(planner: Agent, say: Say) -> None:
    """Exercise each behaviour once, printing every hop."""
    bus = planner.bus
    say("1. request/reply: planner asks demo.echo")
    reply = await bus.request("demo.echo", {"hello": "fleet"}, timeout=5)
    say(f"  [planner] <- reply from {reply.sender.agent_id}: {reply.payload} (signature verified)")

    say("2. two hops: planner -> task.execute -> facts.lookup (correlation and trace inherited)")
    reply = await bus.request("task.execute", {"q": "nats"}, timeout=5)
    say(
        f"  [planner] <- {reply.payload} corr={reply.correlation_id[:8]} "
        f"trace={reply.trace.trace_id[:8]}"
    )

    say("3. registry: look executors up by label, then request by selector (no URL, no name)")
    assert planner.registry is not None
    found = planner.registry.lookup("task.execute", "framework=hermes,env=demo")
    say(
        f"  [planner] task.execute where framework=hermes,env=demo -> {[r.agent_id for r in found]}"
    )
    reply = await bus.request(
        "task.execute", {"q": "ed25519"}, selector="framework=hermes,env=demo", timeout=5
    )
    say(f"  [planner] <- {reply.payload['answer']!r} from {reply.sender.agent_id}")
    try:
        await bus.request("task.execute", {"q": "nats"}, selector="env=prod", timeout=5)
    except NoExecutorError as exc:
        say(f"  [planner] <- {type(exc).__name__}: {exc}")

    say("4. a handler's own error code comes back as a typed exception")
    try:
        await bus.request("task.execute", {"q": "quantum"}, timeout=5)
    except RemoteError as exc:
        say(f"  [planner] <- {type(exc).__name__} code={exc.code}: {exc.detail}")

    say("5. a tampered envelope is refused before any handler runs")
    _, body = Sealer(planner.key).seal(
        kind="request",
        intent="demo.echo",
        payload={"amount": 10},
        correlation_id="tamper-demo",
        trace=reply.trace,
        created_at=bus.now_ms(),
        expires_at=bus.now_ms() + 5000,
    )
    forged = body.replace(b'"amount":10', b'"amount":10000')
    reply_subject = bus.transport.new_inbox()
    got: list[bytes] = []

    async def collect(msg: Any) -> None:
        got.append(msg.data)

    sub = await bus.transport.subscribe(reply_subject, collect)
    await bus.transport.publish(bus.subjects.intent("demo.echo"), forged, reply=reply_subject)
    for _ in range(200):
        if got:
            break
        await asyncio.sleep(0.01)
    await sub.unsubscribe()
    refusal = decode(got[0])[0] if got else None
    if refusal is not None and refusal.error is not None:
        say(f"  [executor-1] refused it: {refusal.error.code} ({refusal.error.message})")

    say("6. nobody serves demo.missing: no-responders, not a timeout")
    try:
        await bus.request("demo.missing", {}, timeout=5)
    except NoRespondersError as exc:
        say(f"  [planner] <- {type(exc).__name__}: {exc}")


async def run_patterns(planner: Agent, say: Say) -> None:
    """Fan-out/fan-in and async requests with a review, printing every hop."""
    bus = planner.bus
    say("7. fan-out: quote.get to every env=demo executor, gathered with policy all")
    result = await bus.fan_out("quote.get", {"item": "gpu-hour"}, selector="env=demo", timeout=5)
    for got in result.replies:
        say(f"  [planner] <- {got.agent_id}: {got.payload} (verified)")
    cheapest = min(result.value, key=lambda q: q["price"])
    say(f"  [planner] expected {result.expected}, missing {result.missing or '-'};"
        f" cheapest: {cheapest['by']} at {cheapest['price']}")  # fmt: skip

    say("8. async request with callback: order.place is queued durably, the result comes later")
    results = await bus.results()
    small = await bus.send("order.place", {"amount": 50})
    say(f"  [planner] queued {small.message_id[:8]}, returned at once")
    reply = await results.next(timeout=10)
    if reply is not None:
        say(f"  [planner] <- result of {(reply.in_reply_to or '')[:8]}: {reply.payload}")

    say("9. pending_review: an order over the limit waits for a person (here: the planner)")
    big = await bus.send("order.place", {"amount": 5000})
    interim = await results.next(timeout=10)
    if interim is not None:
        say(f"  [planner] <- {interim.status}: {interim.payload['reason']}")
    for entry in await bus.pending():
        say(f"  pending: {entry['request_id'][:8]} {entry['intent']} ({entry['reason']})")
    await bus.review(big.message_id, approve=True, note="approved in the demo")
    final = await results.next(timeout=10)
    if final is not None:
        say(f"  [planner] <- {final.status}: {final.payload}")
    await results.close()
