"""The one prompt hash: what a pair, a scrubbed pair and a dead letter carry instead of a prompt.

HMAC-SHA256 keyed with a secret salt, hex. Keyed, because a plain sha256 of a
short prompt is reversed by hashing guesses; the same function everywhere, so a
hash in a pair, in a publisher-scrubbed pair and in the DLQ can be joined (under
one salt) and nowhere is weaker than the rest. The salt is the gateway's
``prompt_salt`` (else its ``sample_salt``) and the worker's ``QUANTDRIFT_PROMPT_SALT``:
give both the same secret.

>>> prompt_hash("hi", "s") == prompt_hash("hi", "s") != prompt_hash("hi", "t")
True
>>> len(prompt_hash("hi", "s"))
64
>>> salt_problem("replace-me-with-a-secret")
'is the public placeholder from the example config'
>>> salt_problem("a-long-random-secret-0f3c9a7e") is None
True
"""

from __future__ import annotations

import hashlib
import hmac

# Salts published in this repository's examples and deploy files: known to everyone.
PLACEHOLDER_SALTS = frozenset({"replace-me-with-a-secret", "change-me", "changeme", "secret"})
MIN_SALT_CHARS = 16


def prompt_hash(prompt: str, salt: str) -> str:
    """HMAC-SHA256 of the prompt's UTF-8 bytes (lone surrogates kept), keyed by ``salt``."""
    return hmac.new(
        salt.encode("utf-8", "surrogatepass"),
        prompt.encode("utf-8", "surrogatepass"),
        hashlib.sha256,
    ).hexdigest()


def salt_problem(salt: str) -> str | None:
    """Why ``salt`` does not protect prompts (None when it may): empty, public or short."""
    if not salt:
        return "is empty"
    if salt in PLACEHOLDER_SALTS:
        return "is the public placeholder from the example config"
    if len(salt) < MIN_SALT_CHARS:
        return f"is shorter than {MIN_SALT_CHARS} characters"
    return None
