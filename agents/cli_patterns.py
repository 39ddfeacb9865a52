"""``intentbus fanout``, ``intentbus send`` and ``intentbus pending ls|approve|decline``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from bus import Bus, BusError, UsageError, load_key
from registry import Registry, parse_selector

__all__ = ["add_pattern_parsers", "directory_for", "run_fanout", "run_pending", "run_send"]


def _common(p: argparse.ArgumentParser, nats_default: str | None) -> None:
    p.add_argument("--key", required=True, help="private key file (agent id = file stem)")
    p.add_argument("--nats", default=nats_default or "nats://127.0.0.1:4222")
    p.add_argument("--trust", action="append", default=[], help="keys whose replies to accept")


def add_pattern_parsers(sub: Any, nats_default: str | None) -> None:
    """Register the pattern sub-commands on the main parser."""
    fan = sub.add_parser("fanout", help="scatter to every executor, gather by policy")
    fan.add_argument("intent")
    fan.add_argument("payload", help="JSON")
    fan.add_argument("-l", "--selector", help="expected responders: registered executors by label")
    fan.add_argument("--policy", default="all", help="first | all | quorum:K")
    fan.add_argument("--timeout", type=float, default=10.0)
    fan.add_argument("--json", action="store_true")
    _common(fan, nats_default)

    send = sub.add_parser("send", help="queue an async request; the result goes to --reply-to")
    send.add_argument("intent")
    send.add_argument("payload", help="JSON")
    send.add_argument("--reply-to", help="a bus subject or an http(s) URL (default: your results)")
    send.add_argument("--ttl", type=float, default=3600.0, help="seconds the request stays valid")
    _common(send, nats_default)

    pending = sub.add_parser("pending", help="requests waiting for a reviewer")
    actions = pending.add_subparsers(dest="pending_cmd", required=True)
    ls = actions.add_parser("ls", help="list parked requests")
    ls.add_argument("--json", action="store_true")
    _common(ls, nats_default)
    for verb in ("approve", "decline"):
        p = actions.add_parser(verb, help=f"{verb} a parked request")
        p.add_argument("request_id")
        p.add_argument("--note", default="")
        _common(p, nats_default)


@asynccontextmanager
async def directory_for(bus: Bus, selector: str | None) -> AsyncIterator[None]:
    """With a selector, attach a registry to ``bus`` for the block (closed after it)."""
    if selector is None:
        yield
        return
    registry = await Registry.open(bus.transport, trust=bus.trust)
    bus.directory = registry
    try:
        yield
    finally:
        bus.directory = None
        await registry.close()


def _payload(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"payload is not JSON: {exc}") from None


async def _bus(args: argparse.Namespace, trusted: Any) -> Bus:
    return await Bus.connect(args.nats, key=load_key(args.key), trust=trusted(args.trust))


async def run_fanout(args: argparse.Namespace, trusted: Any) -> int:
    """Print each reply and the missing responders; exit 1 when the policy was not met."""
    payload = _payload(args.payload)
    if args.selector is not None:
        parse_selector(args.selector)
    async with await _bus(args, trusted) as bus, directory_for(bus, args.selector):
        result = await bus.fan_out(
            args.intent, payload, selector=args.selector, policy=args.policy, timeout=args.timeout
        )
    rows = [
        {"agent_id": r.agent_id, "ok": r.error is None, "payload": r.payload,
         "error": r.error.to_dict() if r.error else None}
        for r in result.replies
    ]  # fmt: skip
    summary = {"policy": str(result.policy), "satisfied": result.satisfied,
               "partial": result.partial, "missing": result.missing, "replies": rows,
               "no_responders": result.no_responders}  # fmt: skip
    if args.json:
        print(json.dumps(summary))
    else:
        for row in rows:
            shown = (
                row["payload"]
                if row["ok"]
                else f"error {row['error']['code']}: {row['error']['message']}"
            )
            print(f"{row['agent_id']}: {json.dumps(shown) if row['ok'] else shown}")
        print(f"missing: {', '.join(result.missing) or '-'}")
        print(f"policy {result.policy}: {'satisfied' if result.satisfied else 'NOT satisfied'}"
              + (" (partial)" if result.partial else ""))  # fmt: skip
    return 0 if result.satisfied else 1


async def run_send(args: argparse.Namespace, trusted: Any) -> int:
    """Queue the request; print its id as JSON."""
    payload = _payload(args.payload)
    async with await _bus(args, trusted) as bus:
        env = await bus.send(args.intent, payload, reply_to=args.reply_to, ttl=args.ttl)
    print(json.dumps({"request_id": env.message_id, "reply_to": env.reply_to}))
    return 0


async def run_pending(args: argparse.Namespace, trusted: Any) -> int:
    """List, approve or decline parked requests."""
    async with await _bus(args, trusted) as bus:
        if args.pending_cmd == "ls":
            entries = await bus.pending()
            if args.json:
                print(json.dumps(entries))
            else:
                for e in entries:
                    print(f"{e['request_id']}  {e['intent']}  from {e['requester']}  "
                          f"at {e['executor']}: {e['reason']}")  # fmt: skip
                if not entries:
                    print("no parked requests")
            return 0
        try:
            reply = await bus.review(
                args.request_id, approve=args.pending_cmd == "approve", note=args.note
            )
        except BusError as exc:
            if isinstance(exc, UsageError):
                raise  # e.g. no such parked request: the caller's input, exit 2
            print(f"intentbus: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(reply.payload))
        return 0
