"""RFC 8785 JSON Canonicalization Scheme (JCS): the bytes that signatures cover.

Two paths give identical output:

* the fast path hands the value to orjson with sorted keys. orjson's string escaping
  is exactly JCS's (``\\b \\t \\n \\f \\r``, other controls as lowercase ``\\u00xx``,
  everything else as raw UTF-8), and for ASCII keys code-point order equals the
  UTF-16 order JCS asks for. It is taken when the value holds no float and no
  non-ASCII object key;
* the exact path serialises numbers as ECMAScript ``Number.prototype.toString``
  does and sorts keys by UTF-16 code units.

Integers outside the IEEE-754 safe range (|n| > 2**53 - 1), NaN and infinities are
refused: they have no interoperable JSON form (RFC 8785 §3.2.2.3, I-JSON).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

__all__ = ["MAX_SAFE_INTEGER", "canonicalize", "format_number", "plain"]

MAX_SAFE_INTEGER = 2**53 - 1
_SORT = orjson.OPT_SORT_KEYS


def canonicalize(value: Any) -> bytes:
    """Return the RFC 8785 canonical UTF-8 bytes of a JSON value.

    Args:
        value: dicts with str keys, lists/tuples, str, int, float, bool and None.

    Raises:
        TypeError: a value of another type, or a non-str object key.
        ValueError: NaN, an infinity or an integer outside the safe range.
    """
    if plain(value):
        return orjson.dumps(value, option=_SORT)
    return "".join(_exact(value)).encode()


def plain(value: Any) -> bool:
    """True when orjson's sorted output of ``value`` is already canonical.

    That is: no float anywhere and only ASCII object keys. Raises TypeError or
    ValueError for values that have no JSON form at all.
    """
    t = type(value)
    if t is dict:
        for k in value:
            if type(k) is not str:
                raise TypeError(f"object keys must be str, not {type(k).__name__}")
            if not k.isascii():
                return False
        return _plain_items(value.values())
    if t is list or t is tuple:
        return _plain_items(value)
    if t is str or t is bool or value is None:
        return True
    if t is int:
        if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return True
        raise ValueError(f"integer {value} is outside the IEEE-754 safe range")
    return _leaf(value)


def _plain_items(items: Iterable[Any]) -> bool:
    for v in items:
        tv = type(v)
        if tv is str or tv is bool or v is None:
            continue  # the common leaves, without a call
        if (tv is dict or tv is list or tv is int) and plain(v):
            continue
        return _leaf(v)
    return True


def _leaf(value: Any) -> bool:
    """A value ``plain`` could not accept: False for containers/floats that need the
    exact path, an error for what has no JSON form."""
    t = type(value)
    if t is float:
        _check_float(value)
        return False
    if t is dict or t is list or t is tuple:
        return False
    raise TypeError(f"{t.__name__} is not a JSON value")


def _exact(value: Any) -> list[str]:
    out: list[str] = []
    _emit(value, out)
    return out


def _emit(value: Any, out: list[str]) -> None:
    t = type(value)
    if t is dict:
        out.append("{")
        first = True
        for k in sorted(value, key=_utf16_key):
            if type(k) is not str:
                raise TypeError(f"object keys must be str, not {type(k).__name__}")
            if not first:
                out.append(",")
            first = False
            out.append(orjson.dumps(k).decode())
            out.append(":")
            _emit(value[k], out)
        out.append("}")
    elif t is list or t is tuple:
        out.append("[")
        for i, v in enumerate(value):
            if i:
                out.append(",")
            _emit(v, out)
        out.append("]")
    elif t is float or t is int:
        out.append(format_number(value))
    elif t is str or t is bool or value is None:
        out.append(orjson.dumps(value).decode())
    else:
        raise TypeError(f"{t.__name__} is not a JSON value")


def _utf16_key(key: Any) -> bytes:
    if type(key) is not str:
        raise TypeError(f"object keys must be str, not {type(key).__name__}")
    return key.encode("utf-16-be", "surrogatepass")


def _check_float(value: float) -> None:
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{value} has no JSON form")


def format_number(value: float | int) -> str:
    """Serialise a number as ECMAScript's ``Number.prototype.toString`` (RFC 8785 §3.2.2.3)."""
    if type(value) is int:
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise ValueError(f"integer {value} is outside the IEEE-754 safe range")
        return str(value)
    _check_float(value)
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    # repr gives the shortest digits that round-trip, as ECMAScript requires.
    mantissa, _, exp = repr(abs(value)).partition("e")
    int_part, _, frac_part = mantissa.partition(".")
    digits = (int_part + frac_part).lstrip("0")
    # n: position of the decimal point relative to the first significant digit.
    n = (
        len(int_part.lstrip("0"))
        if int_part.strip("0")
        else -(len(frac_part) - len(frac_part.lstrip("0")))
    )
    n += int(exp or 0)
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    e = n - 1
    exp_str = ("+" if e > 0 else "-") + str(abs(e))
    if k == 1:
        return sign + digits + "e" + exp_str
    return sign + digits[0] + "." + digits[1:] + "e" + exp_str
