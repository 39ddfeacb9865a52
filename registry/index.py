"""In-memory index of agent records: look-up by intent and label selector. Pure.

Look-ups are memoised per ``(intent, selector)``. A membership change (a record added
or removed, or its intents, labels or key changed) updates every memoised result it
concerns in place (a sorted insert or delete), instead of clearing them, so a fleet
with churn still answers repeated look-ups from memory. A heartbeat refreshes the
stored record in place and touches no result.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from bus.errors import NoExecutorError

from .record import AgentRecord
from .selector import Selector, parse_selector

__all__ = ["Index"]

MEMO_LIMIT = 512


def _by_id(record: AgentRecord) -> str:
    return record.agent_id


@dataclass(slots=True)
class _Result:
    selector: Selector
    members: list[AgentRecord]  # sorted by agent id
    frozen: tuple[AgentRecord, ...] | None = None


class Index:
    """Records by agent id, by intent and by ``(label, value)``."""

    def __init__(self) -> None:
        self.records: dict[str, AgentRecord] = {}
        self._by_intent: dict[str, set[str]] = {}
        self._by_label: dict[tuple[str, str], set[str]] = {}
        self._memo: dict[tuple[str, str], _Result] = {}
        self._turns: dict[tuple[str, str], itertools.count[int]] = {}
        self._last_used: dict[str, int] = {}
        self._uses = itertools.count(1)
        self.generation = 0

    def __len__(self) -> int:
        return len(self.records)

    def get(self, agent_id: str) -> AgentRecord | None:
        """The live record of ``agent_id``, or None."""
        return self.records.get(agent_id)

    def put(self, record: AgentRecord) -> None:
        """Insert or refresh ``record``."""
        old = self.records.get(record.agent_id)
        if old is not None and _same_membership(old, record):
            old.heartbeat_at, old.ttl_ms = record.heartbeat_at, record.ttl_ms
            old.signatures, old.card, old.version = record.signatures, record.card, record.version
            return
        if old is not None:
            self.remove(old.agent_id)
        self.records[record.agent_id] = record
        for intent in record.intents:
            self._by_intent.setdefault(intent, set()).add(record.agent_id)
        for pair in record.labels.items():
            self._by_label.setdefault(pair, set()).add(record.agent_id)
        for (intent, _), result in self._memo.items():
            if intent in record.intents and result.selector.matches(record.labels):
                bisect.insort(result.members, record, key=_by_id)
                result.frozen = None
        self.generation += 1

    def remove(self, agent_id: str) -> AgentRecord | None:
        """Drop ``agent_id``; returns the removed record."""
        record = self.records.pop(agent_id, None)
        if record is None:
            return None
        for intent in record.intents:
            _discard(self._by_intent, intent, agent_id)
        for pair in record.labels.items():
            _discard(self._by_label, pair, agent_id)
        self._last_used.pop(agent_id, None)
        for (intent, _), result in self._memo.items():
            if intent in record.intents and result.selector.matches(record.labels):
                i = bisect.bisect_left(result.members, agent_id, key=_by_id)
                if i < len(result.members) and result.members[i].agent_id == agent_id:
                    del result.members[i]
                    result.frozen = None
        self.generation += 1
        return record

    def forget_results(self) -> None:
        """Drop every memoised result (the next look-ups recompute them)."""
        self._memo.clear()

    def lookup(self, intent: str, selector: str | Selector = "") -> tuple[AgentRecord, ...]:
        """Live records serving ``intent`` whose labels match ``selector`` (sorted by id).

        Raises:
            InvalidSelectorError: ``selector`` does not parse.
        """
        sel = selector if isinstance(selector, Selector) else parse_selector(selector)
        result = self._memo.get((intent, sel.text))
        if result is None:
            if len(self._memo) >= MEMO_LIMIT:
                self._memo.clear()
            result = self._memo[(intent, sel.text)] = _Result(sel, self._compute(intent, sel))
        if result.frozen is None:
            result.frozen = tuple(result.members)
        return result.frozen

    def _compute(self, intent: str, sel: Selector) -> list[AgentRecord]:
        ids = self._by_intent.get(intent, set())
        for pair in sel.equalities():  # narrow with the index before filtering
            ids = ids & self._by_label.get(pair, set())
            if not ids:
                return []
        records = self.records
        return sorted((records[i] for i in ids if sel.matches(records[i].labels)), key=_by_id)

    def pick(self, intent: str, selector: str = "", policy: str = "round_robin") -> AgentRecord:
        """One executor for a request: ``round_robin`` over the matches, or ``lru``
        (the one picked least recently).

        Raises:
            NoExecutorError: nothing matches.
        """
        found = self.lookup(intent, selector)
        if not found:
            raise NoExecutorError(intent, selector)
        if policy == "lru":
            chosen = min(found, key=lambda r: self._last_used.get(r.agent_id, 0))
        else:
            turn = self._turns.setdefault((intent, selector), itertools.count())
            chosen = found[next(turn) % len(found)]
        self._last_used[chosen.agent_id] = next(self._uses)
        return chosen

    def pick_agent(self, intent: str, selector: str) -> str:
        """:meth:`pick`, returning the agent id (the bus's ``Directory`` interface)."""
        return self.pick(intent, selector).agent_id

    def responders(self, intent: str, selector: str = "") -> list[str]:
        """The whole expected responder set, for fan-out."""
        return [r.agent_id for r in self.lookup(intent, selector)]

    def all(self) -> Iterable[AgentRecord]:
        """Every live record."""
        return list(self.records.values())


def _same_membership(a: AgentRecord, b: AgentRecord) -> bool:
    return a.intents == b.intents and a.labels == b.labels and a.key == b.key


def _discard(
    index: dict[tuple[str, str], set[str]] | dict[str, set[str]], k: object, v: str
) -> None:
    members = index.get(k)  # type: ignore[call-overload]
    if members is not None:
        members.discard(v)
        if not members:
            del index[k]  # type: ignore[arg-type]
