"""Request/reply round trips: raw nats-py, FastStream, and the bus, against one server.

Requester and responder share this process, so ``time.process_time`` per round trip is
the Python CPU of *both* sides; the nats-server runs in its own process. Each figure is
the median of ``REPEATS`` runs.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import nats

from bus import Bus, Context, KeyPair

PAYLOAD: dict[str, Any] = {
    "task": "summarize",
    "doc": "lorem ipsum dolor sit amet " * 24,
    "options": {"max_tokens": 256, "lang": "en", "tags": ["a", "b", "c"]},
}
REPEATS = 3
WINDOW = 64


@dataclass
class Result:
    name: str
    mode: str
    n: int
    rt_per_s: float
    cpu_us: float


Call = Callable[[], Awaitable[Any]]


async def _worker(call: Call, count: int) -> None:
    for _ in range(count):
        await call()


async def measure(name: str, call: Call, n: int, window: int) -> Result:
    """``n`` calls, ``window`` in flight; median over REPEATS runs."""
    rates, cpus = [], []
    for _ in range(REPEATS):
        for _ in range(50):  # warm-up
            await call()
        per_worker = n // window
        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(_worker(call, per_worker) for _ in range(window)))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        total = per_worker * window
        rates.append(total / wall)
        cpus.append(cpu / total * 1e6)
    mode = "sequential" if window == 1 else f"{window} in flight"
    return Result(name, mode, n, statistics.median(rates), statistics.median(cpus))


async def raw_nats(url: str, n_seq: int, n_par: int) -> list[Result]:
    responder, requester = await nats.connect(url), await nats.connect(url)
    body = __import__("orjson").dumps(PAYLOAD)

    async def respond(msg: Any) -> None:
        await msg.respond(msg.data)

    await responder.subscribe("bench.raw", queue="raw", cb=respond)
    await responder.flush()
    await responder.flush()

    async def call() -> Any:
        return await requester.request("bench.raw", body, timeout=10)

    out = [
        await measure("raw nats-py", call, n_seq, 1),
        await measure("raw nats-py", call, n_par, WINDOW),
    ]
    await requester.drain()
    await responder.drain()
    return out


async def faststream_rr(url: str, n_seq: int, n_par: int) -> list[Result]:
    try:
        from faststream.nats import NatsBroker
    except ImportError:
        return []
    quiet = logging.getLogger("bench.faststream")
    quiet.setLevel(logging.WARNING)
    server_broker = NatsBroker(url, logger=quiet, log_level=logging.DEBUG)
    client_broker = NatsBroker(url, logger=quiet, log_level=logging.DEBUG)

    @server_broker.subscriber("bench.fs", queue="fs")
    async def handle(msg: dict[str, Any]) -> dict[str, Any]:
        return msg

    await server_broker.start()
    await client_broker.connect()

    async def call() -> Any:
        reply = await client_broker.request(PAYLOAD, "bench.fs", timeout=10)
        return await reply.decode()

    out = [
        await measure("FastStream", call, n_seq, 1),
        await measure("FastStream", call, n_par, WINDOW),
    ]
    await client_broker.stop()
    await server_broker.stop()
    return out


async def bus_rr(
    url: str, replay: str, n_seq: int, n_par: int, idempotent: bool = False
) -> list[Result]:
    p, e = KeyPair.generate("bench-planner"), KeyPair.generate("bench-executor")
    executor = await Bus.connect(url, key=e, trust=[p.public], replay=replay)  # type: ignore[arg-type]
    planner = await Bus.connect(url, key=p, trust=[e.public], replay=replay)  # type: ignore[arg-type]

    async def echo(payload: Any, ctx: Context) -> Any:
        return payload

    await executor.handle("bench.echo", echo, idempotent=idempotent)

    async def call() -> Any:
        return await planner.request("bench.echo", PAYLOAD, timeout=10)

    name = f"bus signed ({replay} replay{', idempotent' if idempotent else ''})"
    out = [await measure(name, call, n_seq, 1), await measure(name, call, n_par, WINDOW)]
    await planner.close()
    await executor.close()
    return out
