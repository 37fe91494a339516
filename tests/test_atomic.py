"""Atomic writes give the file the mode open() would, and never touch the process's umask to learn it (the
umask is per process: another thread creating a file while it was 0 made that file world-writable)."""

import importlib
import os

import pytest

from miniswe import atomic


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002, 0o027])
def test_a_written_file_gets_the_mode_open_would_give_it(tmp_path, umask):
    previous = os.umask(umask)
    try:
        with open(tmp_path / "by-open", "w") as handle:
            handle.write("x")
        atomic.write_atomic(str(tmp_path / "by-write"), "x")
        swapped = atomic.SwapFile(str(tmp_path / "by-swap"))
        swapped.write("one")
        swapped.write("two")  # the exchange path: a second version replaces the first
    finally:
        os.umask(previous)
    expected = os.stat(tmp_path / "by-open").st_mode & 0o777
    assert expected == 0o666 & ~umask
    for name in ("by-write", "by-swap"):
        assert os.stat(tmp_path / name).st_mode & 0o777 == expected, name
    assert (tmp_path / "by-swap").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["by-open", "by-swap", "by-write"], "a temporary file left"


def test_importing_and_writing_never_change_the_umask(tmp_path, monkeypatch):
    """Every os.umask call sets it: one with an argument other than the current umask is the race."""
    current = os.umask(0o022)
    calls = []
    real = os.umask
    monkeypatch.setattr(os, "umask", lambda mask: calls.append(mask) or real(mask))
    try:
        importlib.reload(atomic)
        atomic.write_atomic(str(tmp_path / "a"), "x")
        atomic.SwapFile(str(tmp_path / "b")).write("x")
    finally:
        monkeypatch.undo()
        os.umask(current)
        importlib.reload(atomic)
    assert calls == []
