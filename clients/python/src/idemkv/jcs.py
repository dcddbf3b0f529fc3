"""RFC 8785 (JCS) canonical JSON and effect fingerprints, byte-identical to the server.

``fingerprint(effect) = "sha256:" + hex(sha256(JCS(effect)))`` (docs/protocol.md,
"Fingerprints"). The repository's shared vector file pins the bytes; the tests read the
same file the Go tests do.

Two inputs are accepted: Python values (dict with str keys, list, tuple, str, int,
float, bool, None) and JSON text (``bytes`` or :class:`RawJSON`), which is parsed as
strictly as the server parses it: no duplicate member names, no lone surrogates, no
invalid UTF-8, no NaN or Infinity, no number beyond the range of a double.

A number whose decimal value the nearest IEEE 754 double does not keep is refused
(:class:`FingerprintError`), whether it is a Python int (2**53 + 1) or a literal of
JSON text (``9007199254740993``, ``0.10000000000000000555``, ``1e-400``): two different
effects must never share a fingerprint, so such a number must be sent as a string.
So is every Python float of magnitude 2**53 or more: it may have lost its digits
before it got here (``json.loads("9007199254740993.0")`` is ``9007199254740992.0``).
NaN and the infinities have no JSON form and are refused too, and so is nesting of
more than 1000 arrays and objects (the server's fingerprint.MaxDepth); neither the
writer nor the parser recurses, so that bound does not depend on the caller's stack.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import re
import uuid
from typing import Any, Callable, Iterable, Optional, Sequence

__all__ = [
    "FingerprintError",
    "RawJSON",
    "canonicalize",
    "canonicalize_json",
    "fingerprint",
    "format_number",
    "key_text",
    "MAX_KEY_DIGITS",
    "PREFIX",
    "MAX_SAFE_INTEGER",
]

PREFIX = "sha256:"

# 2**53: every integer up to it in magnitude is exactly one double. Beyond it some are
# refused (2**53 + 1 reads back as 2**53) and some are not (2**53 + 2 is a double).
MAX_SAFE_INTEGER = 2**53


class FingerprintError(ValueError):
    """The effect is not I-JSON (RFC 7493) and has no fingerprint. Nothing was sent."""


class RawJSON:
    """JSON text to be canonicalized as it is (not a Python string value)."""

    __slots__ = ("text",)

    def __init__(self, text: str | bytes) -> None:
        self.text = text.encode("utf-8") if isinstance(text, str) else bytes(text)

    def __repr__(self) -> str:
        return f"RawJSON({self.text!r})"


class _Number:
    """A number literal of parsed JSON text, kept as text until it is formatted."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def format_number(f: float) -> str:
    """Serialize a finite double as ECMAScript's Number::toString does (RFC 8785 3.2.2.3).

    Python's repr already yields the shortest digit string that reads back as the
    same double (the digits ECMAScript asks for), but lays it out differently:
    ``1e+16`` where ECMAScript writes ``10000000000000000``, ``1e-05`` where it writes
    ``0.00001``, ``1.5e-07`` where it writes ``1.5e-7``. Only the layout is redone here.
    """
    if math.isnan(f) or math.isinf(f):
        raise FingerprintError(f"{f!r} has no JSON form")
    if f == 0:
        return "0"  # both zeros
    sign = ""
    if f < 0:
        sign, f = "-", -f
    r = repr(f)
    mant, _, exp = r.partition("e")
    whole, _, frac = mant.partition(".")
    if frac == "0":
        frac = ""
    digits = (whole + frac).lstrip("0")
    # The value is 0.<digits> × 10^n.
    n = len(whole) + (int(exp) if exp else 0)
    if whole == "0":
        # "0.000123": the leading zeros of frac lower the exponent.
        n = -(len(frac) - len(frac.lstrip("0")))
    digits = digits.rstrip("0") or "0"
    k = len(digits)
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        out = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if e >= 0 else "-") + str(abs(e))
    return sign + out


