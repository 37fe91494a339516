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


def test_a_document_in_pieces_is_written_whole_or_not_at_all(tmp_path):
    # a trajectory is saved as its encoded pieces (writev, never joined); a write the kernel cuts short (here a
    # file size limit, as a full disk would) must finish piece by piece or fail, leaving the last version whole
    import subprocess
    import sys

    path = tmp_path / "record.json"
    script = f"""
import resource, signal, sys
from miniswe.atomic import SwapFile
swap = SwapFile({str(path)!r})
swap.write([b"old " * 10, b"version"])
swap.write([b"a" * 3000, b"b" * 3000, b"c" * 100])  # past no limit yet: three pieces, one file
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (7000, 7000))
swap.write([b"d" * 100] * 60)  # 6000 bytes: under the limit, written whole
try:
    swap.write([b"e" * 5000, b"f" * 5000])  # the kernel writes 7000 and then refuses
except OSError as error:
    print("refused", error.errno)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(atomic.__file__))})
    assert done.stdout.strip() == "refused 27", done.stderr  # EFBIG
    assert path.read_bytes() == b"d" * 6000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"], "a temporary file left"
