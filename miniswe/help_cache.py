"""`miniswe [COMMAND] --help` answered from a cache, without importing typer.

Importing typer and building the commands takes longer than a whole bare agent step, so help that typer printed
once is kept, keyed by everything its text depends on: the words asked, the program name, the terminal's size
and the variables that change how it is formatted, and the code itself (the size and modification time of every
file of the package and of typer). Any change to one of them is a miss: typer prints the help, and the cache
keeps what it printed. Stdlib only: nothing here may import typer or what the commands need.
"""

from __future__ import annotations

import os
import stat
import sys
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

from miniswe.resources import cache_dir, writable_dir, write_quietly

# What typer's (click's) help formatting reads besides argv: the width, and the locale for its encoding.
_ENV = ("COLUMNS", "LINES", "TERM", "TERMINAL_WIDTH", "NO_COLOR", "FORCE_COLOR", "PYTHONIOENCODING", "LANG",
        "LC_ALL", "LC_CTYPE", "_TYPER_FORCE_DISABLE_TERMINAL", "_TYPER_STANDARD_TRACEBACK")


class HelpRequest:
    """One `[COMMAND...] --help` invocation: `serve` prints it from the cache, `recording` fills the cache."""

    def __init__(self, argv: list[str]):
        self.path = os.path.join(cache_dir("help"), f"{zlib.crc32(repr(argv[1:]).encode()):08x}.txt")
        self.key = repr((argv, _terminal(), [(name, os.environ.get(name)) for name in _ENV], _code()))

    @classmethod
    def of(cls, argv: list[str]) -> HelpRequest | None:
        """A request when `argv` asks for help and nothing else (`--help`, or `COMMAND --help`: a word more could
        be a task's text, which is not to be kept on disk), and it can be keyed (else typer answers, uncached)."""
        words = argv[1:]
        if not words or words[-1] != "--help" or len(words) > 2 or sys.stdout is None:
            return None
        if not all(word.isascii() and word.replace("-", "").isalnum() for word in words[:-1]):
            return None
        try:
            return cls(argv)
        except (OSError, ValueError):  # a file of the code that cannot be read (a dangling link, an upgrade)
            return None

    def serve(self) -> bool:
        """Print the cached help if it was made under the same key; whether it was."""
        try:  # not blocking on a FIFO put in its place: only a regular file is read
            with open(os.open(self.path, os.O_RDONLY | os.O_NONBLOCK), encoding="utf-8") as handle:
                if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode) or handle.readline() != self.key + "\n":
                    return False
                text = handle.read()
        except (OSError, UnicodeDecodeError):
            return False
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except OSError:  # the reader went away (`| head`): quiet, like the rest of miniswe's output
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return True

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Keep what is printed on stdout while typer answers, if it answers with help alone: exit 0, nothing on
        stderr."""
        out, err = _Tap(sys.stdout), _Tap(sys.stderr)
        sys.stdout, sys.stderr = out, err
        try:
            yield
        except SystemExit as exit:
            if exit.code in (0, None) and out.parts and not err.parts:
                self._save("".join(out.parts))
            raise
        finally:
            sys.stdout, sys.stderr = out.stream, err.stream

    def _save(self, text: str) -> None:
        if writable_dir(os.path.dirname(self.path)):
            write_quietly(self.path, self.key + "\n" + text)


class _Tap:
    """A text stream that passes everything on and keeps a copy."""

    def __init__(self, stream):
        self.stream = stream
        self.parts: list[str] = []

    def write(self, text):
        if isinstance(text, str):
            self.parts.append(text)
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _terminal() -> tuple[int, int] | None:
    try:
        return tuple(os.get_terminal_size(sys.__stdout__.fileno()))
    except (OSError, ValueError, AttributeError):
        return None


def _code() -> list[tuple[str, int, int]]:
    """The files the help text comes from: miniswe's own and typer's (with the click it vendors or needs)."""
    roots = [os.path.dirname(os.path.abspath(__file__))]
    for name in ("typer", "click"):
        for entry in sys.path:
            candidate = os.path.join(entry or ".", name)
            if os.path.isfile(os.path.join(candidate, "__init__.py")):
                roots.append(os.path.abspath(candidate))
                break
    files = []
    for root in roots:
        stack = [root]
        while stack:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name != "__pycache__":
                            stack.append(entry.path)
                    elif entry.name.endswith(".py"):
                        stat = entry.stat()
                        files.append((entry.path, stat.st_mtime_ns, stat.st_size))
    return sorted(files)
