"""Secrets files: the credentials and admin token files site configs name.

Only their owner may read them: a file others may read is refused, and every
file written here is mode 600 in a directory only its owner can enter.
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path


def refuse_if_shared(path: Path, what: str) -> None:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"{what} {path} may be read by others (mode "
                         f"{stat.S_IMODE(mode):o}): run `chmod 600 {path}`")


def read_token(path: Path | None) -> str | None:
    """The admin token a token file holds (None when there is no file)."""
    if path is None or not path.exists():
        return None
    refuse_if_shared(path, "admin token file")
    return path.read_text().strip() or None


def read_credentials(path: Path) -> tuple[str, str]:
    """A credentials file's (user, password); refused when others may read it."""
    refuse_if_shared(path, "credentials file")
    try:
        raw = tomllib.loads(path.read_text())
        return str(raw["user"]), str(raw["password"])
    except (OSError, tomllib.TOMLDecodeError, KeyError) as error:
        # Never echo the file: it holds a password.
        raise ValueError(f"credentials file {path} must hold `user` and `password` "
                         f"({type(error).__name__})") from None


def write_credentials(path: Path, user: str, password: str) -> None:
    write_secret(path, f"user = {_toml_string(user)}\npassword = {_toml_string(password)}\n")


def write_secret(path: Path, text: str) -> None:
    """Write a file only its owner can read, in a directory only it can enter."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT


def _toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
