"""The JSON guard's token scanner: strings, escapes, literals and numbers.

``JsonGuard`` (``json_guard.py``) reads the document's structure: containers, keys,
commas, fences, and the checks on them. Inside a token it hands each character to
this scanner, which knows only the lexical grammar and answers with one of four
outcomes: the token goes on, it ended with this character, it ended just before this
character (a number, whose end is only seen on the next character), or it failed
(``failure`` says why). Kept apart so each machine fits in one reading, and so the
lexical rules sit in one table-like place.

Examples
--------
>>> scan = TokenScanner()
>>> scan.start_number("-")
>>> [scan.step(c) for c in "12.5e"]
[0, 0, 0, 0, 0]
>>> scan.step(",") == FAILED, scan.failure
(True, ('invalid_number', "',' inside a number"))
>>> scan.start_string(is_key=True)
>>> scan.plain_run('na\\\\u00efve"', 0), scan.step("\\\\")
(2, 0)
"""

from __future__ import annotations

import json
import re

# Outcomes of ``TokenScanner.step``.
MORE = 0  # the token goes on
ENDED = 1  # the token ended with this character
ENDED_BEFORE = 2  # the token (a number) ended just before this character
FAILED = 3  # the character cannot continue the token; ``failure`` says why

DIGITS = frozenset("0123456789")
NUMBER_STARTS = frozenset("-") | DIGITS
LITERALS = {"t": "true", "f": "false", "n": "null"}
_HEX = frozenset("0123456789abcdefABCDEF")
_ESCAPES = frozenset('"\\/bfnrtu')
# Plain string content (no quote, backslash or control character): skipped in one step.
_PLAIN = re.compile(r'[^"\\\x00-\x1f]+')

# Token kinds.
_STRING, _ESCAPE, _UNICODE, _LITERAL, _NUMBER = range(5)

# Number sub-states; the terminal ones may end the number.
_N_MINUS, _N_ZERO, _N_INT, _N_DOT, _N_FRAC, _N_E, _N_ESIGN, _N_EXP = range(8)
_N_TERMINAL = frozenset({_N_ZERO, _N_INT, _N_FRAC, _N_EXP})


def _next_number(num: int, ch: str) -> int | None:
    """The number's sub-state after ``ch``, or None if ``ch`` cannot continue it."""
    digit = ch in DIGITS
    if num == _N_MINUS:
        return _N_ZERO if ch == "0" else _N_INT if digit else None
    if num == _N_ZERO:
        return _N_DOT if ch == "." else _N_E if ch in "eE" else None
    if num == _N_INT:
        return _N_INT if digit else _N_DOT if ch == "." else _N_E if ch in "eE" else None
    if num == _N_DOT:
        return _N_FRAC if digit else None
    if num == _N_FRAC:
        return _N_FRAC if digit else _N_E if ch in "eE" else None
    if num == _N_E:
        return _N_ESIGN if ch in "+-" else _N_EXP if digit else None
    return _N_EXP if digit else None  # _N_ESIGN, _N_EXP


class TokenScanner:
    """One token at a time; ``start_*`` begins one, ``step`` feeds it a character."""

    __slots__ = ("_at", "_key_buf", "_kind", "_literal", "_unicode_left", "failure", "is_key")

    def __init__(self) -> None:
        self.failure: tuple[str, str] = ("", "")
        self.is_key = False
        self._kind = _STRING
        self._key_buf: list[str] = []
        self._unicode_left = 0
        self._literal = ""
        self._at = 0  # the literal's next character, or the number's sub-state

    def start_string(self, is_key: bool) -> None:
        """After the opening quote; a key's text is kept for the duplicate check."""
        self._kind, self.is_key = _STRING, is_key
        if is_key:
            self._key_buf = []

    def start_literal(self, ch: str) -> None:
        self._kind, self.is_key = _LITERAL, False
        self._literal, self._at = LITERALS[ch], 1

    def start_number(self, ch: str) -> None:
        self._kind, self.is_key = _NUMBER, False
        self._at = _N_MINUS if ch == "-" else _N_ZERO if ch == "0" else _N_INT

    @property
    def in_number(self) -> bool:
        return self._kind == _NUMBER

    @property
    def number_may_end(self) -> bool:
        """Whether the number read so far is a whole number (the stream may end here)."""
        return self._kind == _NUMBER and self._at in _N_TERMINAL

    def key(self) -> str:
        """The key just read, unescaped (its raw text if it does not decode)."""
        raw = "".join(self._key_buf)
        try:
            return str(json.loads(f'"{raw}"'))
        except ValueError:  # lone surrogate escapes and the like: keep the raw text
            return raw

    def plain_run(self, chunk: str, i: int) -> int:
        """Inside a string, skip the run of plain characters at ``i``: where it ends."""
        if self._kind != _STRING:
            return i
        m = _PLAIN.match(chunk, i)
        if m is None:
            return i
        if self.is_key:
            self._key_buf.append(m.group())
        return m.end()

    def _fail(self, reason: str, detail: str) -> int:
        self.failure = (reason, detail)
        return FAILED

    def step(self, ch: str) -> int:
        kind = self._kind
        if kind == _STRING:
            if ch == '"':
                return ENDED
            if ch == "\\":
                self._kind = _ESCAPE
                return self._keep(ch)
            return self._fail("control_char", f"raw control character {ch!r} in a string")
        if kind == _ESCAPE:
            if ch not in _ESCAPES:
                return self._fail("bad_escape", f"invalid escape \\{ch}")
            if ch == "u":
                self._unicode_left, self._kind = 4, _UNICODE
            else:
                self._kind = _STRING
            return self._keep(ch)
        if kind == _UNICODE:
            if ch not in _HEX:
                return self._fail("bad_escape", f"invalid \\u escape digit {ch!r}")
            self._unicode_left -= 1
            if self._unicode_left == 0:
                self._kind = _STRING
            return self._keep(ch)
        if kind == _LITERAL:
            if ch != self._literal[self._at]:
                return self._fail("invalid_literal", f"expected {self._literal!r}")
            self._at += 1
            return ENDED if self._at == len(self._literal) else MORE
        return self._number(ch)

    def _keep(self, ch: str) -> int:
        if self.is_key:
            self._key_buf.append(ch)
        return MORE

    def _number(self, ch: str) -> int:
        num = self._at
        if num == _N_ZERO and ch in DIGITS:
            return self._fail("invalid_number", "a leading zero is not followed by digits")
        nxt = _next_number(num, ch)
        if nxt is not None:
            self._at = nxt
            return MORE
        if num not in _N_TERMINAL:
            return self._fail("invalid_number", f"{ch!r} inside a number")
        return ENDED_BEFORE
