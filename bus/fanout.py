"""Fan-out / fan-in: one signed request to many executors, replies gathered by policy.

One envelope is signed and published on ``<prefix>.fanout.<intent>``, which every
executor of the intent hears. When the expected responder set is known (from the
directory by selector, or given), it travels signed in the envelope's ``audience``:
others drop the request unanswered, and a reply from outside the set never counts.
Every reply is verified (signature, trust, ``in_reply_to``); one vote per agent.

Policies, all bounded by one absolute deadline:

* ``first``: the first ok reply that passes ``validator``;
* ``all``: every expected agent answered (ok or error); without an expected set, the
  deadline ends it;
* ``quorum:K``: K ok replies that pass ``validator``.

The gather ends as soon as its policy is decided (met, or impossible) and never later
than the deadline. A peer's failure is a line in the result, never an exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .context import new_trace, require_parent
from .envelope import Envelope, ErrorInfo
from .errors import UsageError
from .ids import new_id
from .signing import Sealer

if TYPE_CHECKING:
    from .bus import Bus

__all__ = ["FanOutReply", "FanOutResult", "Policy", "fan_out"]


@dataclass(frozen=True, slots=True)
class Policy:
    """When a gather is done: ``first``, ``all`` or ``quorum`` with ``k`` votes."""

    kind: str
    k: int = 1

    def __str__(self) -> str:
        return f"quorum:{self.k}" if self.kind == "quorum" else self.kind

    @classmethod
    def parse(cls, text: str | Policy) -> Policy:
        """``"first"``, ``"all"`` or ``"quorum:K"`` (K ≥ 1)."""
        if isinstance(text, Policy):
            return text
        if text in ("first", "all"):
            return cls(text)
        name, _, k = text.partition(":")
        if name == "quorum" and k.isdigit() and int(k) >= 1:
            return cls("quorum", int(k))
        raise UsageError(f"policy must be first, all or quorum:K, not {text!r}")


@dataclass(frozen=True, slots=True)
class FanOutReply:
    """One verified reply: ``error`` None means ok."""

    agent_id: str
    envelope: Envelope
    valid: bool

    @property
    def payload(self) -> Any:
        """The reply's payload."""
        return self.envelope.payload

    @property
    def error(self) -> ErrorInfo | None:
        """The error of an error reply."""
        return self.envelope.error


@dataclass
class FanOutResult:
    """What a gather saw. ``partial``: the deadline ended it with expected agents missing."""

    intent: str
    request: Envelope
    policy: Policy
    expected: list[str] | None
    replies: list[FanOutReply] = field(default_factory=list)
    satisfied: bool = False
    partial: bool = False
    no_responders: bool = False
    value: Any = None

    @property
    def ok(self) -> list[FanOutReply]:
        """Ok replies that passed the validator, in arrival order."""
        return [r for r in self.replies if r.error is None and r.valid]

    @property
    def errors(self) -> dict[str, ErrorInfo]:
        """agent id -> the error it answered with."""
        return {r.agent_id: r.error for r in self.replies if r.error is not None}

    @property
    def invalid(self) -> list[str]:
        """Agents whose ok reply the validator rejected."""
        return [r.agent_id for r in self.replies if r.error is None and not r.valid]

    @property
    def missing(self) -> list[str]:
        """Expected agents that did not answer before the end."""
        answered = {r.agent_id for r in self.replies}
        return [a for a in self.expected or [] if a not in answered]

    def seal(self, sealer: Sealer, now_ms: int, ttl_ms: int = 60_000) -> tuple[Envelope, bytes]:
        """One signed aggregate envelope (kind ``event``, intent ``<intent>.gathered``):
        ``value`` plus each counted reply's message id, key id and signature, so a
        downstream agent can check what the aggregate was built from."""
        sources = [
            {
                "agent_id": r.agent_id,
                "message_id": r.envelope.message_id,
                "kid": r.envelope.signature.kid if r.envelope.signature else "",
                "sig": r.envelope.signature.sig if r.envelope.signature else "",
                "status": r.envelope.status,
            }
            for r in self.replies
        ]
        payload = {
            "value": self.value,
            "policy": self.policy.kind
            if self.policy.kind != "quorum"
            else f"quorum:{self.policy.k}",
            "satisfied": self.satisfied,
            "partial": self.partial,
            "missing": self.missing,
            "sources": sources,
        }
        return sealer.seal(
            kind="event",
            intent=f"{self.intent}.gathered",
            payload=payload,
            correlation_id=self.request.correlation_id,
            trace=new_trace(self.request.trace),
            created_at=now_ms,
            expires_at=now_ms + ttl_ms,
        )


