"""The registry on the in-memory twin and on a real nats-server: registration, liveness,
admission, look-ups, selector requests; and a watcher that outlives a server restart."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from bus import (
    Bus,
    Context,
    EmbeddedServer,
    InvalidSelectorError,
    KeyPair,
    NoExecutorError,
    RequestRefused,
    TrustStore,
)
from bus.transport import MemoryBroker
from bus.transport.base import Transport
from bus.transport.nats import connect as nats_connect
from registry import Registry, endorse, parse_selector

Connect = Callable[[], Awaitable[Transport]]


@pytest.fixture
async def connect(transport_kind: str, nats_url: str) -> AsyncIterator[Connect]:
    broker = MemoryBroker()
    made: list[Transport] = []

    async def factory() -> Transport:
        t: Transport = (
            broker.connect() if transport_kind == "memory" else await nats_connect(nats_url)
        )
        made.append(t)
        return t

    yield factory
    for t in made:
        await t.close()


@pytest.fixture
def bucket() -> str:
    return f"reg_{os.urandom(6).hex()}"


async def open_registry(connect: Connect, bucket: str, trust: TrustStore, **kw: Any) -> Registry:
    return await Registry.open(await connect(), trust=trust, bucket=bucket, storage="memory", **kw)


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> float:
    """Wait for ``predicate``; return the seconds it took."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


async def test_registration_is_visible_to_another_connection(connect: Connect, bucket: str) -> None:
    key = KeyPair.generate("executor-1")
    trust = TrustStore([key.public])
    writer, reader = [await open_registry(connect, bucket, trust) for _ in range(2)]
    await writer.register(key, ["task.execute"], {"framework": "hermes", "env": "prod"}, ttl=30)
    await until(lambda: reader.get("executor-1") is not None)
    (record,) = reader.lookup("task.execute", "framework=hermes,env=prod")
    assert record.agent_id == "executor-1" and record.key == key.public
    assert record.card["skills"][0]["id"] == "task.execute"
    assert reader.lookup("task.execute", "env=dev") == ()
    await writer.close()
    await reader.close()


async def test_a_silent_agent_disappears_within_its_ttl(connect: Connect, bucket: str) -> None:
    key = KeyPair.generate("flaky")
    trust = TrustStore([key.public])
    writer, reader = [await open_registry(connect, bucket, trust) for _ in range(2)]
    registration = await writer.register(key, ["task.execute"], {}, ttl=1.0)
    await until(lambda: reader.get("flaky") is not None)
    await asyncio.sleep(0.5)
    assert registration.heartbeats >= 2  # heartbeats every ttl/3
    await registration.stop(deregister=False)  # the agent dies without a word
    assert reader.get("flaky") is not None
    took = await until(lambda: reader.get("flaky") is None, timeout=5)
    assert took <= 1.0 + reader._skew_ms / 1000 + 0.5
    await writer.close()
    await reader.close()


async def test_graceful_stop_deregisters_at_once(connect: Connect, bucket: str) -> None:
    key = KeyPair.generate("tidy")
    trust = TrustStore([key.public])
    writer, reader = [await open_registry(connect, bucket, trust) for _ in range(2)]
    await writer.register(key, ["task.execute"], {}, ttl=60)
    await until(lambda: reader.get("tidy") is not None)
    await writer.close()
    assert await until(lambda: reader.get("tidy") is None, timeout=2) < 1.0
    await reader.close()


async def test_tampered_and_untrusted_records_are_refused(connect: Connect, bucket: str) -> None:
    good, stranger = KeyPair.generate("good"), KeyPair.generate("stranger")
    trust = TrustStore([good.public])
    writer = await open_registry(connect, bucket, TrustStore([good.public, stranger.public]))
    reader = await open_registry(connect, bucket, trust)
    registration = await writer.register(good, ["task.execute"], {"env": "prod"}, ttl=30)
    await writer.register(stranger, ["task.execute"], {"env": "prod"}, ttl=30)
    await until(
        lambda: reader.refused.get("unknown_signer", 0) >= 1 and reader.get("good") is not None
    )
    assert reader.get("stranger") is None

    forged = orjson.loads(registration.record.to_bytes())
    forged["labels"]["env"] = "dev"  # the old signature no longer covers it
    await registration.stop(deregister=False)
    await writer.kv.put("agents.good", orjson.dumps(forged), ttl=30)
    await until(lambda: reader.get("good") is None)
    assert reader.refused.get("bad_signature") == 1
    assert reader.lookup("task.execute", "env=dev") == ()
    await writer.close()
    await reader.close()


