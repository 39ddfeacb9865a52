"""Identifiers: message ids, trace ids and span ids, cheap enough for the hot path.

* message ids are a per-process random prefix (80 bits) plus a counter: unique without
  a system call per message (``os.urandom`` costs a syscall each time);
* trace and span ids are random (W3C Trace Context asks for randomness), drawn from a
  per-process generator seeded from the OS.

Both are re-seeded in a child after ``fork``, so forked workers never share ids.
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Callable

__all__ = ["new_id", "new_span_id", "new_trace_id"]


def _reseed() -> None:
    global _prefix, _counter, _rand
    _prefix = os.urandom(10).hex()
    _counter = itertools.count(1)
    _rand = random.Random(os.urandom(32)).getrandbits


_prefix: str
_counter: itertools.count[int]
_rand: Callable[[int], int]
_reseed()
os.register_at_fork(after_in_child=_reseed)


def new_id() -> str:
    """A fresh message id: 32 lowercase hex characters, unique per process and fork."""
    return f"{_prefix}{next(_counter):012x}"


def new_trace_id() -> str:
    """A random, non-zero 128-bit W3C trace id (32 hex characters)."""
    return f"{_rand(128) or 1:032x}"


def new_span_id() -> str:
    """A random, non-zero 64-bit W3C span id (16 hex characters)."""
    return f"{_rand(64) or 1:016x}"
