"""Label selectors: Kubernetes grammar and semantics, including property-based checks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bus import InvalidSelectorError
from registry.selector import parse_selector

LABELS = {"framework": "hermes", "env": "prod", "region": "eu", "tier": "gold"}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("", True),
        ("env=prod", True),
        ("env==prod", True),
        ("env = prod , framework=hermes", True),
        ("env=dev", False),
        ("env!=dev", True),
        ("missing!=x", True),
        ("env in (dev, prod)", True),
        ("env in (dev)", False),
        ("env notin (dev, qa)", True),
        ("missing notin (a)", True),
        ("env notin (prod)", False),
        ("region", True),
        ("missing", False),
        ("!missing", True),
        ("!region", False),
        ("framework=hermes,env=prod,!canary,tier in (gold,silver)", True),
        ("framework=hermes,env=dev", False),
    ],
)
def test_semantics(selector: str, expected: bool) -> None:
    assert parse_selector(selector).matches(LABELS) is expected


@pytest.mark.parametrize(
    ("selector", "position"),
    [
        ("env=prod,", 9),
        ("env prod", 4),
        ("=prod", 0),
        ("env in prod", 7),
        ("env in (a b)", 10),
        ("env=pr od", 7),
        ("!", 1),
        ("env=prod)", 8),
        ("env=-x", 4),
        ("env in (a,", 10),
        ("a,,b", 2),
        ("k" * 64 + "=v", 0),
    ],
)
def test_malformed_selectors_point_at_the_offending_position(selector: str, position: int) -> None:
    with pytest.raises(InvalidSelectorError) as info:
        parse_selector(selector)
    assert info.value.position == position
    assert isinstance(info.value, ValueError)
    assert "^" in str(info.value)


names = st.sampled_from(["env", "framework", "region", "tier", "app.kubernetes.io/name"])
values = st.sampled_from(["prod", "dev", "eu", "us", "hermes", "gold"])
label_sets = st.dictionaries(names, values, max_size=5)


@st.composite
def requirements(draw: st.DrawFn) -> tuple[str, object]:
    key = draw(names)
    kind = draw(st.sampled_from(["=", "==", "!=", "in", "notin", "exists", "!exists"]))
    if kind in ("=", "==", "!="):
        v = draw(values)
        return f"{key}{kind}{v}", (key, kind, {v})
    if kind in ("in", "notin"):
        vs = draw(st.lists(values, min_size=1, max_size=3))
        return f"{key} {kind} ({', '.join(vs)})", (key, kind, set(vs))
    return (key if kind == "exists" else f"!{key}"), (key, kind, set())


def reference(labels: dict[str, str], clauses: list[tuple[str, str, set[str]]]) -> bool:
    for key, kind, vs in clauses:
        present, value = key in labels, labels.get(key)
        ok = {
            "=": present and value in vs,
            "==": present and value in vs,
            "in": present and value in vs,
            "!=": not present or value not in vs,
            "notin": not present or value not in vs,
            "exists": present,
            "!exists": not present,
        }[kind]
        if not ok:
            return False
    return True


@settings(max_examples=300, deadline=None)
@given(st.lists(requirements(), max_size=4), label_sets)
def test_matches_the_reference_semantics(
    reqs: list[tuple[str, object]], labels: dict[str, str]
) -> None:
    text = ",".join(r[0] for r in reqs)
    clauses = [r[1] for r in reqs]
    assert parse_selector(text).matches(labels) is reference(labels, clauses)  # type: ignore[arg-type]
