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
