"""JSON Schema's regex keywords on RE2: linear time, whatever the user's pattern.

A request's ``json_schema`` is user input, and jsonschema matches ``pattern``
and ``patternProperties`` with Python's backtracking ``re``: ``^(a+)+$`` against
26 a's and a "!" takes seconds, on the gateway's event loop or the worker's
scoring thread. RE2 (google-re2) matches in time linear in the text, with its
memory capped per pattern, so no pattern can stall either.

RE2 has no backreferences or lookaround. A schema using them is treated as an
invalid schema (the request's fault, scored as "unknown", never as a model
failure); JSON Schema recommends the portable subset anyway.

``validator_class(cls)`` returns ``cls`` with ``pattern``, ``patternProperties``
and ``additionalProperties`` matched by RE2; ``check_patterns(schema)`` raises
jsonschema's ``SchemaError`` for a pattern RE2 cannot compile, or for
``unevaluatedProperties`` beside ``patternProperties`` (jsonschema would match
those with ``re`` again, out of reach of this module).

Examples
--------
>>> search(r"^(a+)+$", "a" * 26 + "!") is None
True
>>> try:
...     check_patterns({"properties": {"x": {"pattern": "(a)\\\\1"}}})
... except SchemaError as exc:
...     print(exc.message[:39])
pattern '(a)\\\\1' is not supported (no b
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import re2
from jsonschema import validators
from jsonschema.exceptions import SchemaError, ValidationError

_MAX_MEM = 8 << 20  # bytes of automaton per pattern


def _options() -> Any:
    options = re2.Options()
    options.max_mem = _MAX_MEM
    options.log_errors = False
    return options


@lru_cache(maxsize=1024)
def compiled(pattern: str) -> Any:
    """The RE2 program for ``pattern``; ``SchemaError`` when RE2 cannot run it."""
    try:
        return re2.compile(pattern, _options())
    except re2.error as exc:
        detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise SchemaError(
            f"pattern {pattern!r} is not supported (no backreferences or lookaround): {detail}"
        ) from exc


def search(pattern: str, text: str) -> Any:
    """``re.search`` semantics (unanchored), in linear time."""
    return compiled(pattern).search(text)


def check_patterns(schema: Any) -> None:
    """Compile every regex the schema holds; raise ``SchemaError`` on one RE2 cannot run."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("pattern"), str):
            compiled(node["pattern"])
        props = node.get("patternProperties")
        if isinstance(props, dict):
            if "unevaluatedProperties" in node:
                raise SchemaError("unevaluatedProperties beside patternProperties is not supported")
            for key in props:
                compiled(key)
        stack.extend(node.values())


def _pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and search(patrn, instance) is None:
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for k, v in instance.items():
            if search(pattern, k) is not None:
                yield from validator.descend(v, subschema, path=k, schema_path=pattern)


def _additional(instance: dict[str, Any], schema: dict[str, Any]) -> Iterator[str]:
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    for name in instance:
        if name not in properties and not any(search(p, name) is not None for p in patterns):
            yield name


def _additional_properties(
    validator: Any, aP: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    # jsonschema's own, with its one ``re.search`` replaced.
    if not validator.is_type(instance, "object"):
        return
    extras = set(_additional(instance, schema))
    if validator.is_type(aP, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], aP, path=extra)
    elif not aP and extras:
        joined = ", ".join(repr(each) for each in sorted(extras, key=str))
        if "patternProperties" in schema:
            patterns = ", ".join(repr(p) for p in sorted(schema["patternProperties"]))
            yield ValidationError(f"{joined} do(es) not match any of the regexes: {patterns}")
        else:
            yield ValidationError(f"Additional properties are not allowed ({joined} unexpected)")


def validator_class(cls: Any) -> Any:
    """``cls`` (a jsonschema validator class) with its regex keywords on RE2."""
    return validators.extend(
        cls,
        {
            "pattern": _pattern,
            "patternProperties": _pattern_properties,
            "additionalProperties": _additional_properties,
        },
    )
