"""Message models for every topic, JSON Schema export and command signing."""

from quantdrift.schemas.alert import AlertEvent, Severity
from quantdrift.schemas.base import SCHEMA_VERSION, Message
from quantdrift.schemas.command import TARGETS, Action, RouteCommand, Target
from quantdrift.schemas.dead_letter import DeadLetter
from quantdrift.schemas.degradation import DegradationEvent
from quantdrift.schemas.pair import ModelOutput, PairEvent, PairKind, RequestInfo
from quantdrift.schemas.score import Metrics, ScoreEvent, Verdict
from quantdrift.schemas.signing import (
    CommandSigner,
    CommandVerifier,
    SignedCommand,
    SignedScore,
    command_bytes,
    signer_from_settings,
    unverified_score,
    verifier_from_settings,
)

__all__ = [
    "SCHEMA_VERSION",
    "TARGETS",
    "Action",
    "AlertEvent",
    "CommandSigner",
    "CommandVerifier",
    "DeadLetter",
    "DegradationEvent",
    "Message",
    "Metrics",
    "ModelOutput",
    "PairEvent",
    "PairKind",
    "RequestInfo",
    "RouteCommand",
    "ScoreEvent",
    "Severity",
    "SignedCommand",
    "SignedScore",
    "Target",
    "Verdict",
    "command_bytes",
    "signer_from_settings",
    "unverified_score",
    "verifier_from_settings",
]
