"""JSON Schema export, so gateways in other languages validate what they produce."""

from __future__ import annotations

import json
from pathlib import Path

from quantdrift.schemas.alert import AlertEvent
from quantdrift.schemas.base import Message
from quantdrift.schemas.command import RouteCommand
from quantdrift.schemas.dead_letter import DeadLetter
from quantdrift.schemas.degradation import DegradationEvent
from quantdrift.schemas.pair import PairEvent
from quantdrift.schemas.score import ScoreEvent
from quantdrift.schemas.signing import SignedCommand, SignedScore

MESSAGES: dict[str, type[Message]] = {
    "PairEvent": PairEvent,
    "ScoreEvent": ScoreEvent,
    "RouteCommand": RouteCommand,
    "SignedCommand": SignedCommand,
    "SignedScore": SignedScore,
    "AlertEvent": AlertEvent,
    "DeadLetter": DeadLetter,
    "DegradationEvent": DegradationEvent,
}


def export_schemas(directory: Path) -> list[Path]:
    """Write one ``<Name>.v1.schema.json`` per message; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, model in MESSAGES.items():
        schema = model.model_json_schema()
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"quantdrift/{name}.v1"
        path = directory / f"{name}.v1.schema.json"
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written
