"""How an agent fails when the failure is not the data's: exit before Faust acknowledges.

``take_events`` acknowledges a batch in a ``finally``, so an exception that leaves
an agent would commit the offsets of records never scored or judged, and they
would be lost. Exiting the process instead leaves them uncommitted: the next
worker (or this one, restarted) reads them again, and the judge drops any pair id
it already folded. A poison *pair* never gets here (scoring failures are
dead-lettered one by one); this is for what is not the data's fault (the broker
refusing a send, a bug), where a crash is visible and a retry is right.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

log = logging.getLogger("quantdrift.worker")
EX_SOFTWARE = 70  # sysexits.h: an internal error; the orchestrator restarts the worker
EX_UNAVAILABLE = 69  # sysexits.h: a service it needs is unavailable (the broker, at startup)


def crash_unacked(agent: str, n: int) -> NoReturn:
    """Log why, flush the logs, and exit with ``EX_SOFTWARE``: ``n`` records stay unacked."""
    log.critical(
        "%s: unexpected failure with %d records not acknowledged; exiting (code %d) so "
        "they are redelivered",
        agent,
        n,
        EX_SOFTWARE,
        exc_info=True,
    )
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(EX_SOFTWARE)
