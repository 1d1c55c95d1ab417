"""A value built on first use: the worker's embedder and store are made inside the loop.

``attach_agents`` runs before Faust starts its event loop, and loading the model
takes seconds: both the scorer and the Redis client are built the first time a
stage (or the status page) asks for them, once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Lazy(Generic[T]):
    """``lazy()`` calls ``factory`` the first time, then returns what it gave.

    >>> calls = []
    >>> value = Lazy(lambda: calls.append(1) or "built")
    >>> value.built, value(), value(), len(calls)
    (None, 'built', 'built', 1)
    """

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._made = False
        self._value: T | None = None

    def __call__(self) -> T:
        if not self._made:
            self._value = self._factory()
            self._made = True
        return self._value  # type: ignore[return-value]

    @property
    def built(self) -> T | None:
        """The value if it was built already, else None (never builds it)."""
        return self._value
