"""Files in the state folder that only their owner may read: keys and passwords.

Each is born with mode 0600 (``os.open`` with O_EXCL on a fresh name, then an
atomic rename over the old one): a file written first and chmod-ed after is
readable by everyone in between, and a crash there leaves it so.
"""

import os
import secrets
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def private_secret(path: Path) -> str:
    """The secret kept in `path`, created on first use; URL-safe, so it can sit in
    a redis:// URL as it is."""
    if path.exists():
        secret = path.read_text().strip()
        if secret:
            return secret
    secret = secrets.token_urlsafe(32)
    write_private(path, secret + "\n")
    return secret
