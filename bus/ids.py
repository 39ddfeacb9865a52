"""Identifiers: message ids, trace ids and span ids, cheap enough for the hot path.

All are 128 or 64 random bits from a per-process generator seeded from the OS (an
``os.urandom`` call per id costs a system call each time). Ids need uniqueness, not
secrecy: envelopes are signed, and replay keys include the sender. The generator is
re-seeded in a child after ``fork``, so forked workers never share ids.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable

__all__ = ["new_id", "new_span_id", "new_trace_id"]


def _reseed() -> None:
    global _rand
    _rand = random.Random(os.urandom(32)).getrandbits


_rand: Callable[[int], int]
_reseed()
os.register_at_fork(after_in_child=_reseed)


def new_id() -> str:
    """A fresh message id: 32 lowercase hex characters (128 random bits)."""
    return f"{_rand(128):032x}"


def new_trace_id() -> str:
    """A random, non-zero 128-bit W3C trace id (32 hex characters)."""
    return f"{_rand(128) or 1:032x}"


def new_span_id() -> str:
    """A random, non-zero 64-bit W3C span id (16 hex characters)."""
    return f"{_rand(64) or 1:016x}"
