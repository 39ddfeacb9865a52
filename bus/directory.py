"""The look-up interface the bus needs; the registry implements it.

The bus never imports the registry: the composition root (the agent runtime or the
CLI) plugs a registry into ``Bus.directory``. Contract: answers come from memory (no
I/O on the request path), and a pick never returns an agent the caller's trust
policy would refuse.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Directory"]


class Directory(Protocol):
    """Who serves an intent under a label selector."""

    def pick_agent(self, intent: str, selector: str) -> str:
        """The agent id of one live executor of ``intent`` matching ``selector``.

        Raises:
            NoExecutorError: nothing matches.
            InvalidSelectorError: ``selector`` does not parse.
        """
        ...

    def responders(self, intent: str, selector: str = "") -> list[str]:
        """Every live executor of ``intent`` matching ``selector`` (for fan-out)."""
        ...
