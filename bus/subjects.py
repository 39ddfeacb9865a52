"""Intent and agent-id grammar, and the NATS subject scheme built from them.

Grammar (validated with an error that points at the offending position):

* an **intent** is one to eight dot-separated tokens, each ``[a-z][a-z0-9_-]*``,
  at most 128 characters in all: ``task.execute``, ``facts.lookup``, ``demo.echo``;
* an **agent id** is ``[A-Za-z0-9][A-Za-z0-9_-]*``, at most 64 characters (no dots,
  so it is exactly one subject token).

Subjects, with the default prefix ``ib`` (see docs/ENVELOPE.md §Subjects):

* ``ib.intent.<intent>``: any executor of the intent; executors share the queue
  group ``<intent>`` so each request reaches exactly one of them;
* ``ib.agent.<agent_id>.<intent>``: one specific agent; every agent subscribes to
  ``ib.agent.<agent_id>.>`` without a queue group;
* ``ib.fanout.<intent>``: scatter-gather; every executor of the intent hears it (no
  queue group), and the envelope's ``audience`` says which of them should answer;
* ``ib.event.<intent>``: events published without a reply (every subscriber gets one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from .errors import InvalidIntentError

__all__ = ["SubjectScheme", "validate_agent_id", "validate_intent"]

_TOKEN = re.compile(r"[a-z][a-z0-9_-]*")
_AGENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
MAX_INTENT = 128
MAX_TOKENS = 8


@lru_cache(maxsize=4096)
def validate_intent(intent: str) -> str:
    """Return ``intent`` if it follows the grammar.

    Raises:
        InvalidIntentError: with ``position`` set to the first offending character.
    """
    if not isinstance(intent, str) or not intent:
        raise InvalidIntentError("intent must be a non-empty string", value=str(intent), position=0)
    if len(intent) > MAX_INTENT:
        raise InvalidIntentError(
            f"intent is {len(intent)} characters; at most {MAX_INTENT}",
            value=intent,
            position=MAX_INTENT,
        )
    tokens = intent.split(".")
    if len(tokens) > MAX_TOKENS:
        raise InvalidIntentError(
            f"intent has {len(tokens)} tokens; at most {MAX_TOKENS}", value=intent, position=0
        )
    pos = 0
    for token in tokens:
        m = _TOKEN.match(token)
        end = m.end() if m else 0
        if not token or end != len(token):
            bad = intent[pos + end] if pos + end < len(intent) else "end of token"
            raise InvalidIntentError(
                f"invalid intent {intent!r} at position {pos + end} ({bad!r}): tokens are "
                "dot-separated, start with a-z and contain only a-z, 0-9, '_' and '-'",
                value=intent,
                position=pos + end,
            )
        pos += len(token) + 1
    return intent


@lru_cache(maxsize=4096)
def validate_agent_id(agent_id: str) -> str:
    """Return ``agent_id`` if it follows the grammar; raise InvalidIntentError otherwise."""
    if not isinstance(agent_id, str) or _AGENT.fullmatch(agent_id) is None:
        m = _AGENT.match(agent_id) if isinstance(agent_id, str) else None
        pos = m.end() if m else 0
        raise InvalidIntentError(
            f"invalid agent id {agent_id!r} at position {pos}: 1-64 characters of "
            "A-Z, a-z, 0-9, '_' and '-', not starting with '_' or '-'",
            value=str(agent_id),
            position=pos,
        )
    return agent_id


@dataclass(frozen=True, slots=True)
class SubjectScheme:
    """Builds subjects under one prefix; results are cached per intent.

    Args:
        prefix: first subject token(s); lets several fleets share one NATS account.
    """

    prefix: str = "ib"

    def intent(self, intent: str) -> str:
        """Subject that reaches one executor of ``intent`` (via its queue group)."""
        return _join(self.prefix, "intent", validate_intent(intent))

    def queue_group(self, intent: str) -> str:
        """Queue group shared by every executor of ``intent``."""
        return validate_intent(intent)

    def agent(self, agent_id: str, intent: str) -> str:
        """Subject that reaches the single agent ``agent_id`` for ``intent``."""
        return _join(self.prefix, "agent", validate_agent_id(agent_id), validate_intent(intent))

    def agent_wildcard(self, agent_id: str) -> str:
        """Subscription that receives everything addressed to ``agent_id``."""
        return _join(self.prefix, "agent", validate_agent_id(agent_id), ">")

    def fanout(self, intent: str) -> str:
        """Subject every executor of ``intent`` hears (no queue group): scatter-gather."""
        return _join(self.prefix, "fanout", validate_intent(intent))

    def durable(self, intent: str) -> str:
        """Subject of async requests of ``intent``, kept in a stream until done."""
        return _join(self.prefix, "durable", validate_intent(intent))

    def results(self, agent_id: str) -> str:
        """Where async results for ``agent_id`` wait (in a stream) until it reads them."""
        return _join(self.prefix, "results", validate_agent_id(agent_id))

    def event(self, intent: str) -> str:
        """Subject for events of ``intent`` (published without reply)."""
        return _join(self.prefix, "event", validate_intent(intent))


@lru_cache(maxsize=8192)
def _join(*tokens: str) -> str:
    return ".".join(tokens)
