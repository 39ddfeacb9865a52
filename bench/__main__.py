"""``make bench``: every figure in one run, against one embedded nats-server.

Prints round trips per second and Python CPU µs per round trip (both sides) for raw
nats-py, FastStream and the bus, the crypto floor measured in the same run, and the
ratios that the targets are stated in. Figures drift 5-25% between runs on a shared
2-core machine; the ratios within one run are what to compare.
"""

from __future__ import annotations

import argparse
import asyncio

from bus import EmbeddedServer

from . import patterns as patterns_bench
from . import registry as registry_bench
from .crypto import crypto_costs, envelope_canonical_bytes
from .roundtrip import Result, bus_rr, faststream_rr, raw_nats


def _table(results: list[Result]) -> None:
    print(f"{'':42} {'mode':>14} {'rt/s':>10} {'CPU µs/rt':>10}")
    for r in results:
        print(f"{r.name:42} {r.mode:>14} {r.rt_per_s:>10.0f} {r.cpu_us:>10.1f}")


async def _run(n_seq: int, n_par: int) -> None:
    body = envelope_canonical_bytes()
    costs = crypto_costs(body)
    print(f"crypto, {len(body)}-byte canonical envelope (µs/op):")
    for k, v in costs.items():
        print(f"  {k:22} {v:6.1f}")
    with EmbeddedServer() as server:
        results = await raw_nats(server.url, n_seq, n_par)
        results += await faststream_rr(server.url, n_seq, n_par)
        for replay in ("local", "shared"):
            results += await bus_rr(server.url, replay, n_seq, n_par)
            results += await bus_rr(server.url, replay, n_seq, n_par, idempotent=True)
        registry_figures = await registry_bench.run(server.url)
    pattern_figures = await patterns_bench.run()
    print()
    _table(results)
    by = {(r.name, r.mode): r for r in results}
    par = f"{64} in flight"
    raw = by[("raw nats-py", par)].cpu_us
    sign = min(costs["pynacl_sign"], costs["cryptography_sign"])
    verify = min(costs["pynacl_verify"], costs["cryptography_verify"])
    floor = raw + 2 * sign + 2 * verify
    print(
        f"\ncrypto floor = raw {raw:.1f} + 2 sign {sign:.1f} + 2 verify {verify:.1f}"
        f" = {floor:.1f} µs/rt"
    )
    for name in sorted({r.name for r in results if r.name.startswith("bus")}):
        r = by[(name, par)]
        ratio = r.cpu_us / floor
        print(f"  {name:40} {r.cpu_us:6.1f} µs/rt = {ratio:.2f} x floor")
    print("  (target <= 1.15 x floor for the local replay mode)")
    fs = by.get(("FastStream", par))
    if fs:
        print(f"  FastStream {fs.cpu_us:.1f} µs/rt = {fs.cpu_us / raw:.2f} x raw nats-py")
    registry_bench.report(registry_figures)
    patterns_bench.report(pattern_figures, verify)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--seq", type=int, default=1000, help="sequential round trips per run")
    parser.add_argument("--par", type=int, default=6400, help="round trips per run, 64 in flight")
    args = parser.parse_args()
    asyncio.run(_run(args.seq, args.par))


if __name__ == "__main__":
    main()
