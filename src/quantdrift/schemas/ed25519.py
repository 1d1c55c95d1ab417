"""Ed25519 keys for documents read outside the project: a verifier needs the public key only.

The HMAC key ring (``schemas.signing``) fits what the project's own processes exchange:
every gateway and worker holds the ring anyway. It does not fit a document handed to
another team or an auditor, because whoever can check an HMAC can also forge one. So
launch approvals and the quantization certificate may be signed with an Ed25519
private key (``signing.private_key_file``, one per person or service) and checked with
its public key (``signing.public_keys``, or ``--public-key`` on the command line).

Keys travel as PEM files, as OpenSSL writes them (``openssl genpkey -algorithm ed25519``
and ``openssl pkey -pubout``), or as ``quantdrift preflight keygen`` writes them. A
public key's id is derived from the key itself, ``ed25519:`` + the first 16 hex digits of
the SHA-256 of its 32 raw bytes, so a verifier given only a public key knows which
signatures it checks, and no id can name two keys. No HMAC key id has that prefix
(``trusted_keys`` refuses one), so a record's ``key_id`` also says how it was signed.

The cryptography is the ``cryptography`` package's; nothing here is hand-written.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from quantdrift.errors import ConfigError

PREFIX = "ed25519:"
ALG = "ed25519"
PublicKey = Ed25519PublicKey
PrivateKey = Ed25519PrivateKey
# What verifies a record: an HMAC secret of the ring, or an Ed25519 public key.
TrustedKey = bytes | Ed25519PublicKey


def key_id(public: Ed25519PublicKey) -> str:
    """The key's id, derived from its raw bytes (what Node's JWK ``x`` holds)."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return PREFIX + hashlib.sha256(raw).hexdigest()[:16]


def generate() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_pem(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def load_private(path: Path) -> Ed25519PrivateKey:
    """An unencrypted PKCS#8 PEM Ed25519 private key; ConfigError says what is wrong."""
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except OSError as exc:
        raise ConfigError(f"private key {path}: {exc.strerror or exc}") from exc
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise ConfigError(f"private key {path}: not an unencrypted PEM private key") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"private key {path}: not an Ed25519 key")
    return key


def load_public(path: Path) -> Ed25519PublicKey:
    """A PEM Ed25519 public key (SubjectPublicKeyInfo); ConfigError says what is wrong."""
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except OSError as exc:
        raise ConfigError(f"public key {path}: {exc.strerror or exc}") from exc
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ConfigError(f"public key {path}: not a PEM public key") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(f"public key {path}: not an Ed25519 key")
    return key


def public_ring(paths: Iterable[Path]) -> dict[str, Ed25519PublicKey]:
    """{key id: public key} of the given PEM files."""
    ring = {}
    for path in paths:
        public = load_public(Path(path))
        ring[key_id(public)] = public
    return ring


def sign(key: Ed25519PrivateKey, message: bytes) -> str:
    """The signature of ``message``, hex (128 digits)."""
    return key.sign(message).hex()


def verifies(public: Ed25519PublicKey, signature_hex: str, message: bytes) -> bool:
    """Whether ``signature_hex`` is ``public``'s signature of ``message``."""
    try:
        public.verify(bytes.fromhex(signature_hex), message)
    except (InvalidSignature, ValueError):
        return False
    return True


def trusted_keys(
    ring: Mapping[str, bytes], public: Mapping[str, Ed25519PublicKey]
) -> dict[str, TrustedKey]:
    """The HMAC ring and the public keys as one mapping by key id (ids cannot collide)."""
    clash = [k for k in ring if k.startswith(PREFIX)]
    if clash:
        raise ConfigError(f"signing.keys: HMAC key ids may not start with {PREFIX!r}: {clash}")
    return {**ring, **public}