def _decimal(text: str) -> Optional[tuple[str, ...]]:
    """A number literal as (sign, significant digits, decimal exponent) with no leading
    or trailing zeros, so that two texts of one decimal value compare equal; zero is
    one value whatever its sign and exponent. None for an exponent beyond 2**30 in
    magnitude, which no double survives (Go's decimalOf): int() of its digits would
    refuse past 4300 of them with a plain ValueError."""
    sign = "-" if text.startswith("-") else ""
    body = text.lstrip("-")
    mant, _, exp = body.replace("E", "e").partition("e")
    whole, _, frac = mant.partition(".")
    digits = whole + frac
    stripped = digits.lstrip("0")
    point = len(whole) - (len(digits) - len(stripped))
    stripped = stripped.rstrip("0")
    if not stripped:
        return ("0",)
    if exp:
        mag = exp.lstrip("+-").lstrip("0")
        if len(mag) > 10 or int(mag or "0") > 2**30:
            return None
        point += -int(mag or "0") if exp.startswith("-") else int(mag or "0")
    return (sign, stripped, str(point))


def _exact(text: str) -> str:
    """The JCS text of a number literal, refusing one whose decimal value the nearest
    double does not keep (testdata/fingerprint/README.md, "Numbers"): 2**53 + 1 would
    otherwise share a fingerprint with 2**53."""
    f = float(text)
    if math.isinf(f):
        raise FingerprintError(f"number {text} is out of the range of a double; send it as a string")
    out = format_number(f)
    if _decimal(out) != _decimal(text):
        raise FingerprintError(
            f"number {text} does not survive a round trip through a double (it reads back as {out}); "
            "send it as a string"
        )
    return out


def _int_text(i: int) -> str:
    i = int(i)  # an IntEnum's str() is its name on 3.10
    if i.bit_length() > 1024:
        # Beyond every double, and str() refuses past 4300 digits with a plain ValueError.
        raise FingerprintError(f"an integer of {_digits(i)} digits is out of the range of a double; "
                               "send it as a string")
    return _exact(str(i))


def _digits(i: int) -> str:
    """How many decimal digits i has, without writing them (str() refuses past 4300)."""
    n = int(abs(i).bit_length() * 0.30102999566398120)  # log10(2)
    return str(n + 1) if abs(i) >= 10**n else str(max(n, 1))  # 2**(bits-1) <= |i| < 2**bits <= 10**(n+1)


def _number_text(text: str) -> str:
    return _exact(text)


def _float_text(f: float) -> str:
    """The JCS text of a float of a Python value. From 2**53 up every double is an
    integer and most integers have none: json.loads reads 9007199254740993.0 (and
    9007199254740993e0) as 9007199254740992.0, so two effects naming different
    identifiers would share a fingerprint. A float there is refused, whatever its value,
    as the Go and TypeScript clients refuse every number of that magnitude in a decoded
    value; an int keeps its digits, and JSON text (RawJSON, bytes) is read as written."""
    f = float(f)
    if math.isfinite(f) and abs(f) >= MAX_SAFE_INTEGER:
        raise FingerprintError(f"the number {f!r} is a float of magnitude 2**53 or more, where a float may already "
                               "have lost the digits it was sent with (9007199254740993.0 reads as "
                               "9007199254740992.0): send it as a string, as an int, or the effect as JSON text "
                               "(idemkv.RawJSON)")
    return format_number(f)


# The most digits of an integer that key_text writes: an identifier, not a quantity.
MAX_KEY_DIGITS = 40


