"""Human (or agent) review of parked async requests: list, approve, decline.

A handler that raises :class:`~bus.context.PendingReview` parks its request in the KV
bucket ``intentbus_pending`` and the requester hears ``pending_review``. A reviewer's
decision is a signed request ``review.<intent>`` that reaches an executor of that intent:
on *approve* it runs the handler again with ``ctx.review.approved`` and delivers the
result through the request's callback; on *decline* it delivers the error
``review.declined``. Who may decide: ``reviewers`` (agent ids), or any trusted agent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from .context import Context, HandlerError, Review
from .envelope import Envelope, ErrorInfo
from .errors import EnvelopeRejected, UsageError
from .transport.base import KeyValue

if TYPE_CHECKING:
    from .bus import Bus
    from .durable import DurableExecutor
    from .receive import Handler

__all__ = ["decide", "list_pending", "review_handler"]


def review_intent(intent: str) -> str:
    """The intent a decision about ``intent`` travels as."""
    return f"review.{intent}"


def review_handler(
    executor: DurableExecutor, intent: str, handler: Handler, reviewers: set[str] | None
) -> Handler:
    """The handler of ``review.<intent>`` on an executor of ``intent``."""

    async def decide_here(payload: Any, ctx: Context) -> Any:
        if reviewers is not None and ctx.sender not in reviewers:
            raise HandlerError("review.forbidden", f"{ctx.sender} may not review {intent}")
        if not isinstance(payload, dict) or payload.get("decision") not in ("approve", "decline"):
            raise HandlerError("bad_request", "payload: {request_id, decision: approve|decline}")
        request_id, note = str(payload.get("request_id")), str(payload.get("note", ""))
        raw = await executor.pending.get(request_id)
        if raw is None:
            raise HandlerError("review.unknown", f"no parked request {request_id}")
        entry = orjson.loads(raw)
        try:
            env = executor._verifier.verify(
                entry["envelope"].encode(), ctx.bus.now_ms(), ("request",)
            )
        except EnvelopeRejected as exc:
            raise HandlerError(
                "review.stale", f"the parked request no longer verifies: {exc}"
            ) from None
        if env.intent != intent or entry.get("intent") != intent or env.message_id != request_id:
            raise HandlerError("review.mismatch", f"{request_id} is not a parked {intent} request")
        key = executor.key_of(env)
        lease = ctx.bus.now_ms() + int(executor.config.lease * 1000)
        owner = await executor._idem.take_parked(key, lease)
        if owner is None:
            raise HandlerError("review.in_progress", f"{request_id} is being decided already")
        approved = payload["decision"] == "approve"
        if approved:
            review = Review(True, ctx.sender, note)
            state = await executor._execute(None, env, key, handler, review, owner)
        else:
            reason = note or f"declined by {ctx.sender}"
            await executor._finish(None, env, key, None, ErrorInfo("review.declined", reason))
            state = "done"
        if state == "done":
            await executor.pending.delete(request_id)
        return {"request_id": request_id, "decision": payload["decision"], "state": state}

    return decide_here


async def list_pending(pending: KeyValue) -> list[dict[str, Any]]:
    """Every parked request (a snapshot of the bucket), oldest first."""
    watch = await pending.watch()
    entries = []
    try:
        async for event in watch:
            if event is None:
                break
            if event.value is not None:
                entries.append(orjson.loads(event.value))
    finally:
        await watch.stop()
    return sorted(entries, key=lambda e: e.get("parked_at", 0))


async def decide(
    bus: Bus, pending: KeyValue, request_id: str, approve: bool, note: str = ""
) -> Envelope:
    """Send a reviewer's decision about a parked request; returns the executor's reply."""
    raw = await pending.get(request_id)
    if raw is None:
        raise UsageError(f"no parked request {request_id!r}")
    intent = orjson.loads(raw)["intent"]
    decision = {
        "request_id": request_id,
        "decision": "approve" if approve else "decline",
        "note": note,
    }
    return await bus.request(review_intent(intent), decision, retry=1)
