"""Fault test: a 3-node JetStream cluster (R3, fsync always) loses its request-stream
leader to SIGKILL while 2,000 async requests are in flight. All complete; none runs twice."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import nats

from bus import Bus, Context, DurableConfig, KeyPair, TransportError
from bus.durable import REQUESTS_STREAM
from tests.cluster import running_cluster

N = 2000
CONFIG = DurableConfig(replicas=3, ack_wait=5.0, workers=32)


async def connect(url: str, key: KeyPair, trust: list[Any]) -> Bus:
    for _ in range(100):  # the cluster elects its JetStream meta leader first
        try:
            return await Bus.connect(url, key=key, trust=trust, replicas=3, retry=1)
        except TransportError:
            await asyncio.sleep(0.2)
    raise AssertionError("cluster never became ready")


async def stream_leader(url: str) -> str:
    nc = await nats.connect(url.split(","))
    try:
        info = await nc.jetstream().stream_info(REQUESTS_STREAM)
        return str(info.cluster.leader)
    finally:
        await nc.close()


async def run(url: str, cluster: Any) -> dict[str, Any]:
    keys = {n: KeyPair.generate(n) for n in ("planner", "exec-a", "exec-b")}
    trust = [k.public for k in keys.values()]
    completions: Counter[int] = Counter()

    async def work(payload: Any, ctx: Context) -> Any:
        completions[payload["i"]] += 1
        return payload["i"]

    urls = url.split(",")
    executors = []
    for i, name in enumerate(("exec-a", "exec-b")):
        bus = await connect(",".join(urls[i:] + urls[:i]), keys[name], trust)
        for _ in range(100):
            try:
                await bus.serve_durable("job.run", work, config=CONFIG)
                break
            except TransportError:
                await asyncio.sleep(0.2)
        executors.append(bus)
    planner = await connect(",".join(urls[2:] + urls[:2]), keys["planner"], trust)
    results = await planner.results(CONFIG)

    leader = await stream_leader(url)
    sent: dict[str, int] = {}
    gate = asyncio.Semaphore(64)
    killed_at: list[float] = []

    async def send_one(i: int) -> None:
        async with gate:
            env = await planner.send("job.run", {"i": i}, publish_timeout=60)
            sent[env.message_id] = i
            if len(sent) == N // 4 and not killed_at:
                killed_at.append(time.monotonic())
                cluster.node_named(leader).kill()  # SIGKILL, mid-flight

    start = time.monotonic()
    await asyncio.gather(*(send_one(i) for i in range(N)))
    answered: dict[str, Any] = {}
    while len(answered) < N and time.monotonic() - start < 240:
        reply = await results.next(timeout=5)
        if reply is not None and reply.status == "ok":
            answered.setdefault(reply.in_reply_to or "", reply.payload)
    took = time.monotonic() - start
    await results.close()
    for bus in [planner, *executors]:
        await bus.close(timeout=2)
    return {"sent": sent, "answered": answered, "completions": completions, "took": took,
            "leader": leader}  # fmt: skip


def test_leader_killed_mid_flight_loses_nothing_and_runs_nothing_twice() -> None:
    with running_cluster(sync_interval="always") as cluster:
        figures = asyncio.run(run(cluster.url, cluster))
    sent, answered, completions = figures["sent"], figures["answered"], figures["completions"]
    assert len(sent) == N
    assert set(answered) == set(sent)  # every accepted request completed
    assert {answered[m] for m in sent} == set(range(N))
    assert sorted(completions) == list(range(N)) and max(completions.values()) == 1  # none twice
    print(f"\n{N} async requests, leader {figures['leader']} SIGKILLed after {N // 4} sends: "
          f"all completed once in {figures['took']:.1f} s")  # fmt: skip
