"""One route's scores through the store every worker folds with, and every command it
signs as a gateway opens it: the slice-scoped rollback's unit tests share it."""

from __future__ import annotations

from quantdrift.breaker import RouteState
from quantdrift.breaker.memory_store import MemoryBreakerStore
from quantdrift.breaker.policy import RoutePolicy
from quantdrift.breaker.protocol import FoldResult
from quantdrift.schemas import Metrics, ScoreEvent
from quantdrift.schemas.command import RouteCommand
from quantdrift.schemas.signing import CommandSigner, CommandVerifier

KEY = b"k" * 32
LOOP = Metrics(repetition_run=8, candidate_tokens=40)
GOOD = Metrics(candidate_tokens=40)


class SliceWalk:
    """Scores of ``route`` folded at the times a test gives; ``commands`` (and the signed
    envelopes a gateway receives, ``sealed``) and ``alerts`` (their summaries) in order,
    each command's epoch checked to grow."""

    def __init__(self, policy: RoutePolicy, route: str = "r", now: float = 1000.0) -> None:
        self.store = MemoryBreakerStore(CommandSigner("k1", KEY))
        self.verifier = CommandVerifier({"k1": KEY})
        self.policy = policy
        self.route = route
        self.n = 0
        self.now = now
        self.commands: list[RouteCommand] = []
        self.sealed: list[bytes] = []
        self.alerts: list[str] = []

    async def pair(
        self, language: str, looping: bool, at: float | None = None
    ) -> RouteCommand | None:
        """One pair, folded now (0.01 s after the last), made at ``at`` (default: now)."""
        self.n += 1
        self.now += 0.01
        score = ScoreEvent(
            pair_id=f"p{self.n}", route=self.route, kind="shadow",
            ts=self.now if at is None else at, decoding="greedy",
            metrics=LOOP if looping else GOOD, tags={"language": language},
        )  # fmt: skip
        return self._took(await self.store.fold(score, self.policy, self.now))

    async def until_command(self, loops: str, limit: int = 400, other: str = "en") -> RouteCommand:
        """One pair in four of language ``loops``, every one looping, the rest healthy
        ``other``: until a command comes."""
        for i in range(limit):
            command = await self.pair(loops if i % 4 == 3 else other, i % 4 == 3)
            if command is not None:
                return command
        raise AssertionError(f"no command after {limit} pairs")

    async def tick(self, at: float) -> RouteCommand | None:
        self.now = at
        return self._took(await self.store.tick(self.route, self.policy, at))

    def _took(self, result: FoldResult) -> RouteCommand | None:
        command = None
        for outbox in result.outboxes:
            command = self.verifier.open(outbox.sealed)
            assert not self.commands or command.epoch > self.commands[-1].epoch  # monotonic
            self.commands.append(command)
            self.sealed.append(outbox.sealed)
            self.alerts.append(outbox.alert.summary)
        return command

    async def state(self) -> RouteState:
        return (await self.store.read(self.route))[0]
