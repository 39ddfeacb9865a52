"""The in-memory index: memoised results stay exact through any sequence of changes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bus import KeyPair, NoExecutorError
from registry import AgentRecord, Index, parse_selector

KEY = KeyPair.from_seed("k", b"\x07" * 32).public
SELECTORS = ["", "env=prod", "env!=prod,gpu", "region in (eu,us),!gpu", "env notin (dev)"]


def record(agent: int, env: str, region: str, gpu: bool, intents: tuple[str, ...]) -> AgentRecord:
    labels = {"env": env, "region": region} | ({"gpu": "yes"} if gpu else {})
    return AgentRecord(f"a{agent}", intents, labels, KEY, {}, "0", 0, 0, 1000)


ops = st.lists(
    st.tuples(
        st.sampled_from(["put", "remove", "lookup"]),
        st.integers(0, 12),
        st.sampled_from(["prod", "dev"]),
        st.sampled_from(["eu", "us", "ap"]),
        st.booleans(),
        st.sampled_from([("x.run",), ("x.run", "y.get"), ("y.get",)]),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_results_match_brute_force_after_every_change(steps: list[tuple]) -> None:  # type: ignore[type-arg]
    index, truth = Index(), {}
    for op, agent, env, region, gpu, intents in steps:
        if op == "put":
            r = record(agent, env, region, gpu, intents)
            index.put(r)
            truth[r.agent_id] = r
        elif op == "remove":
            index.remove(f"a{agent}")
            truth.pop(f"a{agent}", None)
        for intent in ("x.run", "y.get"):
            for text in SELECTORS:
                sel = parse_selector(text)
                expected = sorted(
                    a for a, r in truth.items() if intent in r.intents and sel.matches(r.labels)
                )
                assert [r.agent_id for r in index.lookup(intent, text)] == expected


def test_pick_policies() -> None:
    index = Index()
    for i in range(3):
        index.put(record(i, "prod", "eu", False, ("x.run",)))
    assert [index.pick("x.run", "env=prod").agent_id for _ in range(6)] == ["a0", "a1", "a2"] * 2
    index.pick("x.run", policy="lru")
    assert index.pick("x.run", policy="lru").agent_id in {"a0", "a1", "a2"}
    used = [index.pick("x.run", policy="lru").agent_id for _ in range(3)]
    assert sorted(used) == ["a0", "a1", "a2"]  # least recently used rotates through all
    assert index.responders("x.run", "env=prod") == ["a0", "a1", "a2"]
    try:
        index.pick("x.run", "env=dev")
    except NoExecutorError as exc:
        assert exc.intent == "x.run" and exc.selector == "env=dev"
    else:
        raise AssertionError("expected NoExecutorError")
