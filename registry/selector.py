"""Kubernetes label selectors: parse once, match many. Pure.

Grammar (comma = AND; white space around tokens is ignored)::

    selector    := "" | requirement ("," requirement)*
    requirement := key ("=" | "==" | "!=") value
                 | key ("in" | "notin") "(" value ("," value)* ")"
                 | key            (the label exists)
                 | "!" key        (the label is absent)

Keys are ``[prefix/]name`` and values are ``name`` or empty, where ``name`` is at most
63 characters of ``[A-Za-z0-9._-]`` starting and ending alphanumeric (``prefix`` is a
DNS subdomain). ``k!=v`` and ``k notin (...)`` also match when ``k`` is absent, as in
Kubernetes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import NoReturn

from bus.errors import InvalidSelectorError

__all__ = ["Requirement", "Selector", "parse_selector"]

_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"(?:[a-z0-9](?:[a-z0-9.-]{{0,251}}[a-z0-9])?/)?{_NAME}")
_VALUE = re.compile(rf"(?:{_NAME})?")
_TOKEN = re.compile(r"\s*(==|!=|=|\(|\)|,|!|[^\s=!(),]+)")
OPS = ("=", "!=", "in", "notin", "exists", "!exists")


@dataclass(frozen=True, slots=True)
class Requirement:
    """One clause: ``key op values``."""

    key: str
    op: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfies this clause."""
        value = labels.get(self.key)
        op = self.op
        if op == "=" or op == "in":
            return value is not None and value in self.values
        if op == "!=" or op == "notin":
            return value is None or value not in self.values
        if op == "exists":
            return value is not None
        return value is None


@dataclass(frozen=True, slots=True)
class Selector:
    """A conjunction of requirements; the empty selector matches everything."""

    text: str
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether every requirement holds for ``labels``."""
        return all(r.matches(labels) for r in self.requirements)

    def equalities(self) -> list[tuple[str, str]]:
        """``(key, value)`` pairs every match must have: usable as index look-ups."""
        return [
            (r.key, next(iter(r.values)))
            for r in self.requirements
            if r.op in ("=", "in") and len(r.values) == 1
        ]


@lru_cache(maxsize=1024)
def parse_selector(text: str) -> Selector:
    """Parse a selector string.

    Raises:
        InvalidSelectorError: with the position of the first offending character.
    """
    return _Parser(text).parse()


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, int]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if m is None:  # the token pattern matches any non-space; kept for the type checker
                self.fail("unexpected character", pos)
            self.tokens.append((m[1], m.start(1)))
            pos = m.end()
        self.i = 0

    def fail(self, message: str, pos: int | None = None) -> NoReturn:
        if pos is None:
            pos = self.tokens[self.i][1] if self.i < len(self.tokens) else len(self.text)
        raise InvalidSelectorError(message, selector=self.text, position=pos)

    def peek(self) -> str | None:
        return self.tokens[self.i][0] if self.i < len(self.tokens) else None

    def take(self) -> tuple[str, int]:
        if self.i >= len(self.tokens):
            self.fail("unexpected end of selector")
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def parse(self) -> Selector:
        reqs: list[Requirement] = []
        if self.tokens:
            reqs.append(self.requirement())
            while self.peek() is not None:
                if self.take()[0] != ",":
                    self.fail("expected ',' between requirements", self.tokens[self.i - 1][1])
                reqs.append(self.requirement())
        return Selector(self.text, tuple(reqs))

    def key(self) -> str:
        tok, pos = self.take()
        if _KEY.fullmatch(tok) is None:
            self.fail(f"invalid label key {tok!r}", pos)
        return tok

    def value(self) -> str:
        tok, pos = self.tokens[self.i] if self.i < len(self.tokens) else ("", len(self.text))
        if tok in (",", ")") or self.i >= len(self.tokens):
            return ""  # an empty value is allowed: k=  or  k in (a,)
        self.i += 1
        if _VALUE.fullmatch(tok) is None:
            self.fail(f"invalid label value {tok!r}", pos)
        return tok

    def requirement(self) -> Requirement:
        if self.peek() == "!":
            self.take()
            return Requirement(self.key(), "!exists")
        key = self.key()
        op = self.peek()
        if op is None or op == ",":
            return Requirement(key, "exists")
        _, pos = self.take()
        if op in ("=", "=="):
            return Requirement(key, "=", frozenset([self.value()]))
        if op == "!=":
            return Requirement(key, "!=", frozenset([self.value()]))
        if op in ("in", "notin"):
            return Requirement(key, op, self.values())
        self.fail(f"expected an operator (=, ==, !=, in, notin) after {key!r}", pos)

    def values(self) -> frozenset[str]:
        tok, pos = self.take()
        if tok != "(":
            self.fail("expected '(' after in/notin", pos)
        values = [self.value()]
        while True:
            tok, pos = self.take()
            if tok == ")":
                return frozenset(values)
            if tok != ",":
                self.fail("expected ',' or ')' in the value list", pos)
            values.append(self.value())
