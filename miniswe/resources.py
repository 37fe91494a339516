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
    """`path`, made if missing; "" when it cannot be (a read-only home): a cache is then just not kept."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return ""
    return path if os.access(path, os.W_OK) else ""


def write_quietly(path: str, text: str) -> None:
    """Write a cache file whole (a temporary file renamed over it), or not at all."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
