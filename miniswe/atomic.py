"""Atomic file writes: a reader, or a `kill -9` at any moment, only ever finds a whole old or a whole new file."""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import stat

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
try:
    _renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
except (OSError, AttributeError):  # not Linux, or a C library without renameat2
    _renameat2 = None


def check_replaceable(path: str) -> bool:
    """Only a regular file is ever replaced: renaming over a FIFO, a socket or a device node (`-o /dev/full`
    as root) would take its name away. Whether there is one (one stat: this runs before every save)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if not os.path.lexists(path):
            return False
        mode = 0  # a link to nothing
    if not stat.S_ISREG(mode):
        raise OSError(errno.EEXIST, f"{path} exists and is not a regular file; miniswe will not replace it")
    return True


Data = str | bytes | list[bytes]  # a list: its pieces written one after the other, never joined in memory


def write_atomic(path: str, data: Data, *, fsync: bool = False) -> None:
    """Write a temporary file beside `path`, then rename it over `path` (a regular file, or none yet)."""
    check_replaceable(path)
    tmp = _temporary_copy(path, data, fsync=fsync)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


class SwapFile:
    """A file rewritten after every step (the trajectory): each version goes to a fresh temporary file,
    which then trades names with the current one in one atomic renameat2(RENAME_EXCHANGE); the old
    version is unlinked.

    On ext4, renaming over an existing file first flushes the new file's data (auto_da_alloc): 0.3-0.6 ms
    a save, growing with the file. An exchange replaces nothing, so it skips that flush: about 0.1 ms.
    No file is ever modified in place, so a reader holding an old version open keeps reading it whole.
    Where the exchange is not supported, it falls back to a plain rename.
    """

    def __init__(self, path: str):
        self.path = path
        self._exchange = _renameat2 is not None

    def write(self, data: Data) -> None:
        if not (check_replaceable(self.path) and self._exchange):
            write_atomic(self.path, data)  # the first version: nothing to exchange with yet
            return
        tmp = _temporary_copy(self.path, data)
        if _renameat2(_AT_FDCWD, os.fsencode(tmp), _AT_FDCWD, os.fsencode(self.path), _RENAME_EXCHANGE) == 0:
            _unlink(tmp)  # now the previous version
            return
        code = ctypes.get_errno()
        if code not in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: this file system cannot exchange names
            _unlink(tmp)
            raise OSError(code, f"cannot save {self.path}: {os.strerror(code)}")
        self._exchange = False
        try:
            os.replace(tmp, self.path)
        except BaseException:
            _unlink(tmp)
            raise


def _temporary_copy(path: str, data: Data, *, fsync: bool = False) -> str:
    """A new hidden file beside `path` holding `data`, with the mode open() would give it; its name."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = _create_beside(directory, os.path.basename(path))
    try:
        _write_all(fd, data.encode("utf-8") if isinstance(data, str) else data)
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink(tmp)
        raise
    os.close(fd)
    return tmp


def _create_beside(directory: str, name: str) -> tuple[int, str]:
    """A new, exclusively created file in `directory`: its descriptor and path. Created with 0666 like open()
    does, so the kernel applies the umask and the folder's default ACL; mkstemp's 0600 would need the umask read
    back, and os.umask can only read it by setting it, for every thread at once."""
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}-{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name beside {name} in {directory}; remove its "
                          f".{name}-*.tmp files")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _write_all(fd: int, data: bytes | list[bytes]) -> None:
    """All of `data`; a list through writev, 1024 pieces a call: a trajectory is hundreds of encoded messages,
    and joining them first copied the whole file (twice) at every save."""
    pieces = [data] if isinstance(data, bytes) else data
    for start in range(0, len(pieces), 1024):
        batch = pieces[start:start + 1024]
        written = os.writev(fd, batch)
        if written < sum(map(len, batch)):  # cut short (a signal, a full disk): the rest, piece by piece
            view = memoryview(b"".join(batch))[written:]
            while view:
                view = view[os.write(fd, view):]
