"""Did the candidate keep the request's JSON contract?

A quantized model that breaks JSON breaks every tool call and parser behind
the gateway, even when its text is "similar"; so a broken contract is an
anomaly on its own. The check is strict where models fail in practice:
markdown fences are forgiven (both models add them), duplicate keys are not
(a looping model repeats keys, and ``json.loads`` would silently keep the last).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError as JsonSchemaError
from jsonschema.exceptions import best_match

from quantdrift.detectors.bounded_regex import check_patterns, validator_class
from quantdrift.schemas.pair import RequestInfo

_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*[ \t]*\n?(.*?)\n?[ \t]*```\s*$", re.DOTALL)
_MAX_ERROR = 160


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strip_fences(text: str) -> str:
    """The body of a ```` ```json ... ``` ```` block, or the stripped text.

    Examples
    --------
    >>> strip_fences('```json\\n{"a": 1}\\n```')
    '{"a": 1}'
    >>> strip_fences('  {"a": 1} ')
    '{"a": 1}'
    """
    match = _FENCE.match(text)
    return (match.group(1) if match else text).strip()


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    # A route sends the same schema with every request: build its validator once.
    # Its regexes run on RE2 (bounded_regex): the schema is user input, and a
    # backtracking pattern would otherwise stall the gateway's loop or the scorer.
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    check_patterns(schema)
    return validator_class(cls)(schema)


def _short(message: str) -> str:
    return message if len(message) <= _MAX_ERROR else message[: _MAX_ERROR - 1] + "…"


def parse_strict(body: str) -> tuple[Any, str | None]:
    """(value, None), or (None, why ``body`` is not JSON): duplicate keys and NaN /
    Infinity refused (a looping model repeats keys; ``json.loads`` keeps the last).

    >>> parse_strict('{"a": 1}'), parse_strict('{"a": 1, "a": 2}')[1]
    (({'a': 1}, None), "json: duplicate key 'a'")
    """
    try:
        value = json.loads(body, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except _DuplicateKey as exc:
        return None, _short(f"json: duplicate key {exc.args[0]!r}")
    except json.JSONDecodeError as exc:
        return None, _short(f"json: invalid ({exc.msg} at line {exc.lineno} col {exc.colno})")
    except (ValueError, RecursionError) as exc:
        return None, _short(f"json: invalid ({type(exc).__name__}: {exc})")
    return value, None


def expects_json(request: RequestInfo) -> bool:
    """True when the request asked for JSON in any of the three ways."""
    return bool(request.expects_json or request.expected_keys or request.json_schema)


def check_json_contract(text: str, request: RequestInfo) -> tuple[bool | None, str | None]:
    """(ok, error) for the candidate ``text``; (None, None) when no JSON was asked for.

    Checks, in order: parses as JSON (after removing a markdown fence; no
    duplicate keys, no NaN/Infinity), has every ``expected_keys`` key at the top
    level, validates against ``json_schema``. An invalid schema is the
    request's fault, not the model's: (None, "json: invalid schema ...").

    Examples
    --------
    >>> req = RequestInfo(expected_keys=["name", "age"])
    >>> check_json_contract('```json\\n{"name": "Ada", "age": 36}\\n```', req)
    (True, None)
    >>> check_json_contract('{"name": "Ada"}', req)
    (False, "json: missing key 'age'")
    >>> check_json_contract("hello", RequestInfo())
    (None, None)
    """
    if not expects_json(request):
        return None, None
    value, error = parse_strict(strip_fences(text))
    if error is not None:
        return False, error
    if request.expected_keys:
        if not isinstance(value, dict):
            return False, f"json: expected an object, got {type(value).__name__}"
        for key in request.expected_keys:
            if key not in value:
                return False, _short(f"json: missing key {key!r}")
    if request.json_schema is not None:
        try:
            validator = _validator(json.dumps(request.json_schema, sort_keys=True))
            error = best_match(validator.iter_errors(value))
        except JsonSchemaError as exc:
            return None, _short(f"json: invalid schema ({exc.message})")
        except (RecursionError, ValueError, TypeError) as exc:  # unserialisable or too deep
            return None, _short(f"json: schema not checkable ({type(exc).__name__})")
        if error is not None:
            where = error.json_path
            return False, _short(f"json: schema: {error.message} at {where}")
    return True, None
