"""What every message shares: a schema version, strict parsing, one error type."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Final, Self

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quantdrift.errors import SchemaError

SCHEMA_VERSION: Final = 1

# A route names a Redis key, a partition key and a label on every metric: bounded and
# plain, on every message a worker reads (a 10 MB route would be a 10 MB Redis key).
RouteName = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:/@-]+$")]
PairId = Annotated[str, Field(min_length=1, max_length=128)]


class Message(BaseModel):
    """Base of every topic's message.

    ``extra="ignore"`` lets a newer producer add fields without breaking older
    workers; NaN and infinity are refused because every metric downstream would
    silently turn into NaN.
    """

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, frozen=True)

    topic_key: ClassVar[str] = ""

    @classmethod
    def parse(cls, raw: bytes | str | dict[str, Any]) -> Self:
        """Parse bytes, text or a dict; any failure is a SchemaError with the reason."""
        try:
            if isinstance(raw, dict):
                return cls.model_validate(raw)
            if isinstance(raw, bytes):
                # orjson rejects invalid UTF-8 and NaN literals up front, with a clear reason.
                return cls.model_validate(orjson.loads(raw))
            return cls.model_validate(orjson.loads(raw.encode("utf-8", "surrogatepass")))
        except orjson.JSONDecodeError as exc:
            raise SchemaError(f"invalid JSON: {exc}") from exc
        except ValidationError as exc:
            raise SchemaError(_summarize(exc)) from exc
        except (UnicodeError, RecursionError, TypeError, ValueError) as exc:
            raise SchemaError(f"unreadable message: {type(exc).__name__}: {exc}") from exc

    def dumps(self) -> bytes:
        """Compact JSON bytes for Kafka."""
        return orjson.dumps(self.model_dump(mode="json", exclude_none=True))


def _summarize(exc: ValidationError, limit: int = 5) -> str:
    """One readable line per field error, the first few only: DLQ readers skim."""
    parts = []
    for err in exc.errors()[:limit]:
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - limit
    if more > 0:
        parts.append(f"(+{more} more)")
    return "schema: " + "; ".join(parts)
