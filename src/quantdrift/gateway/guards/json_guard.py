"""An incremental JSON validator: can this streamed text still become valid JSON?

``JsonGuard`` is a state machine fed chunk by chunk. It keeps only what the
grammar needs (a stack of open containers, the keys seen per object, the state
inside a string / escape / literal / number) and never re-reads the prefix, so
each character costs O(1) and a guard on a 4,000-token answer costs microseconds
per chunk. At every chunk it answers one question: is the text so far a prefix of
some valid JSON document? The first character after which the answer is "no" is
where it fails, so the gateway can cut the upstream stream right there.

Beyond the grammar it fails on what quantized models do in practice:

* runaway whitespace: more than ``max_whitespace_run`` consecutive whitespace
  characters outside strings (a model stuck emitting newlines);
* nesting deeper than ``max_depth``;
* a duplicate key in any object (a looping model repeats keys; ``json.loads``
  would silently keep the last one);
* a top-level value that is not an object when ``require_object`` is set;
* at the close of the top-level object, a missing ``required_keys`` key.

A markdown fence around the document (```` ```json ... ``` ````) is forgiven,
like the JSON contract detector does; ``span`` says where the bare JSON value is
so the gateway can hand the user just that.

The lexical grammar (strings, escapes, literals, numbers) is the token scanner's
(``json_tokens.py``); this module reads the structure around the tokens.

Examples
--------
>>> guard = JsonGuard(required_keys=("name",))
>>> [guard.feed(c).ok for c in ['{"na', 'me": "Ada"', ', "age": 3', '6}']]
[True, True, True, True]
>>> guard.close().ok
True
>>> JsonGuard().feed('{"a": tru3').reason
'invalid_literal'
>>> g = JsonGuard(required_keys=("age",))
>>> g.feed('{"name": "Ada"}').reason
'missing_key'
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from quantdrift.gateway.guards.json_tokens import (
    ENDED,
    ENDED_BEFORE,
    FAILED,
    LITERALS,
    MORE,
    NUMBER_STARTS,
    TokenScanner,
)

WHITESPACE = frozenset(" \t\n\r")
_FENCE_LANG = re.compile(r"[A-Za-z0-9_+.-]")

# States.
_START = 0  # before the document: whitespace, a value, or (allow_fences) a fence
_VALUE = 1  # a value must come (after ':' or ',' in an array)
_ARRAY_FIRST = 2  # after '[': a value or ']'
_KEY_FIRST = 3  # after '{': a key or '}'
_KEY = 4  # after ',' in an object: a key
_COLON = 5
_AFTER = 6  # after a value inside a container: ',' or the closing bracket
_TOKEN = 7  # inside a string, literal or number: the token scanner reads it
_DONE = 12  # the top-level value is complete: whitespace (or a closing fence) only
_FENCE_OPEN = 13
_FENCE_LANG_STATE = 14
_FENCE_CLOSE = 15
_FENCE_DONE = 16


@dataclass(frozen=True, slots=True)
class GuardResult:
    """``ok`` False once the text can no longer become valid JSON; ``reason`` says why.

    ``position`` is the 0-based index (in the whole stream) of the character that
    made it impossible; None for failures at the close (truncated, missing key).
    """

    ok: bool
    reason: str | None = None
    detail: str = ""
    position: int | None = None


_OK = GuardResult(True)


class JsonGuard:
    """Feed streamed text with ``feed``; call ``close`` at the end of the stream."""

    def __init__(
        self,
        *,
        required_keys: Iterable[str] = (),
        require_object: bool = False,
        max_whitespace_run: int | None = 64,
        max_depth: int = 64,
        allow_fences: bool = True,
    ) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.required_keys = tuple(dict.fromkeys(required_keys))
        self.require_object = require_object or bool(self.required_keys)
        self.max_whitespace_run = max_whitespace_run
        self.max_depth = max_depth
        self.allow_fences = allow_fences
        self._state = _START
        self._stack: list[str] = []  # "{" or "["
        self._keys: list[set[str] | None] = []  # keys seen, per open container
        self._tok = TokenScanner()
        self._ws_run = 0
        self._fence_ticks = 0
        self._fenced = False
        self._pos = 0
        self._start: int | None = None
        self._end: int | None = None
        self._result = _OK

    # -- reading ---------------------------------------------------------------

    @property
    def failed(self) -> bool:
        return not self._result.ok

    @property
    def result(self) -> GuardResult:
        return self._result

    @property
    def complete(self) -> bool:
        """True once a whole top-level value has been read (and nothing has failed)."""
        return self._result.ok and self._state in (_DONE, _FENCE_CLOSE, _FENCE_DONE)

    @property
    def consumed(self) -> int:
        """Characters fed so far."""
        return self._pos

    @property
    def span(self) -> tuple[int, int] | None:
        """(start, end) of the JSON value in the stream, once complete: the text to return."""
        if self._start is None or self._end is None:
            return None
        return self._start, self._end

    @property
    def depth(self) -> int:
        return len(self._stack)

    # -- feeding ---------------------------------------------------------------

    def feed(self, chunk: str) -> GuardResult:
        """Consume ``chunk``; the result stays failed once it failed."""
        if not self._result.ok:
            return self._result
        i, n = 0, len(chunk)
        while i < n:
            if self._state == _TOKEN:
                # Fast path: a run of plain string characters.
                j = self._tok.plain_run(chunk, i)
                if j > i:
                    i = j
                    continue
            ch = chunk[i]
            if not self._step(ch, self._pos + i):
                self._pos += i + 1
                return self._result
            if self._reprocess:
                self._reprocess = False
                continue
            i += 1
        self._pos += n
        return self._result

    def close(self) -> GuardResult:
        """The stream ended: ok only if a complete value was read (and every check passed)."""
        if not self._result.ok:
            return self._result
        if self._state == _TOKEN and self._tok.in_number and not self._stack:
            if self._tok.number_may_end:
                self._end = self._pos
                self._state = _DONE
            else:
                return self._fail("truncated", "the stream ended inside a number", None)
        if self._state in (_DONE, _FENCE_CLOSE, _FENCE_DONE):
            return self._result
        if self._state == _START:
            return self._fail("empty", "no JSON value in the answer", None)
        return self._fail(
            "truncated", f"the stream ended with {len(self._stack)} open container(s)", None
        )

    # -- the machine -------------------------------------------------------------

    _reprocess = False

    def _fail(self, reason: str, detail: str, position: int | None) -> GuardResult:
        self._result = GuardResult(False, reason, detail, position)
        return self._result

    def _whitespace(self, pos: int) -> bool:
        self._ws_run += 1
        limit = self.max_whitespace_run
        if limit is not None and self._ws_run > limit:
            self._fail("whitespace_run", f"more than {limit} consecutive whitespace", pos)
            return False
        return True

    def _begin_value(self, ch: str, pos: int) -> bool:
        """A value starts with ``ch`` (state was expecting one)."""
        top = not self._stack
        if top:
            if self.require_object and ch != "{":
                self._fail("not_object", f"expected a JSON object, got {ch!r}", pos)
                return False
            self._start = pos
        if ch == "{" or ch == "[":
            if len(self._stack) >= self.max_depth:
                self._fail("too_deep", f"nesting deeper than {self.max_depth}", pos)
                return False
            self._stack.append(ch)
            self._keys.append(set() if ch == "{" else None)
            self._state = _KEY_FIRST if ch == "{" else _ARRAY_FIRST
        elif ch == '"':
            self._tok.start_string(is_key=False)
            self._state = _TOKEN
        elif ch in LITERALS:
            self._tok.start_literal(ch)
            self._state = _TOKEN
        elif ch in NUMBER_STARTS:
            self._tok.start_number(ch)
            self._state = _TOKEN
        else:
            self._fail("invalid_char", f"{ch!r} cannot start a JSON value", pos)
            return False
        return True

    def _end_value(self, end: int) -> bool:
        """A value ended just before ``end``."""
        if self._stack:
            self._state = _AFTER
        else:
            self._end = end
            self._state = _DONE
        return True

    def _close_container(self, ch: str, pos: int) -> bool:
        opener = self._stack.pop()
        keys = self._keys.pop()
        if (opener == "{") != (ch == "}"):
            self._fail("invalid_char", f"{ch!r} does not close {opener!r}", pos)
            return False
        if not self._stack and keys is not None and self.required_keys:
            missing = [k for k in self.required_keys if k not in keys]
            if missing:
                self._fail("missing_key", f"missing key {missing[0]!r}", pos)
                return False
        return self._end_value(pos + 1)

    def _token_char(self, ch: str, pos: int) -> bool:
        """A character inside a token, as the scanner reads it."""
        tok = self._tok
        outcome = tok.step(ch)
        if outcome == MORE:
            return True
        if outcome == FAILED:
            self._fail(*tok.failure, pos)
            return False
        if outcome == ENDED_BEFORE:
            # The number ended; the character belongs to what follows.
            self._end_value(pos)
            self._reprocess = True
            return True
        assert outcome == ENDED
        return self._end_key(tok.key(), pos) if tok.is_key else self._end_value(pos + 1)

    def _step(self, ch: str, pos: int) -> bool:
        state = self._state
        if state == _TOKEN:
            return self._token_char(ch, pos)

        # Structural states: whitespace is counted, anything else resets the run.
        if ch in WHITESPACE:
            if state in (_FENCE_OPEN,):
                self._fail("invalid_char", "a fence needs three backticks", pos)
                return False
            if state == _FENCE_LANG_STATE:
                if ch == "\n":
                    self._state = _VALUE
                    self._ws_run = 0
                return self._whitespace(pos) if ch != "\n" else True
            if state == _FENCE_CLOSE:
                self._fail("invalid_char", "a closing fence needs three backticks", pos)
                return False
            return self._whitespace(pos)
        self._ws_run = 0

        if state == _START:
            if ch == "`" and self.allow_fences:
                self._fence_ticks, self._state, self._fenced = 1, _FENCE_OPEN, True
                return True
            return self._begin_value(ch, pos)
        if state == _VALUE:
            return self._begin_value(ch, pos)
        if state == _ARRAY_FIRST:
            if ch == "]":
                return self._close_container(ch, pos)
            return self._begin_value(ch, pos)
        if state in (_KEY_FIRST, _KEY):
            if ch == '"':
                self._tok.start_string(is_key=True)
                self._state = _TOKEN
                return True
            if ch == "}" and state == _KEY_FIRST:
                return self._close_container(ch, pos)
            self._fail("invalid_char", f"expected a key, got {ch!r}", pos)
            return False
        if state == _COLON:
            if ch == ":":
                self._state = _VALUE
                return True
            self._fail("invalid_char", f"expected ':', got {ch!r}", pos)
            return False
        if state == _AFTER:
            if ch == ",":
                self._state = _KEY if self._stack[-1] == "{" else _VALUE
                return True
            if ch in "]}":
                return self._close_container(ch, pos)
            self._fail("invalid_char", f"expected ',' or a closing bracket, got {ch!r}", pos)
            return False
        if state == _DONE:
            if ch == "`" and self._fenced:
                self._fence_ticks, self._state = 1, _FENCE_CLOSE
                return True
            self._fail("trailing_content", f"{ch!r} after the complete JSON value", pos)
            return False
        return self._fence_char(state, ch, pos)

    def _fence_char(self, state: int, ch: str, pos: int) -> bool:
        """A character of a Markdown fence around the document (``allow_fences``)."""
        if state == _FENCE_OPEN:
            if ch == "`" and self._fence_ticks < 3:
                self._fence_ticks += 1
                if self._fence_ticks == 3:
                    self._state = _FENCE_LANG_STATE
                return True
            self._fail("invalid_char", "a fence needs three backticks", pos)
            return False
        if state == _FENCE_LANG_STATE:
            if _FENCE_LANG.match(ch):
                return True
            self._fail("invalid_char", f"{ch!r} in the fence's language tag", pos)
            return False
        if state == _FENCE_CLOSE:
            if ch == "`" and self._fence_ticks < 3:
                self._fence_ticks += 1
                if self._fence_ticks == 3:
                    self._state = _FENCE_DONE
                return True
            self._fail("trailing_content", f"{ch!r} in the closing fence", pos)
            return False
        # _FENCE_DONE
        self._fail("trailing_content", f"{ch!r} after the closing fence", pos)
        return False

    def _end_key(self, key: str, pos: int) -> bool:
        keys = self._keys[-1]
        assert keys is not None  # keys only occur in objects
        if key in keys:
            self._fail("duplicate_key", f"duplicate key {key!r}", pos)
            return False
        keys.add(key)
        self._state = _COLON
        return True


def guard_for(
    *,
    expected_keys: Iterable[str] | None = None,
    json_schema: dict[str, object] | None = None,
    max_whitespace_run: int | None = 64,
    max_depth: int = 64,
) -> JsonGuard:
    """A guard for a request: required keys from ``expected_keys`` and the schema's top level.

    A schema whose top-level ``type`` is ``object`` (or that lists ``required`` or
    ``properties``) also requires the value to be an object.
    """
    required = list(expected_keys or ())
    require_object = bool(required)
    if isinstance(json_schema, dict):
        req = json_schema.get("required")
        if isinstance(req, list):
            required.extend(k for k in req if isinstance(k, str))
        require_object = require_object or json_schema.get("type") == "object" or bool(required)
    return JsonGuard(
        required_keys=required,
        require_object=require_object,
        max_whitespace_run=max_whitespace_run,
        max_depth=max_depth,
    )