def key_text(v: Any) -> str:
    """The text a key argument names its operation by (``@idempotent(key="order_id")``:
    key ``"<text>:<tool>"``), written as the Go gateway's key templates and the
    TypeScript client write it, so that equal values are one key and different values
    two: a string as it is (a ``str`` subclass, such as a ``StrEnum``, by its value);
    ``true`` or ``false``; an integer (any ``numbers.Integral``, numpy's included, or a
    ``float`` that is one below 2**53: 17 and 17.0 are both ``"17"``) as its exact
    digits, at most :data:`MAX_KEY_DIGITS`; any
    other number as RFC 8785 writes it (``"0.5"``); a UUID as its canonical text.
    Anything else raises :class:`TypeError`: ``str()`` of an arbitrary object can differ
    between processes, and would then run one operation twice."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return str.__str__(v)
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            raise FingerprintError(f"{v!r} cannot name an operation")
        if not v.is_integer():
            return format_number(v)
        if abs(v) >= MAX_SAFE_INTEGER:
            # Every double from 2**53 up is an integer, and most integers there have
            # none: 1e23 is 99999999999999991611392 exactly, and 9007199254740993 read
            # from JSON is already 9007199254740992. Its digits are not the sender's.
            raise FingerprintError(f"the number {v!r} is 2**53 or beyond, where a float may already have lost the "
                                   "digits it was sent with: send it as a string (an int keeps them)")
        v = int(v)
    if isinstance(v, numbers.Integral):
        i = int(v)
        if abs(i) >= 10**MAX_KEY_DIGITS:  # before str(), which refuses past 4300 digits
            raise FingerprintError(f"an integer of more than {MAX_KEY_DIGITS} digits cannot name an operation; "
                                   "send it as a string")
        return str(i)
    raise TypeError(f"a {type(v).__name__} cannot name an operation: the key argument must be a string, "
                    "a number, a boolean or a UUID (or give key=lambda ...): str() of other values can differ "
                    "between processes and versions")


def _escape(s: str) -> str:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise FingerprintError(f"string contains a lone surrogate: {s!r}") from e
    out = ['"']
    for ch in s:
        c = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif c < 0x20:
            out.append(_SHORT.get(ch) or f"\\u{c:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


_SHORT = {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _utf16_key(name: str) -> bytes:
    # Big-endian UTF-16 bytes compare exactly as the code units do (RFC 8785 3.2.3).
    return name.encode("utf-16-be", "surrogatepass")


# The server's bound on nesting (fingerprint.MaxDepth): at most this many arrays and
# objects inside one another, the outermost counted as 1 (scalars do not count), as Go
# counts it. Neither the writer nor the parser recurses, so the bound is the same
# whatever the caller's own stack, and every refusal is a FingerprintError.
_MAX_DEPTH = 1000

_END = object()


def _too_deep() -> FingerprintError:
    return FingerprintError(f"nesting too deep: more than {_MAX_DEPTH} arrays and objects inside one another")


def _write(v: Any, out: list[str]) -> None:
    """Append the RFC 8785 text of v to out, with an explicit stack of the open arrays
    and objects: [children left, closing bracket, is an object, written so far]."""
    stack: list[list[Any]] = []
    while True:
        if isinstance(v, RawJSON):
            # JSON text inside a value, in place: its depth adds to the enclosing one.
            v = _parse(v.text)
        if v is None:
            out.append("null")
        elif v is True:
            out.append("true")
        elif v is False:
            out.append("false")
        elif isinstance(v, _Number):
            out.append(_number_text(v.text))
        elif isinstance(v, int):
            out.append(_int_text(v))
        elif isinstance(v, float):
            out.append(_float_text(v))
        elif isinstance(v, str):
            out.append(_escape(v))
        elif isinstance(v, dict):
            if len(stack) >= _MAX_DEPTH:
                raise _too_deep()
            for name in v:
                if not isinstance(name, str):
                    raise FingerprintError(f"object member names must be strings, not {type(name).__name__}")
            out.append("{")
            stack.append([iter([(name, v[name]) for name in sorted(v, key=_utf16_key)]), "}", True, 0])
        elif isinstance(v, (list, tuple)):
            if len(stack) >= _MAX_DEPTH:
                raise _too_deep()
            out.append("[")
            stack.append([iter(list(v)), "]", False, 0])
        else:
            raise FingerprintError(f"{type(v).__name__} is not a JSON value")
        # The next value to write: the next child of the innermost open container.
        while stack:
            top = stack[-1]
            child: Any = next(top[0], _END)
            if child is _END:
                out.append(top[1])
                stack.pop()
                continue
            if top[3]:
                out.append(",")
            top[3] += 1
            if top[2]:
                name, v = child
                out.append(_escape(name))
                out.append(":")
            else:
                v = child
            break
        else:
            return


# json's own string scanner (C where it is built): it does not recurse, refuses control
# characters and bad escapes, and joins escaped surrogate pairs.
_scanstring: Callable[[str, int, bool], tuple[str, int]] = getattr(json.decoder, "scanstring")
_SPACE = re.compile(r"[ \t\n\r]*")
# RFC 8259's number grammar, ASCII digits only (\d would take other scripts' digits).
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")


def _parse(data: bytes) -> Any:
    """JSON text as Python values (numbers kept as their text), as strictly as the
    server reads it, without recursion: an explicit stack holds the open arrays and
    objects, at most _MAX_DEPTH of them."""
    try:
        text = data.decode("utf-8")  # strict: invalid UTF-8 and encoded surrogates fail
    except UnicodeDecodeError as e:
        raise FingerprintError(f"invalid UTF-8 at byte {e.start}") from e
    if text.startswith("\ufeff"):
        raise FingerprintError("a byte order mark is not JSON")
    return _Parser(text).parse()


class _Parser:
    __slots__ = ("s", "pos")

    def __init__(self, s: str) -> None:
        self.s = s
        self.pos = 0

    def error(self, msg: str) -> FingerprintError:
        return FingerprintError(f"invalid JSON: {msg} at character {self.pos}")

    def space(self) -> None:
        m = _SPACE.match(self.s, self.pos)
        assert m is not None  # [ \t\n\r]* matches everywhere
        self.pos = m.end()

    def string(self) -> str:
        """The string whose opening quote is at pos."""
        try:
            v, self.pos = _scanstring(self.s, self.pos + 1, True)
        except json.JSONDecodeError as e:
            raise FingerprintError(f"invalid JSON: {e}") from e
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as e:
            raise self.error(f"lone surrogate in string {v!r}") from e
        return v

    def name(self, obj: dict[str, Any]) -> str:
        """The member name at pos, and past its colon."""
        self.space()
        if not self.s.startswith('"', self.pos):
            raise self.error("expected a member name")
        at = self.pos
        name = self.string()
        if name in obj:
            # Names are compared after unescaping: "a" and "\u0061" are one member.
            self.pos = at
            raise self.error(f"duplicate member name {name!r}")
        self.space()
        if not self.s.startswith(":", self.pos):
            raise self.error("expected : after a member name")
        self.pos += 1
        return name

    def parse(self) -> Any:
        s = self.s
        # The open arrays and objects, and for each object the name of the member whose
        # value comes next.
        stack: list[Any] = []
        names: list[str] = []
        while True:
            self.space()
            if self.pos >= len(s):
                raise self.error("unexpected end of input")
            c = s[self.pos]
            v: Any
            if c == "{" or c == "[":
                if len(stack) >= _MAX_DEPTH:
                    raise _too_deep()
                self.pos += 1
                self.space()
                if s.startswith("}" if c == "{" else "]", self.pos):
                    self.pos += 1
                    v = {} if c == "{" else []
                elif c == "{":
                    obj: dict[str, Any] = {}
                    names.append(self.name(obj))
                    stack.append(obj)
                    continue
                else:
                    stack.append([])
                    continue
            elif c == '"':
                v = self.string()
            elif c == "-" or "0" <= c <= "9":
                m = _NUMBER.match(s, self.pos)
                if m is None:
                    raise self.error("invalid number")
                v = _Number(m.group())
                self.pos = m.end()
            elif s.startswith("true", self.pos):
                v, self.pos = True, self.pos + 4
            elif s.startswith("false", self.pos):
                v, self.pos = False, self.pos + 5
            elif s.startswith("null", self.pos):
                v, self.pos = None, self.pos + 4
            elif s.startswith(("NaN", "Infinity"), self.pos):
                raise self.error("NaN and Infinity are not JSON")
            else:
                raise self.error(f"invalid character {c!r}")
            # v is complete: it is the next member or element of the innermost open
            # container, which then goes on (",") or ends, completing in turn.
            while True:
                if not stack:
                    self.space()
                    if self.pos != len(s):
                        raise self.error("unexpected data after the value")
                    return v
                top = stack[-1]
                is_obj = isinstance(top, dict)
                if is_obj:
                    top[names[-1]] = v
                else:
                    top.append(v)
                self.space()
                if s.startswith(",", self.pos):
                    self.pos += 1
                    if is_obj:
                        names[-1] = self.name(top)
                    break
                if s.startswith("}" if is_obj else "]", self.pos):
                    self.pos += 1
                    v = stack.pop()
                    if is_obj:
                        names.pop()
                    continue
                if self.pos >= len(s):
                    raise self.error("unterminated object" if is_obj else "unterminated array")
                raise self.error("expected , or } in object" if is_obj else "expected , or ] in array")


def _drop(v: Any, path: Sequence[str]) -> Any:
    """A copy of v without the members path names ("*" matches any member or element)."""
    seg, rest = path[0], path[1:]
    if isinstance(v, RawJSON):
        # JSON text inside the effect is dropped from as the Go client drops from a
        # json.RawMessage: a trace id inside it must not make every retry a conflict.
        v = _parse(v.text)
    if isinstance(v, dict):
        kept: dict[str, Any] = {}
        for name, val in v.items():
            if seg != "*" and name != seg:
                kept[name] = val
            elif rest:
                kept[name] = _drop(val, rest)
        return kept
    if isinstance(v, (list, tuple)):
        if seg != "*":
            return v
        if not rest:
            return []
        return [_drop(e, rest) for e in v]
    return v


def _split_paths(drop: Iterable[str]) -> list[list[str]]:
    paths = []
    for d in drop:
        segs = d.split(".")
        if any(s == "" for s in segs):
            raise FingerprintError(f"drop path {d!r} has an empty segment")
        paths.append(segs)
    return paths


def _prepare(effect: Any, drop: Iterable[str]) -> Any:
    paths = _split_paths(drop)
    if isinstance(effect, (bytes, bytearray, memoryview)):
        effect = RawJSON(bytes(effect))
    if isinstance(effect, RawJSON):
        effect = _parse(effect.text)
    if paths:
        # Go parses the whole effect before dropping fields, checking every number
        # (a round trip through a double; on the value path a float's magnitude), the
        # depth, the member names and the values: a part that drop= removes is
        # refused as the rest would be (2**53 + 1 under a dropped "t" included).
        _write(effect, [])
    for p in paths:
        effect = _drop(effect, p)
    return effect


def canonicalize(effect: Any, drop: Iterable[str] = ()) -> bytes:
    """The RFC 8785 canonical UTF-8 bytes of effect, without the fields drop names.

    effect is a Python value, or JSON text as bytes or :class:`RawJSON`. A drop path is
    dot-separated member names from the top ("items.*.trace_id"); paths that match
    nothing are ignored.
    """
    out: list[str] = []
    try:
        _write(_prepare(effect, drop), out)
    except RecursionError as e:
        # Only _drop recurses, once per segment of a drop path: a path of hundreds of
        # segments on a value as deep is still a FingerprintError.
        raise FingerprintError("drop path too deep for the stack") from e
    return "".join(out).encode("utf-8")


def canonicalize_json(text: str | bytes, drop: Iterable[str] = ()) -> bytes:
    """canonicalize for JSON text."""
    return canonicalize(RawJSON(text), drop)


def fingerprint(effect: Any, drop: Iterable[str] = ()) -> str:
    """``"sha256:" + hex(sha256(canonicalize(effect, drop)))``."""
    return PREFIX + hashlib.sha256(canonicalize(effect, drop)).hexdigest()