async def test_operator_endorsement_feeds_trust_and_revocation_removes_it(
    connect: Connect, bucket: str
) -> None:
    operator, agent = KeyPair.generate("ops"), KeyPair.generate("worker-7")
    trust = TrustStore()  # the reader knows only the operator
    reader = await open_registry(connect, bucket, trust, operators=[operator.public])
    writer = await open_registry(connect, bucket, TrustStore([agent.public]))
    endorsement = endorse(operator, agent.public)
    await writer.register(agent, ["task.execute"], {"env": "prod"}, ttl=30, endorsement=endorsement)
    await until(lambda: reader.get("worker-7") is not None)
    assert reader.trust_of(reader.get("worker-7")) == "endorsed"  # type: ignore[arg-type]
    assert trust.get(agent.kid) == agent.public  # its envelopes are now accepted
    await reader.revoke(operator, agent.kid)
    await until(lambda: reader.get("worker-7") is None)
    assert agent.kid not in trust and agent.kid in reader.revoked
    await writer.close()
    await reader.close()


async def test_lookup_across_sixty_agents_returns_exactly_the_right_set(
    connect: Connect, bucket: str
) -> None:
    combos = itertools.product(["hermes", "crew", "lang"], ["prod", "dev"], ["eu", "us"], [0, 1, 2])
    keys, labels = [], {}
    for i, (fw, env, region, extra) in enumerate(itertools.islice(itertools.cycle(combos), 60)):
        k = KeyPair.generate(f"agent-{i:02d}")
        keys.append(k)
        labels[k.agent_id] = {"framework": fw, "env": env, "region": region}
        if extra == 1:
            labels[k.agent_id]["gpu"] = "a100"
    trust = TrustStore(k.public for k in keys)
    writer, reader = [await open_registry(connect, bucket, trust) for _ in range(2)]
    for i, k in enumerate(keys):
        intents = ["task.execute"] if i % 4 else ["task.execute", "facts.lookup"]
        await writer.register(k, intents, labels[k.agent_id], ttl=30)
    await until(lambda: len(reader) == 60)
    selectors = ["", "framework=hermes,env=prod", "env!=prod", "region in (eu),!gpu",
                 "gpu", "framework notin (crew, lang),region=us", "env=staging"]  # fmt: skip
    for intent in ("task.execute", "facts.lookup"):
        for text in selectors:
            sel = parse_selector(text)
            expected = sorted(
                k.agent_id
                for i, k in enumerate(keys)
                if (intent == "task.execute" or i % 4 == 0) and sel.matches(labels[k.agent_id])
            )
            assert [r.agent_id for r in reader.lookup(intent, text)] == expected, (intent, text)
    await writer.close()
    await reader.close()


async def test_selector_requests_reach_only_matching_executors(
    make_bus: Any, keys: dict[str, KeyPair]
) -> None:
    planner_key = keys["planner"]
    execs = [KeyPair.generate(f"ex-{i}") for i in range(6)]
    trust = TrustStore([planner_key.public, *(k.public for k in execs)])
    bucket = f"reg_{os.urandom(6).hex()}"
    served: dict[str, int] = {}
    registries = []
    for i, k in enumerate(execs):
        bus = await make_bus(k, trust=trust)

        async def work(payload: Any, ctx: Context, me: str = k.agent_id) -> Any:
            served[me] = served.get(me, 0) + 1
            return me

        await bus.handle("task.execute", work)
        reg = await Registry.open(bus.transport, trust=trust, bucket=bucket, storage="memory")
        env = "prod" if i % 2 else "dev"
        await reg.register(k, ["task.execute"], {"env": env, "framework": "hermes"}, ttl=30)
        registries.append(reg)
    planner: Bus = await make_bus(planner_key, trust=trust)
    planner.directory = directory = await Registry.open(
        planner.transport, trust=trust, bucket=bucket, storage="memory"
    )
    await until(lambda: len(directory) == 6)
    replies = [
        await planner.request("task.execute", {}, selector="env=prod", timeout=5) for _ in range(12)
    ]
    prod = {"ex-1", "ex-3", "ex-5"}
    assert {r.payload for r in replies} == prod and set(served) == prod
    assert all(served[a] == 4 for a in prod)  # round-robin
    with pytest.raises(NoExecutorError):
        await planner.request("task.execute", {}, selector="env=staging", timeout=5)
    with pytest.raises(InvalidSelectorError):
        await planner.request("task.execute", {}, selector="env in (prod", timeout=5)
    for reg in [*registries, directory]:
        await reg.close()


