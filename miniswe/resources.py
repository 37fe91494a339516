"""Where the shipped config/ and templates/ live: inside the installed package, or at the checkout's top."""

from __future__ import annotations

import os

_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def _find(name: str) -> str:
    for candidate in (os.path.join(_PACKAGE, name), os.path.join(os.path.dirname(_PACKAGE), name)):
        if os.path.isdir(candidate):
            return candidate
    raise FileNotFoundError(f"miniswe installation is incomplete: no {name}/ next to {_PACKAGE}; reinstall miniswe")


def config_dir() -> str:
    return _find("config")


def templates_dir() -> str:
    return _find("templates")


def cache_dir(name: str) -> str:
    """Where miniswe keeps what it can always make again (help texts, compiled templates): $XDG_CACHE_HOME/miniswe."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "miniswe", name)


def writable_dir(path: str) -> str:
    """`path`, made if missing (private to this user); "" when it cannot be (a read-only home), or when it is not
    this user's alone (a shared cache folder: what is read back from it is run): a cache is then not kept."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        status = os.stat(path)
    except OSError:
        return ""
    mine = status.st_uid == os.geteuid() and not status.st_mode & 0o022
    return path if mine and os.access(path, os.W_OK) else ""


def write_quietly(path: str, text: str) -> None:
    """Write a cache file atomically, or not at all."""
    from miniswe.atomic import write_atomic

    try:
        write_atomic(path, text.encode("utf-8", "surrogateescape"))
    except OSError:
        pass
