"""What one side answered, as the contract and correctness checks read it.

A chat answer is its text. An answer that calls a function is the call's arguments
(OpenAI ``tool_calls[].function.arguments``, recorded on the pair as
``ModelOutput.tool_calls``), usually with no text at all: read as text, every tool
call would be an empty answer, a broken JSON contract and a wrong one. So:

* **contract**: a side that called a function keeps its contract when every call's
  arguments parse as a JSON object (no duplicate keys, no NaN); a side without a call
  is held to the request's JSON contract as before (``json_contract``);
* **correctness**: the first call's arguments are the answer ``correctness.answer_ok``
  checks (a ``json`` expected answer: the arguments the call should carry).

Pure; pairs recorded before tool calls were carry none and read as before.
"""

from __future__ import annotations

from quantdrift.detectors.json_contract import check_json_contract, parse_strict
from quantdrift.schemas.pair import ModelOutput, RequestInfo


def answer_text(side: ModelOutput) -> str:
    """The first call's arguments when ``side`` called a function, else its text.

    >>> from quantdrift.schemas.pair import ToolCall
    >>> answer_text(ModelOutput(text="", tool_calls=[ToolCall(name="f", arguments='{"a": 1}')]))
    '{"a": 1}'
    >>> answer_text(ModelOutput(text="Paris"))
    'Paris'
    """
    return side.tool_calls[0].arguments if side.tool_calls else side.text


def contract(side: ModelOutput, request: RequestInfo) -> tuple[bool | None, str | None]:
    """(ok, error) of ``side``'s contract (module docstring); (None, None): none to keep.

    >>> from quantdrift.schemas.pair import ToolCall
    >>> call = lambda args: ModelOutput(text="", tool_calls=[ToolCall(name="ship", arguments=args)])
    >>> contract(call('{"sku": "A1", "n": 2}'), RequestInfo())
    (True, None)
    >>> contract(call('{"sku": "A1", "n": '), RequestInfo())[0]
    False
    >>> contract(ModelOutput(text="hi"), RequestInfo())
    (None, None)
    """
    if not side.tool_calls:
        return check_json_contract(side.text, request)
    for call in side.tool_calls:
        value, error = parse_strict(call.arguments)
        if error is not None:
            return False, f"tool call {call.name or '?'}: {error}"
        if not isinstance(value, dict):
            return False, f"tool call {call.name or '?'}: arguments are not an object"
    return True, None