async def jetstream_ready(registry: Registry, timeout: float = 15) -> None:
    """After a restart the server accepts clients before JetStream has recovered."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await registry.kv.get("probe")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_watcher_survives_a_server_restart(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    server = EmbeddedServer(store_dir=store)
    url = server.start()
    port = int(url.rsplit(":", 1)[1])
    a, b = KeyPair.generate("before"), KeyPair.generate("after")
    trust = TrustStore([a.public, b.public])
    watcher_t, writer_t = await nats_connect(url), await nats_connect(url)
    try:
        reader = await Registry.open(watcher_t, trust=trust)
        writer = await Registry.open(writer_t, trust=trust)
        first = await writer.register(a, ["task.execute"], {"phase": "one"}, ttl=30)
        await until(lambda: reader.get("before") is not None)

        server.stop()
        server = EmbeddedServer(store_dir=store, port=port)
        server.start()
        await until(lambda: watcher_t.nc.is_connected and writer_t.nc.is_connected, timeout=15)  # type: ignore[attr-defined]
        await jetstream_ready(writer)
        await first.stop()  # deleted while the reader may still be resyncing
        await writer.register(b, ["task.execute"], {"phase": "two"}, ttl=30)
        await until(
            lambda: reader.get("after") is not None and reader.get("before") is None, timeout=15
        )
        assert [r.agent_id for r in reader.lookup("task.execute")] == ["after"]
        await writer.close()
        await reader.close()
    finally:
        await watcher_t.close()
        await writer_t.close()
        server.stop()


async def test_revoking_an_endorsed_agent_stops_its_envelopes(
    make_bus: Any, keys: dict[str, KeyPair]
) -> None:
    operator, worker_key = KeyPair.generate("ops"), KeyPair.generate("worker-9")
    bucket = f"reg_{os.urandom(6).hex()}"
    exec_trust = TrustStore()  # the executor knows no agent key, only the operator
    executor: Bus = await make_bus(keys["executor"], trust=exec_trust)

    async def work(payload: Any, ctx: Context) -> Any:
        return "done"

    await executor.handle("task.execute", work)
    feed = await Registry.open(
        executor.transport,
        trust=exec_trust,
        operators=[operator.public],
        bucket=bucket,
        storage="memory",
    )
    worker: Bus = await make_bus(worker_key, trust=[keys["executor"].public])
    worker_reg = await Registry.open(
        worker.transport, trust=TrustStore([worker_key.public]), bucket=bucket, storage="memory"
    )
    with pytest.raises(RequestRefused):  # not endorsed yet: unknown to the executor
        await worker.request("task.execute", {}, timeout=5)
    await worker_reg.register(
        worker_key, [], {}, ttl=30, endorsement=endorse(operator, worker_key.public)
    )
    await until(lambda: worker_key.kid in exec_trust)
    assert (await worker.request("task.execute", {}, timeout=5)).payload == "done"
    await feed.revoke(operator, worker_key.kid)
    await until(lambda: worker_key.kid not in exec_trust)
    with pytest.raises(RequestRefused) as info:
        await worker.request("task.execute", {}, timeout=5)
    assert info.value.code == "unknown_signer"
    await worker_reg.close()
    await feed.close()


async def test_a_rotated_endorsed_key_is_trusted_no_longer(connect: Connect, bucket: str) -> None:
    operator = KeyPair.generate("ops")
    old, new = KeyPair.generate("worker-3"), KeyPair.generate("worker-3")
    trust = TrustStore()
    reader = await open_registry(connect, bucket, trust, operators=[operator.public])
    writer = await open_registry(connect, bucket, TrustStore([old.public, new.public]))
    first = await writer.register(old, [], {}, ttl=30, endorsement=endorse(operator, old.public))
    await until(lambda: old.kid in trust)
    await first.stop(deregister=False)
    await writer.register(new, [], {}, ttl=30, endorsement=endorse(operator, new.public))
    await until(lambda: new.kid in trust)
    assert old.kid not in trust  # the rotated-away key signs nothing any more
    await reader.revoke(operator, new.kid)
    await until(lambda: new.kid not in trust)
    await writer.kv.delete(f"revoked.{new.kid}")  # deleting a revocation does not undo it
    await asyncio.sleep(0.2)
    assert new.kid in reader.revoked
    await writer.close()
    await reader.close()
