"""Delivering async results: to a bus subject (kept in a stream) or an HTTP(S) URL.

* A bus ``reply_to`` under ``<prefix>.results.`` is published into the results stream
  with ``Nats-Msg-Id`` = ``<request id>:<status>``, so a re-delivery of the same outcome
  (after an executor restart) is stored once, and it waits there until the requester
  reads it, even across the requester's restarts.
* An HTTP(S) ``reply_to`` gets a POST of the signed envelope (``application/json``),
  retried with exponential backoff on connection errors and 5xx/429 answers. A callback
  that finally fails is recorded in the KV bucket ``intentbus_dead_letters`` (key: the
  request id), never dropped silently.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import httpx
import orjson

from .errors import TransportError
from .transport.base import KeyValue, Transport

__all__ = ["DEAD_LETTERS_BUCKET", "CallbackPolicy", "Deliverer"]

log = logging.getLogger("intentbus.callbacks")
DEAD_LETTERS_BUCKET = "intentbus_dead_letters"


@dataclass(frozen=True, slots=True)
class CallbackPolicy:
    """HTTP callback retries: ``attempts`` in all, backoff doubling from ``base`` to ``cap``."""

    attempts: int = 6
    base: float = 0.2
    cap: float = 10.0
    timeout: float = 10.0


class Deliverer:
    """Sends sealed result envelopes to where their request asked.

    Args:
        transport: for bus subjects.
        results_prefix: subjects under it go to the results stream.
        dead_letters: where failed callbacks are recorded.
        policy: HTTP retry policy.
    """

    def __init__(
        self,
        transport: Transport,
        results_prefix: str,
        dead_letters: KeyValue,
        policy: CallbackPolicy | None = None,
    ) -> None:
        self._transport, self._results_prefix = transport, results_prefix
        self._dead, self.policy = dead_letters, policy or CallbackPolicy()
        self._http = httpx.AsyncClient(timeout=self.policy.timeout)
        self.attempts = 0

    async def deliver(self, reply_to: str, body: bytes, dedupe_id: str, request_id: str) -> bool:
        """Deliver ``body``; False when it could not be (and was recorded as failed).

        Raises:
            TransportError: a bus subject could not be published to (the caller keeps the
                request unacknowledged, so it is tried again).
        """
        if reply_to.startswith(("http://", "https://")):
            return await self._post(reply_to, body, request_id)
        if reply_to.startswith(self._results_prefix):
            await self._transport.publish_durable(reply_to, body, msg_id=dedupe_id)
        else:
            await self._transport.publish(reply_to, body)
        return True

    async def _post(self, url: str, body: bytes, request_id: str) -> bool:
        policy, last = self.policy, ""
        for attempt in range(1, policy.attempts + 1):
            self.attempts += 1
            try:
                response = await self._http.post(
                    url, content=body, headers={"content-type": "application/json"}
                )
                if response.status_code < 300:
                    return True
                last = f"HTTP {response.status_code}"
                if response.status_code < 500 and response.status_code != 429:
                    break  # the endpoint refuses it: retrying will not help
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            if attempt < policy.attempts:
                await asyncio.sleep(min(policy.cap, policy.base * 2 ** (attempt - 1)))
        await self._record_failure(url, body, request_id, last)
        return False

    async def _record_failure(self, url: str, body: bytes, request_id: str, reason: str) -> None:
        log.error("callback to %s for %s failed for good: %s", url, request_id, reason)
        entry = {"request_id": request_id, "url": url, "reason": reason,
                 "failed_at": int(time.time() * 1000), "envelope": body.decode()}  # fmt: skip
        try:
            await self._dead.put(request_id, orjson.dumps(entry))
        except TransportError as exc:  # nowhere left to record it: say so loudly
            log.critical("could not record the failed callback of %s: %s", request_id, exc)

    async def close(self) -> None:
        """Close the HTTP client."""
        await self._http.aclose()
