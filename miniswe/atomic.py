"""Atomic file writes: a reader, or a `kill -9` at any moment, only ever finds a whole old or a whole new file."""

from __future__ import annotations

import ctypes
import os
import tempfile

# mkstemp creates 0600 files; ours get the mode open() would give them under the user's umask.
_UMASK = os.umask(0)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
try:
    _renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
except (OSError, AttributeError):  # not Linux, or a C library without renameat2
    _renameat2 = None


def write_atomic(path: str, data: str | bytes, *, fsync: bool = False) -> None:
    """Write a temporary file beside `path`, then rename it over `path`."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + "-", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, FILE_MODE)
        _write_all(fd, data.encode("utf-8") if isinstance(data, str) else data)
        if fsync:
            os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class SwapFile:
    """A file rewritten after every step: each version is written into a hidden twin, then the two names
    are exchanged in one atomic renameat2(RENAME_EXCHANGE).

    On ext4, renaming over an existing file flushes the new file's data first (auto_da_alloc), which made
    every save cost 0.3-0.6 ms and grow with the file; the exchange costs a few microseconds. Where the
    exchange is not supported, it falls back to write_atomic. After a `kill -9` the twin (`.NAME.swap`,
    the previous version) is left beside the file.
    """

    def __init__(self, path: str):
        self.path = path
        self.twin = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.swap")
        self._front = self._back = -1  # open on the inodes now named `path` and `twin`
        self._exchange = _renameat2 is not None

    def write(self, data: str | bytes) -> None:
        raw = data.encode("utf-8") if isinstance(data, str) else data
        if self._back >= 0 and not self._names_unchanged():
            self.close()  # someone else replaced one of the files: start over from the file as it is now
        if self._exchange and self._back < 0 and os.path.exists(self.path):
            self._front = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            self._back = os.open(self.twin, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        if self._back < 0:
            write_atomic(self.path, raw)  # the first version (nothing to exchange with yet), or no exchange here
            return
        # Overwrite, then cut to length: truncating to zero first would make ext4 flush on close after all.
        _write_all(self._back, raw, offset=0)
        os.ftruncate(self._back, len(raw))
        if _renameat2(_AT_FDCWD, os.fsencode(self.twin), _AT_FDCWD, os.fsencode(self.path), _RENAME_EXCHANGE) != 0:
            errno = ctypes.get_errno()
            self.close()
            self._exchange = False
            if errno in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: this file system cannot exchange names
                write_atomic(self.path, raw)
                return
            raise OSError(errno, f"cannot save {self.path}: {os.strerror(errno)}")
        self._front, self._back = self._back, self._front

    def _names_unchanged(self) -> bool:
        try:
            return (os.fstat(self._front).st_ino, os.fstat(self._back).st_ino) == (
                os.stat(self.path).st_ino, os.stat(self.twin).st_ino)
        except OSError:
            return False

    def close(self) -> None:
        """Release the twin; the file itself stays as last written."""
        if self._back >= 0:
            os.close(self._front)
            os.close(self._back)
            self._front = self._back = -1
            try:
                os.unlink(self.twin)
            except OSError:
                pass


def _write_all(fd: int, data: bytes, offset: int | None = None) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        if offset is not None:
            offset += written
        view = view[written:]
