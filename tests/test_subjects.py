"""Intent and agent-id grammar, and the subject scheme."""

from __future__ import annotations

import pytest

from bus import InvalidIntentError, SubjectScheme
from bus.subjects import validate_agent_id, validate_intent
from bus.transport.memory import subject_matches


@pytest.mark.parametrize(
    "intent", ["demo.echo", "task.execute", "a", "facts.look-up_2", "a.b.c.d.e.f.g.h"]
)
def test_valid_intents(intent: str) -> None:
    assert validate_intent(intent) == intent


@pytest.mark.parametrize(
    ("intent", "position"),
    [
        ("Task.execute", 0),
        ("task..execute", 5),
        ("task.", 5),
        (".task", 0),
        ("task.exe cute", 8),
        ("task.*", 5),
        ("task.>", 5),
        ("task.1go", 5),
        ("", 0),
    ],
)
def test_invalid_intents_point_at_the_fault(intent: str, position: int) -> None:
    with pytest.raises(InvalidIntentError) as info:
        validate_intent(intent)
    assert info.value.position == position
    assert isinstance(info.value, ValueError)


def test_too_long_or_too_deep() -> None:
    with pytest.raises(InvalidIntentError, match="at most 128"):
        validate_intent("a" * 129)
    with pytest.raises(InvalidIntentError, match="at most 8"):
        validate_intent(".".join("a" * 9))


@pytest.mark.parametrize("bad", ["", "-x", "a.b", "a b", "x" * 65, "ü"])
def test_invalid_agent_ids(bad: str) -> None:
    with pytest.raises(InvalidIntentError, match="invalid agent id"):
        validate_agent_id(bad)


def test_subject_scheme() -> None:
    s = SubjectScheme()
    assert s.intent("task.execute") == "ib.intent.task.execute"
    assert s.queue_group("task.execute") == "task.execute"
    assert s.agent("executor-1", "task.execute") == "ib.agent.executor-1.task.execute"
    assert subject_matches(s.agent_wildcard("executor-1"), s.agent("executor-1", "task.execute"))
    assert not subject_matches(
        s.agent_wildcard("executor-1"), s.agent("executor-2", "task.execute")
    )
    assert SubjectScheme("fleet-a").event("x.y") == "fleet-a.event.x.y"


@pytest.mark.parametrize(
    ("pattern", "subject", "match"),
    [
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.>", "a.b.c", True),
        ("a.>", "a", False),
        ("*.b", "a.b", True),
        ("a.b", "a.b", True),
        ("a.b", "a.c", False),
    ],
)
def test_memory_wildcards_match_nats_rules(pattern: str, subject: str, match: bool) -> None:
    assert subject_matches(pattern, subject) is match
