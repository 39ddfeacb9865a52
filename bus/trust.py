"""The trust store: whose public keys are accepted, each bound to one agent id.

A key may sign only as the agent it is bound to; a second key for the same agent
(rotation) is allowed. Listeners hear every change, so a cache (or the registry's
trust feed) can follow. Pure: no I/O; loading ``.pub`` files lives in ``keyfile``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from .keys import PublicKey

__all__ = ["TrustStore"]

Listener = Callable[[str, PublicKey], None]


class TrustStore:
    """An allowlist of ``kid -> PublicKey``.

    Not thread-safe; use it from the event loop that owns the bus.
    """

    def __init__(self, keys: Iterable[PublicKey] = ()) -> None:
        self._by_kid: dict[str, PublicKey] = {}
        self._listeners: list[Listener] = []
        for key in keys:
            self.add(key)

    def add(self, key: PublicKey) -> None:
        """Trust ``key`` for its agent id (idempotent)."""
        if self._by_kid.get(key.kid) == key:
            return
        self._by_kid[key.kid] = key
        self._notify("added", key)

    def remove(self, kid: str) -> PublicKey | None:
        """Stop trusting the key ``kid``; envelopes it signs are refused from now on."""
        key = self._by_kid.pop(kid, None)
        if key is not None:
            self._notify("removed", key)
        return key

    def revoke_agent(self, agent_id: str) -> list[PublicKey]:
        """Stop trusting every key of ``agent_id``; return the removed keys."""
        gone = [k for k in self._by_kid.values() if k.agent_id == agent_id]
        for key in gone:
            self.remove(key.kid)
        return gone

    def get(self, kid: str) -> PublicKey | None:
        """The trusted key with this id, or None."""
        return self._by_kid.get(kid)

    def keys_of(self, agent_id: str) -> list[PublicKey]:
        """Every trusted key bound to ``agent_id``."""
        return [k for k in self._by_kid.values() if k.agent_id == agent_id]

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(event, key)`` on each change; returns an unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _notify(self, event: str, key: PublicKey) -> None:
        for listener in list(self._listeners):
            listener(event, key)

    def __contains__(self, kid: object) -> bool:
        return kid in self._by_kid

    def __iter__(self) -> Iterator[PublicKey]:
        return iter(list(self._by_kid.values()))

    def __len__(self) -> int:
        return len(self._by_kid)
