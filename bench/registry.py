"""Registry figures: look-up latency over 10,000 records, registration-to-visibility in
another process, and the memory the cache takes."""

from __future__ import annotations

import asyncio
import gc
import statistics
import subprocess
import sys
import time
import tracemalloc
from typing import Any

from bus import KeyPair, TrustStore
from bus.transport import MemoryBroker
from bus.transport.nats import connect
from registry import AgentRecord, Registry

N_RECORDS = 10_000
SELECTORS = ["framework=hermes,env=prod", "env!=prod,region in (eu, us)", "gpu,!canary", ""]


def _labels(i: int) -> dict[str, str]:
    labels = {
        "framework": ("hermes", "crew", "lang", "autogen")[i % 4],
        "env": ("prod", "staging", "dev")[i % 3],
        "region": ("eu", "us", "ap")[(i // 3) % 3],
    }
    if i % 7 == 0:
        labels["gpu"] = "a100"
    if i % 11 == 0:
        labels["canary"] = "true"
    return labels


async def _filled_registry(n: int) -> tuple[Registry, float]:
    """A cache loaded from a bucket of ``n`` signed records; returns it and the bytes it holds."""
    broker = MemoryBroker()
    keys = [KeyPair.generate(f"agent-{i:05d}") for i in range(n)]
    kv = await broker.connect().key_value("bench_registry")
    now = int(time.time() * 1000)
    for i, key in enumerate(keys):
        intents = ["task.execute"] if i % 2 else ["task.execute", "facts.lookup"]
        record = AgentRecord.build(key, intents, _labels(i), now_ms=now, ttl_ms=600_000)
        await kv.put(f"agents.{key.agent_id}", record.to_bytes())
    trust = TrustStore(k.public for k in keys)
    del keys
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    registry = Registry(kv, trust=trust)
    await registry.start(timeout=120)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return registry, used


def _percentiles(samples: list[float]) -> tuple[float, float]:
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def lookup_latency(registry: Registry) -> dict[str, Any]:
    """µs per look-up: memo hits, hits right after a membership change (the result is
    updated in place), and full recomputes (a selector seen for the first time)."""
    out: dict[str, Any] = {}
    for sel in SELECTORS:
        hits, churn, cold = [], [], []
        size = len(registry.lookup("task.execute", sel))
        for _ in range(2000):
            t = time.perf_counter_ns()
            registry.lookup("task.execute", sel)
            hits.append((time.perf_counter_ns() - t) / 1000)
        victims = list(registry.records.values())[:50]
        for record in victims:  # an agent leaves and comes back: two membership changes
            registry.remove(record.agent_id)
            registry.put(record)
            t = time.perf_counter_ns()
            registry.lookup("task.execute", sel)
            churn.append((time.perf_counter_ns() - t) / 1000)
        for _ in range(20):
            registry.forget_results()
            t = time.perf_counter_ns()
            registry.lookup("task.execute", sel)
            cold.append((time.perf_counter_ns() - t) / 1000)
        out[sel or "(all)"] = {
            "matches": size,
            "hit": _percentiles(hits),
            "churn": _percentiles(churn),
            "recompute": _percentiles(cold),
        }
    picks = []
    for _ in range(2000):
        t = time.perf_counter_ns()
        registry.pick("task.execute", SELECTORS[0])
        picks.append((time.perf_counter_ns() - t) / 1000)
    out["pick"] = _percentiles(picks)
    return out


WATCHER = """
import asyncio, sys, time
from bus import TrustStore
from bus.transport.nats import connect
from registry import Registry

async def main(url, n):
    t = await connect(url)
    reg = await Registry.open(t, trust=TrustStore(), require_trust=False, storage="memory",
                              bucket="bench_visibility")
    print("ready", flush=True)
    seen = {}
    while len(seen) < n:
        for r in reg.all():
            seen.setdefault(r.agent_id, time.time())
        await asyncio.sleep(0.0005)
    for a, ts in seen.items():
        print(a, ts, flush=True)
    await reg.close()
    await t.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


async def visibility(url: str, n: int = 200) -> tuple[float, float]:
    """ms from the end of a registration's put to its visibility in another process."""
    child = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-c", WATCHER, url, str(n)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert (await asyncio.to_thread(child.stdout.readline)).strip() == "ready"
    transport = await connect(url)
    writer = await Registry.open(
        transport,
        trust=TrustStore(),
        require_trust=False,
        storage="memory",
        bucket="bench_visibility",
    )
    put_at = {}
    for i in range(n):
        key = KeyPair.generate(f"vis-{i:04d}")
        await writer.register(key, ["task.execute"], _labels(i), ttl=60)
        put_at[key.agent_id] = time.time()
        await asyncio.sleep(0.005)
    lines = (await asyncio.to_thread(child.stdout.read)).split("\n")
    await asyncio.to_thread(child.wait)
    lat = [
        (float(ts) - put_at[a]) * 1000 for a, ts in (line.split() for line in lines if line.strip())
    ]
    await writer.close()
    await transport.close()
    return _percentiles(lat)


async def run(url: str) -> dict[str, Any]:
    registry, used = await _filled_registry(N_RECORDS)
    figures = {"records": len(registry), "cache_bytes": used, "lookup": lookup_latency(registry)}
    await registry.close()
    figures["visibility_ms"] = await visibility(url)
    return figures


def report(figures: dict[str, Any]) -> None:
    print(f"\nregistry: {figures['records']} records in the cache, "
          f"{figures['cache_bytes'] / 2**20:.1f} MiB (tracemalloc)")  # fmt: skip
    print(f"  {'selector (intent task.execute)':30} {'matches':>7}  p50/p99 µs: "
          f"{'hit':>13} {'after churn':>15} {'first time':>17}")  # fmt: skip
    for sel, f in figures["lookup"].items():
        if sel == "pick":
            continue
        cells = [f"{f[k][0]:.2f}/{f[k][1]:.2f}" for k in ("hit", "churn")]
        cells.append(f"{f['recompute'][0]:.0f}/{f['recompute'][1]:.0f}")
        print(f"  {sel:30} {f['matches']:>7}  {'':11}{cells[0]:>13} {cells[1]:>15} {cells[2]:>17}")
    p50, p99 = figures["lookup"]["pick"]
    print(
        f"  pick (round-robin, memo hit): p50 {p50:.2f} µs, p99 {p99:.2f} µs (target <= 20 µs p50)"
    )
    v50, v99 = figures["visibility_ms"]
    print(f"  registration -> visible in another process: p50 {v50:.1f} ms, p99 {v99:.1f} ms"
          " (target <= 100 ms)")  # fmt: skip


def main() -> None:
    from bus import EmbeddedServer

    with EmbeddedServer() as server:
        report(asyncio.run(run(server.url)))


if __name__ == "__main__":
    main()
