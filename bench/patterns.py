"""Patterns: fan-out/fan-in gather latency, durable async throughput, requester memory.

Fan-out: the N responders run in a second process (raw nats-py subscribers and N bus
agents), the gatherer in this one, against the same server. Durable: one executor and
one requester in this process; raw JetStream publish+ack in the same run, and the cost
of fsync-always against the server's default interval on two servers.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import subprocess
import sys
import time
import tracemalloc
from typing import Any

import nats

from bus import Bus, Context, DurableConfig, EmbeddedServer, KeyPair

RESPONDERS = """
import asyncio, sys
import nats
from bus import Bus, KeyPair

async def main(url, n):
    gatherer = KeyPair.from_seed("gatherer", bytes([7]) * 32).public
    nc = await nats.connect(url)
    async def raw(msg):
        await msg.respond(msg.data)
    for _ in range(n):
        await nc.subscribe("bench.scatter", cb=raw)
    buses = []
    for i in range(n):
        key = KeyPair.from_seed(f"r{i:03d}", i.to_bytes(2, "big") * 16)
        bus = await Bus.connect(url, key=key, trust=[gatherer], replay="local")
        async def quote(payload, ctx):
            return {"price": 1}
        await bus.handle("bench.quote", quote, idempotent=False)
        buses.append(bus)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def _pcts(samples: list[float]) -> tuple[float, float]:
    samples.sort()
    return statistics.median(samples), samples[max(0, int(len(samples) * 0.99) - 1)]


async def fanout(url: str, n: int, rounds: int) -> dict[str, Any]:
    """Gather latency (ms) and gatherer CPU (µs) per gather: raw scatter-gather and the bus."""
    child = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-c", RESPONDERS, url, str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    assert (await asyncio.to_thread(child.stdout.readline)).strip() == "ready"
    agents = [f"r{i:03d}" for i in range(n)]
    trust = [KeyPair.from_seed(a, i.to_bytes(2, "big") * 16).public for i, a in enumerate(agents)]
    nc = await nats.connect(url)
    bus = await Bus.connect(url, key=KeyPair.from_seed("gatherer", bytes([7]) * 32), trust=trust)

    async def raw_gather() -> None:
        inbox = nc.new_inbox()
        done, got = asyncio.Event(), [0]

        async def on(msg: Any) -> None:
            got[0] += 1
            if got[0] == n:
                done.set()

        sub = await nc.subscribe(inbox, cb=on)
        await nc.publish("bench.scatter", b'{"item":"x"}', reply=inbox)
        await asyncio.wait_for(done.wait(), 10)
        await sub.unsubscribe()

    async def bus_gather() -> None:
        result = await bus.fan_out("bench.quote", {"item": "x"}, agents=agents, timeout=10)
        assert result.satisfied and len(result.ok) == n

    out: dict[str, Any] = {}
    for name, gather in (("raw", raw_gather), ("bus", bus_gather)):
        for _ in range(5):
            await gather()
        lat, cpu0 = [], time.process_time()
        for _ in range(rounds):
            t = time.perf_counter()
            await gather()
            lat.append((time.perf_counter() - t) * 1000)
        out[name] = {"ms": _pcts(lat), "cpu_us": (time.process_time() - cpu0) / rounds * 1e6}
    await bus.close()
    await nc.close()
    child.stdin.close()
    await asyncio.to_thread(child.wait)
    return out


async def durable(url: str, n: int) -> dict[str, float]:
    """Requests/s end to end (send → result read) against raw JetStream publish+ack."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name="BENCH_RAW", subjects=["bench.raw.>"])
    gate = asyncio.Semaphore(64)

    async def raw_one(i: int) -> None:
        async with gate:
            await js.publish("bench.raw.x", b"x" * 600, headers={"Nats-Msg-Id": f"m{i}"})

    t = time.perf_counter()
    await asyncio.gather(*(raw_one(i) for i in range(n)))
    raw_rps = n / (time.perf_counter() - t)
    await nc.close()

    keys = [KeyPair.generate("bench-requester"), KeyPair.generate("bench-worker")]
    trust = [k.public for k in keys]
    requester = await Bus.connect(url, key=keys[0], trust=trust)
    worker = await Bus.connect(url, key=keys[1], trust=trust)

    async def work(payload: Any, ctx: Context) -> Any:
        return payload

    await worker.serve_durable("bench.job", work, config=DurableConfig(workers=32))
    results = await requester.results()

    async def send_one(i: int) -> None:
        async with gate:
            await requester.send("bench.job", {"i": i, "pad": "x" * 500})

    t = time.perf_counter()
    sender = asyncio.gather(*(send_one(i) for i in range(n)))
    got = 0
    while got < n:
        reply = await results.next(timeout=30)
        assert reply is not None, f"only {got} of {n} results"
        got += 1
    await sender
    bus_rps = n / (time.perf_counter() - t)
    await results.close()
    await requester.close()
    await worker.close()
    return {"raw_publish_ack_per_s": raw_rps, "bus_end_to_end_per_s": bus_rps}


async def requester_memory(url: str, n: int) -> float:
    """Bytes the requester holds for ``n`` accepted async requests still pending."""
    requester = await Bus.connect(url, key=KeyPair.generate("bench-mem"), trust=[])
    await requester.send("bench.nobody", {})  # streams ready before measuring
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    ids = [(await requester.send("bench.nobody", {"i": i})).message_id for i in range(n)]
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(ids) == n
    await requester.close()
    return float(used)


async def run() -> dict[str, Any]:
    figures: dict[str, Any] = {}
    with EmbeddedServer() as server:
        figures["fanout"] = {
            n: await fanout(server.url, n, 200 if n <= 10 else 40) for n in (10, 100)
        }
        figures["durable_always"] = await durable(server.url, 2000)
        figures["memory_10k"] = await requester_memory(server.url, 10_000)
    with EmbeddedServer(sync_interval="2m") as server:
        figures["durable_2m"] = await durable(server.url, 2000)
    return figures


def report(figures: dict[str, Any], verify_us: float) -> None:
    print("\nfan-out, policy all, every reply verified (responders in a second process):")
    for n, f in figures["fanout"].items():
        raw, bus = f["raw"], f["bus"]
        budget = raw["ms"][0] + 1.1 * n * verify_us / 1000
        print(f"  N={n:<4} raw p50/p99 {raw['ms'][0]:.2f}/{raw['ms'][1]:.2f} ms, "
              f"bus {bus['ms'][0]:.2f}/{bus['ms'][1]:.2f} ms; target p50 <= raw + 1.1 x {n} "
              f"verifies = {budget:.2f} ms; gatherer CPU raw {raw['cpu_us']:.0f} µs, "
              f"bus {bus['cpu_us']:.0f} µs")  # fmt: skip
    a, b = figures["durable_always"], figures["durable_2m"]
    print("durable async, 2,000 requests, 64 in flight:")
    print(f"  fsync always: raw JetStream publish+ack {a['raw_publish_ack_per_s']:.0f}/s, bus "
          f"end to end (send, execute, result read) {a['bus_end_to_end_per_s']:.0f}/s")  # fmt: skip
    print(f"  fsync every 2m: raw {b['raw_publish_ack_per_s']:.0f}/s, "
          f"bus {b['bus_end_to_end_per_s']:.0f}/s")  # fmt: skip
    print(f"requester memory for 10,000 pending async requests: "
          f"{figures['memory_10k'] / 2**20:.1f} MiB (target <= 50 MB)")  # fmt: skip