class _Gather:
    """Counts as replies arrive, so each decision is O(1), not a pass over the replies."""

    def __init__(self, result: FanOutResult, validator: Callable[[Any], bool] | None) -> None:
        self.result, self.validator = result, validator
        self.done = asyncio.Event()
        self.good = 0
        self.left = None if result.expected is None else len(result.expected)

    def collect(self, reply: Envelope | None) -> None:
        result = self.result
        if reply is None:
            result.no_responders = True
            self.done.set()
            return
        if reply.error is not None and reply.error.code == "deadline_exceeded":
            return  # its handler ran out of time at our deadline: it did not answer
        check = self.validator
        valid = reply.error is None and (check is None or _safe(check, reply.payload))
        result.replies.append(FanOutReply(reply.sender.agent_id, reply, valid))
        self.good += valid
        if self.left is not None:
            self.left -= 1  # the inbox admits only audience members, one reply each
        if self._decided():
            self.done.set()

    def _decided(self) -> bool:
        result, policy, good, left = self.result, self.result.policy, self.good, self.left
        if policy.kind == "first":
            result.satisfied = good >= 1
            return result.satisfied or left == 0
        if policy.kind == "quorum":
            result.satisfied = good >= policy.k
            return result.satisfied or (left is not None and good + left < policy.k)
        result.satisfied = left == 0
        return result.satisfied


def _safe(validator: Callable[[Any], bool], payload: Any) -> bool:
    try:
        return bool(validator(payload))
    except Exception:  # a validator that raises rejects the reply, it does not crash the gather
        return False


async def fan_out(
    bus: Bus,
    intent: str,
    payload: Any,
    *,
    selector: str | None = None,
    agents: list[str] | None = None,
    policy: str | Policy = "all",
    validator: Callable[[Any], bool] | None = None,
    aggregate: Callable[[list[FanOutReply]], Any] | None = None,
    timeout: float | None = None,
    deadline_ms: int | None = None,
    parent: Envelope | None = None,
) -> FanOutResult:
    """Scatter ``payload`` to the executors of ``intent`` and gather (see module doc).

    Args:
        selector: label selector; the directory gives the expected responder set.
        agents: an explicit expected set (instead of ``selector``).
        policy: ``first``, ``all`` or ``quorum:K``.
        validator: ``payload -> bool``; an ok reply it rejects does not count.
        aggregate: ``replies -> value``, called once at the end (default: the first ok
            payload for ``first``, the list of ok payloads otherwise).

    Raises:
        UsageError, InvalidSelectorError: bad arguments. Peers' failures never raise.
    """
    pol = Policy.parse(policy)
    bus._check_open()
    if selector is not None and agents is not None:
        raise UsageError("give selector= or agents=, not both")
    expected = agents
    if selector is not None:
        if bus.directory is None:
            raise UsageError("selector= needs a directory: attach a registry to bus.directory")
        expected = bus.directory.responders(intent, selector)
    parent = require_parent(parent)
    now = bus.now_ms()
    expires = now + int((bus.default_timeout if timeout is None else timeout) * 1000)
    if deadline_ms is not None:
        expires = min(expires, deadline_ms)
    if parent is not None:
        expires = min(expires, parent.expires_at)
    reply_subject = bus._inbox.reply_subject()
    request, body = bus._sealer.seal(
        kind="request",
        intent=intent,
        payload=payload,
        correlation_id=parent.correlation_id if parent else new_id(),
        trace=new_trace(parent.trace if parent else None),
        created_at=now,
        expires_at=expires,
        reply_to=reply_subject,
        audience=None if expected is None else tuple(sorted(set(expected))),
    )
    result = FanOutResult(intent, request, pol, None if expected is None else sorted(set(expected)))
    gather = _Gather(result, validator)
    if expected is not None and not expected:
        result.no_responders = True
        return _finish(result, aggregate)
    bus._inbox.expect_many(reply_subject, bus.subjects.fanout(intent), request, gather.collect)
    try:
        await bus.transport.publish(bus.subjects.fanout(intent), body, reply=reply_subject)
        try:
            async with asyncio.timeout(max(0.0, (expires - now) / 1000)):
                await gather.done.wait()
        except TimeoutError:
            if expected is None and pol.kind == "all":  # nobody to wait for but the clock
                result.satisfied = bool(result.replies)
            result.partial = bool(result.missing)
    finally:
        bus._inbox.forget(reply_subject)
    return _finish(result, aggregate)


def _finish(
    result: FanOutResult, aggregate: Callable[[list[FanOutReply]], Any] | None
) -> FanOutResult:
    if aggregate is not None:
        result.value = aggregate(result.ok)
    elif result.policy.kind == "first":
        result.value = result.ok[0].payload if result.ok else None
    else:
        result.value = [r.payload for r in result.ok]
    return result
