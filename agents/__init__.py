"""intentbus agents: the runtime authors use, the demo ensemble and the CLI.

* :class:`Agent`: declare intents (``@agent.handles``) and labels, then ``start``,
  ``run`` or ``stop``; embedded NATS when no URL is given;
* :mod:`agents.demo`: the planner/executor/facts ensemble behind ``make run``;
* :mod:`agents.cli`: the ``intentbus`` command, the composition root.
"""

from .agent import Agent

__all__ = ["Agent"]
