"""The one exception tree of quantdrift.

* QuantdriftError
  + ConfigError
  + InputError
  + BrokerError
  + SchemaError (also ValueError)
  + SignatureError
    - StaleCommand
    - UnmappableCommand
  + BreakerStoreError
  + StackError
  + GatewayError
    - UpstreamError
    - UpstreamTimeout
    - GatewayOverloaded

Library exceptions are wrapped at the boundary (``raise X(...) from exc``) so a
caller decides on one type what a failure does: skip, dead-letter, retry, raise.
"""

from __future__ import annotations


class QuantdriftError(Exception):
    """Root of every error quantdrift raises on purpose."""


class ConfigError(QuantdriftError):
    """Settings or a policy file are wrong; the message says which field."""


class InputError(QuantdriftError):
    """A file, name or argument given on the command line cannot be used: it is
    missing, unreadable, holds nothing usable, or names something that does not exist."""


class BrokerError(QuantdriftError):
    """The Kafka broker could not be reached or refused what was asked."""


class SchemaError(QuantdriftError, ValueError):
    """A message could not be parsed or validated; it belongs in the DLQ."""


class SignatureError(QuantdriftError):
    """A RouteCommand's signature is missing, unknown or wrong."""


class StaleCommand(SignatureError):
    """A RouteCommand's epoch is not newer than the one applied, or its issued_at is
    outside the freshness window."""


class UnmappableCommand(SignatureError):
    """A valid RouteCommand names a target this gateway has no pool for: refused and
    counted, never a 5xx."""


class BreakerStoreError(QuantdriftError):
    """Redis could not be reached or answered something unexpected."""


class StackError(QuantdriftError):
    """The embedded broker or Redis could not be started or reached."""


class GatewayError(QuantdriftError):
    """The gateway could not serve a request."""


class UpstreamError(GatewayError):
    """Every upstream of a precision pool failed."""


class UpstreamTimeout(UpstreamError):
    """An upstream did not answer in time."""


class GatewayOverloaded(GatewayError):
    """The gateway itself is overloaded (its event loop runs late): the request is shed
    with a 503, and no upstream is blamed for a timeout the gateway's own lag caused."""
