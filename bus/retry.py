"""Retries for request/reply: which failures, how often, how long to wait. Pure.

Only failures that say nothing was answered are retried: *no responders* and a
*deadline* (no reply in time). A refusal (signature, trust, recipient...) or an error
reply is an answer, and is never retried. Every attempt carries the same idempotency
key, so an executor that already ran the request answers from its cache instead of
running it again.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .errors import DeadlineExceeded, NoRespondersError

__all__ = ["CALL_TIMEOUTS", "RetryPolicy", "is_retryable"]

#: Default per-attempt timeouts by kind of call (seconds).
CALL_TIMEOUTS = {"skill": 30.0, "conversation": 60.0, "long": 120.0}


def is_retryable(exc: BaseException) -> bool:
    """True for failures where no executor answered (no responders, deadline)."""
    return isinstance(exc, (NoRespondersError, DeadlineExceeded))


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with full jitter.

    Attributes:
        attempts: total attempts, the first included (1 disables retries).
        base: the first backoff ceiling, seconds; doubles per attempt.
        cap: the largest backoff ceiling, seconds.
    """

    attempts: int = 3
    base: float = 0.05
    cap: float = 2.0

    def backoff(self, attempt: int, rand: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        ceiling = min(self.cap, self.base * 2 ** (attempt - 1))
        return (rand or random).uniform(0, ceiling)


NO_RETRIES = RetryPolicy(attempts=1)
