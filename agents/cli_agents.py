"""``intentbus agents ls`` and ``intentbus agents show``: read the live registry.

They list every record whose own signature verifies, with a TRUST column that says
whether the key is trusted (``--trust``), endorsed (by an ``--operator`` key) or neither;
the bus itself routes only to the first two. Records with a bad signature are never
listed (the count is printed to stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from bus import TrustStore
from bus.transport.nats import connect
from registry import AgentRecord, Registry, parse_selector

__all__ = ["add_agents_parser", "run_agents"]


def add_agents_parser(sub: Any, nats_default: str | None) -> None:
    """Register the ``agents`` sub-commands on the main parser."""
    agents = sub.add_parser("agents", help="the live registry").add_subparsers(
        dest="agents_cmd", required=True
    )
    ls = agents.add_parser("ls", help="list live agents")
    ls.add_argument("-l", "--selector", default="", help="label selector, e.g. env=prod,tier!=gpu")
    ls.add_argument("--intent", help="only agents serving this intent")
    ls.add_argument("--json", action="store_true")
    show = agents.add_parser("show", help="one agent's full record")
    show.add_argument("agent_id")
    for p in (ls, show):
        p.add_argument("--nats", default=nats_default or "nats://127.0.0.1:4222")
        p.add_argument("--trust", action="append", default=[], help="trusted keys (repeatable)")
        p.add_argument("--operator", action="append", default=[], help="operator keys (.pub)")


async def run_agents(args: argparse.Namespace, trusted: Any) -> int:
    """Run ``agents ls`` / ``agents show``; returns the exit code."""
    selector = parse_selector(args.selector) if args.agents_cmd == "ls" else None
    trust = TrustStore(trusted(args.trust))
    operators = trusted(args.operator)
    transport = await connect(args.nats, name="intentbus-cli", reconnect=False)
    try:
        registry = await Registry.open(
            transport, trust=trust, operators=operators, require_trust=False
        )
        try:
            if registry.refused:
                print(f"intentbus: refused records: {registry.refused}", file=sys.stderr)
            if args.agents_cmd == "show":
                return _show(registry, args.agent_id)
            assert selector is not None
            records = (
                registry.lookup(args.intent, selector)
                if args.intent
                else sorted(
                    (r for r in registry.all() if selector.matches(r.labels)),
                    key=lambda r: r.agent_id,
                )
            )
            _print_records(registry, list(records), as_json=args.json)
            return 0
        finally:
            await Registry.close(registry)
    finally:
        await transport.close()


def _describe(registry: Registry, record: AgentRecord) -> dict[str, Any]:
    return {
        "agent_id": record.agent_id,
        "intents": list(record.intents),
        "labels": record.labels,
        "kid": record.key.kid,
        "trust": registry.trust_of(record),
        "heartbeat_age_s": round(time.time() - record.heartbeat_at / 1000, 1),
        "ttl_s": record.ttl_ms / 1000,
    }


def _print_records(registry: Registry, records: list[AgentRecord], *, as_json: bool) -> None:
    rows = [_describe(registry, r) for r in records]
    if as_json:
        print(json.dumps(rows))
        return
    header = ("AGENT_ID", "INTENTS", "LABELS", "HEARTBEAT", "TRUST")
    table = [header] + [
        (
            r["agent_id"],
            ",".join(r["intents"]) or "-",
            ",".join(f"{k}={v}" for k, v in sorted(r["labels"].items())) or "-",
            f"{r['heartbeat_age_s']:.1f}s ago",
            r["trust"],
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _show(registry: Registry, agent_id: str) -> int:
    record = registry.get(agent_id)
    if record is None:
        print(f"intentbus: no live agent {agent_id!r} in the registry", file=sys.stderr)
        return 1
    doc = dict(record.unsigned_dict(), signatures=record.signatures)
    doc["status"] = _describe(registry, record)
    print(json.dumps(doc, indent=2))
    return 0
