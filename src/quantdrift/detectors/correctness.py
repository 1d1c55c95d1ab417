"""Did an answer get a checkable task right? Pure, for the paired outcome test.

Agreement between the candidate and the reference says nothing about which is right,
and a reference that is wrong as often as the candidate hides a candidate's errors
that happen elsewhere. Where the producer knows the answer (``RequestInfo.
expected_answer``; the corpus's prompts carry one, and any producer may set it), the
outcome test asks each side whether it got it right (``tolerance.task_failed``): a
wrong answer is a failed task outcome beside a broken JSON contract, a loop and a cut.

How an answer is checked, by ``answer_kind``:

* ``number``: the **last** number in the answer (thousands separators dropped) equals
  the expected one to 1e-6 relative: word problems end on their result;
* ``json``: the answer parses as JSON (a markdown fence forgiven) and every key of the
  expected object has the expected value (strings compared normalised): extraction
  results and tool-call arguments;
* ``label`` and ``text``: the expected text, normalised (NFKC, case-folded, spaces
  collapsed), appears in the normalised answer.

None: nothing to check (no expected answer, or one that is not of its kind).
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from typing import Any

from quantdrift.detectors.json_contract import strip_fences

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_SPACES = re.compile(r"\s+")


def _norm(text: str) -> str:
    return _SPACES.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def _last_number(text: str) -> float | None:
    """The last number in ``text``.

    >>> _last_number("2 boxes of 12 make 1,024 items."), _last_number("none")
    (1024.0, None)
    """
    found = _NUMBER.findall(re.sub(r"(?<=\d),(?=\d{3})", "", unicodedata.normalize("NFKC", text)))
    return float(found[-1]) if found else None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return _norm(a) == _norm(b)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9)
    return bool(a == b)


def answer_ok(text: str, expected: str | None, kind: str | None) -> bool | None:
    """Whether ``text`` has the ``expected`` answer (module docstring); None: unchecked.

    >>> answer_ok("So she has 42 apples.", "42", "number")
    True
    >>> answer_ok("So she has 41 apples, not 42... no, 41.", "42", "number")
    False
    >>> answer_ok('```json\\n{"city": "paris", "n": 2}\\n```', '{"city": "Paris", "n": 2}', "json")
    True
    >>> answer_ok("It ships to Lyon.", "Paris", "label"), answer_ok("x", None, "label")
    (False, None)
    """
    if expected is None or kind is None:
        return None
    if kind == "number":
        want = _last_number(expected)
        got = _last_number(text)
        if want is None:
            return None
        return got is not None and _same(got, want)
    if kind == "json":
        try:
            want_obj = json.loads(expected)
        except ValueError:
            return None
        try:
            got_obj = json.loads(strip_fences(text))
        except (ValueError, RecursionError):
            return False
        if not isinstance(want_obj, dict):
            return _same(got_obj, want_obj)
        if not isinstance(got_obj, dict):
            return False
        return all(k in got_obj and _same(got_obj[k], v) for k, v in want_obj.items())
    return _norm(expected) in _norm(text)
