"""Who is talking: users known by the API key their OpenClaw sends, stored only as a keyed hash.

``clawproxy users add NAME`` makes a random key, prints it once, and stores
HMAC-SHA256(secret, key), where the secret is 32 random bytes in ``<data_dir>/users.secret``
(owner-only). A stolen database alone does not give the keys, nor lets anyone test guesses offline.
A proxy with no users works as before: one user, no key needed.

Alternatively the operator names a header (``proxy.user_header``) that a trusted front end (an
authenticating reverse proxy) sets to the user's name; then the name is taken as sent.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path
from typing import Any

from clawproxy.errors import ConfigError

SECRET_FILE = "users.secret"
KEY_PREFIX = "cpk-"  # recognisable in a config file, and by secret scanners
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,31}$")


def check_name(name: str) -> str:
    """A user name that is safe in a path, an adapter name and a log line; else a ConfigError."""
    if not NAME_RE.match(name):
        raise ConfigError(f"user name {name!r}: use 1-32 lower-case letters, digits, '.', '_' or '-', "
                          "starting with a letter or digit")
    return name


def secret(data_dir: str | os.PathLike, *, create: bool = False) -> bytes | None:
    """The data dir's hashing secret; made (0600) when ``create`` and missing, else None if missing."""
    path = Path(data_dir) / SECRET_FILE
    try:
        return path.read_bytes()
    except FileNotFoundError:
        if not create:
            return None
    Path(data_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32))
    return path.read_bytes()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_hash(secret_bytes: bytes, key: str) -> str:
    # surrogateescape: aiohttp keeps a header's non-UTF-8 bytes as surrogates; a bad key is no 500
    return hmac.new(secret_bytes, key.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()


def create(store: Any, data_dir: str | os.PathLike, name: str, *, shared: bool = False) -> str:
    """Add ``name`` to ``store`` with a fresh key, keeping only its keyed hash; return the key."""
    key = new_key()
    sec = secret(data_dir, create=True)
    assert sec is not None
    store.add_user(check_name(name), key_hash(sec, key), shared=shared)
    return key


def adapter_name(user: str | None, base: str = "clawproxy") -> str:
    """The name vLLM serves a user's adapter under (``base`` alone: the shared adapter)."""
    return base if user is None else f"{base}-u-{user}"
