"""``intentbus``: the command line, and the composition root that wires the parts.

Configuration is read here, once: flags, then ``INTENTBUS_NATS_URL`` (default for
``--nats``) and ``INTENTBUS_NATS_SERVER`` (path of the nats-server binary). Exit
codes: 0 success, 1 a failure at run time (error reply, timeout, no responders),
2 bad input (flags, JSON, key files), with a one-line message on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from bus import (
    Bus,
    BusError,
    EmbeddedServer,
    KeyPair,
    PublicKey,
    RemoteError,
    UsageError,
    find_nats_server,
    load_key,
    load_trust_file,
    write_key_pair,
)
from bus.keyfile import public_key_json
from bus.subjects import validate_agent_id, validate_intent
from registry import parse_selector

from .agent import wait_for_signal
from .cli_agents import add_agents_parser, run_agents
from .cli_patterns import (
    add_pattern_parsers,
    directory_for,
    run_fanout,
    run_pending,
    run_send,
)
from .demo import build_demo_agents, run_patterns, run_scenario

__all__ = ["main"]


class CliError(Exception):
    """Bad input: printed as one line, exit code 2."""


def _say(line: str) -> None:
    print(line, flush=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="intentbus", description="Signed, intent-routed agent bus.")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the bus does")
    sub = p.add_subparsers(dest="command", required=True)
    keys = sub.add_parser("keys", help="key pairs").add_subparsers(dest="keys_cmd", required=True)
    new = keys.add_parser("new", help="write ID.key (0600) and ID.pub")
    new.add_argument("--agent-id", required=True)
    new.add_argument("--out", required=True, help="directory")

    nats_default = os.environ.get("INTENTBUS_NATS_URL")
    up = sub.add_parser("up", help="embedded NATS (unless --nats) and the demo agents")
    up.add_argument("--nats", default=nats_default, help="NATS URL; embedded server when omitted")
    up.add_argument("--trust", action="append", default=[], help=".pub or trust file (repeatable)")
    up.add_argument("--json", action="store_true", help="print one JSON line once ready")
    up.add_argument("--export-trust", help="write the demo agents' public keys to this file")

    req = sub.add_parser("request", help="send a signed request, print the reply payload")
    req.add_argument("intent")
    req.add_argument("payload", help="JSON")
    req.add_argument("--key", required=True, help="private key file (agent id = file stem)")
    req.add_argument("--nats", default=nats_default or "nats://127.0.0.1:4222")
    req.add_argument("--timeout", type=float, default=30.0)
    req.add_argument("--agent", help="address this agent instead of any executor")
    req.add_argument("-l", "--selector", help="pick a registered executor by labels")
    req.add_argument("--trust", action="append", default=[], help="keys whose replies to accept")

    add_agents_parser(sub, nats_default)
    add_pattern_parsers(sub, nats_default)

    demo = sub.add_parser("demo", help="run the demo ensemble once and print every hop")
    demo.add_argument("--nats", default=nats_default, help="NATS URL; embedded server when omitted")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``intentbus`` console script; returns the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "keys":
            return _keys_new(args)
        code: int = asyncio.run(_COMMANDS[args.command](args))
        return code
    except (CliError, UsageError) as exc:
        print(f"intentbus: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _keys_new(args: argparse.Namespace) -> int:
    key = KeyPair.generate(validate_agent_id(args.agent_id))
    try:
        private, public = write_key_pair(key, args.out)
    except FileExistsError:
        raise CliError(f"{args.out}/{args.agent_id}.key exists; not overwriting a key") from None
    except OSError as exc:
        raise CliError(f"cannot write keys to {args.out}: {exc.strerror}") from None
    print(key.public.b64)
    print(f"wrote {private} (private, 0600) and {public}", file=sys.stderr)
    return 0


def _trusted(files: Sequence[str]) -> list[PublicKey]:
    return [key for f in files for key in load_trust_file(f)]


async def _server(stack: AsyncExitStack, url: str | None) -> str:
    if url:
        return url
    server = EmbeddedServer(find_nats_server(os.environ.get("INTENTBUS_NATS_SERVER")))
    started = await asyncio.to_thread(server.start)
    stack.push_async_callback(asyncio.to_thread, server.stop)
    return started


async def _up(args: argparse.Namespace) -> int:
    extra = _trusted(args.trust)
    quiet = args.json
    agents = build_demo_agents((lambda _line: None) if quiet else _say, extra)
    async with AsyncExitStack() as stack:
        url = await _server(stack, args.nats)
        for agent in agents:
            await agent.start(url)
            stack.push_async_callback(agent.stop)
        if args.export_trust:
            exported = [public_key_json(a.public_key) for a in agents]
            text = json.dumps(exported, indent=2) + "\n"
            await asyncio.to_thread(Path(args.export_trust).write_text, text)
        described = [
            {
                "agent_id": a.agent_id,
                "intents": a.intents,
                "labels": a.labels,
                "public_key": a.public_key.b64,
                "kid": a.public_key.kid,
            }
            for a in agents
        ]
        if args.json:
            print(json.dumps({"nats_url": url, "agents": described}), flush=True)
        else:
            _say(f"intentbus up: NATS at {url}")
            for d in described:
                _say(
                    f"  {d['agent_id']:<12} intents={','.join(d['intents']) or '-'} kid={d['kid']}"
                )
            _say("Ctrl-C to stop.")
        await wait_for_signal()
    return 0


async def _request(args: argparse.Namespace) -> int:
    try:
        payload = json.loads(args.payload)
    except ValueError as exc:
        raise CliError(f"payload is not JSON: {exc}") from None
    validate_intent(args.intent)
    key = load_key(args.key)
    trust = _trusted(args.trust)
    if args.selector is not None:
        parse_selector(args.selector)  # bad input: exit 2 before connecting
    try:
        async with (
            await Bus.connect(args.nats, key=key, trust=trust) as bus,
            directory_for(bus, args.selector),
        ):
            reply = await bus.request(
                args.intent, payload, timeout=args.timeout, agent=args.agent, selector=args.selector
            )
    except RemoteError as exc:
        print(f"error {exc.code}: {exc.detail}", file=sys.stderr)
        return 1
    except (BusError, TimeoutError) as exc:
        hint = " (is the responder's key in --trust?)" if "unknown_signer" in str(exc) else ""
        print(f"intentbus: {type(exc).__name__}: {exc}{hint}", file=sys.stderr)
        return 1
    print(json.dumps(reply.payload))
    return 0


async def _demo(args: argparse.Namespace) -> int:
    _say("intentbus demo: starting NATS and three agents")
    agents = build_demo_agents(_say)
    async with AsyncExitStack() as stack:
        url = await _server(stack, args.nats)
        _say(f"  NATS at {url} (JetStream on; replay protection in KV)")
        for agent in agents:
            await agent.start(url)
            stack.push_async_callback(agent.stop)
            _say(f"  {agent.agent_id} up, serving {', '.join(agent.intents) or 'nothing'}")
        await run_scenario(agents[0], _say)
        await run_patterns(agents[0], _say)
    _say("demo done: every message above was signed, verified and replay-checked.")
    return 0


async def _agents(args: argparse.Namespace) -> int:
    try:
        return await run_agents(args, _trusted)
    except BusError as exc:
        if isinstance(exc, UsageError):
            raise
        print(f"intentbus: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def _pattern(run: Any) -> Any:
    async def command(args: argparse.Namespace) -> int:
        try:
            code: int = await run(args, _trusted)
            return code
        except ValueError as exc:  # bad JSON payload and the like: the caller's input
            raise CliError(str(exc)) from None
        except BusError as exc:
            if isinstance(exc, UsageError):
                raise
            print(f"intentbus: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1

    return command


_COMMANDS: dict[str, Any] = {
    "up": _up,
    "request": _request,
    "demo": _demo,
    "agents": _agents,
    "fanout": _pattern(run_fanout),
    "send": _pattern(run_send),
    "pending": _pattern(run_pending),
}
