"""A real pseudo-terminal for driving `miniswe chat` the way a person would: keys go in, and what the program
draws is run through a terminal emulator (pyte), so a test reads the screen the person would see."""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import struct
import termios
import time

import pyte

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]|\x1b\][^\x07]*\x07|[\x00-\x08\x0b-\x1f]")


class Terminal:
    def __init__(self, argv: list[str], *, env: dict[str, str], cwd: str, rows: int = 30, cols: int = 100):
        self.rows, self.cols = rows, cols
        self.screen = pyte.Screen(cols, rows)
        self.screen.write_process_input = self._answer  # the terminal's answers (cursor position reports)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = b""
        pid, fd = os.forkpty()
        if pid == 0:  # the child: the pty is its controlling terminal
            try:
                fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
                os.chdir(cwd)
                os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self.status: int | None = None

    def _answer(self, data: str) -> None:
        os.write(self.fd, data.encode())

    def pump(self, seconds: float = 0.05) -> None:
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # EIO: the child is gone
                return
            if not data:
                return
            self.raw += data
            self.stream.feed(data)

    def text(self) -> str:
        """Everything printed so far, escape codes taken out (what scrolled away too)."""
        return ANSI.sub("", self.raw.decode("utf-8", "replace").replace("\r\n", "\n"))

    def display(self) -> list[str]:
        return [line.rstrip() for line in self.screen.display]

    def wait_for(self, pattern: str, timeout: float = 30, *, screen: bool = False, count: int = 1) -> None:
        """Until `pattern` (a regex) appears `count` times in everything printed (or on the screen now)."""
        deadline = time.monotonic() + timeout
        while True:
            haystack = "\n".join(self.display()) if screen else self.text()
            if len(re.findall(pattern, haystack)) >= count:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} did not appear within {timeout}s; screen:\n" + "\n".join(self.display())
                                     + "\n--- printed:\n" + self.text()[-3000:])
            self.pump(0.1)

    def cursor_line(self) -> str:
        return self.display()[self.screen.cursor.y]

    def wait_prompt(self, pattern: str, timeout: float = 30) -> None:
        """Until the line the cursor is on is a prompt (`pattern` matching its start) waiting for input."""
        deadline = time.monotonic() + timeout
        while not (re.match(pattern + r"\s*$", self.cursor_line()) and self.reading()):
            if time.monotonic() > deadline:
                raise AssertionError(f"no prompt {pattern!r} within {timeout}s; screen:\n" + "\n".join(self.display()))
            self.pump(0.1)

    def reading(self) -> bool:
        """Whether the program reads keys one at a time (its line editor has the terminal in raw mode). Keys sent
        before then meet the terminal's line discipline, as a busy program's would: echoed, Enter turned into
        Ctrl+J, Ctrl-D taken for an end of file."""
        return not termios.tcgetattr(self.fd)[3] & termios.ICANON

    def wait_reading(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not self.reading():
            if time.monotonic() > deadline:
                raise AssertionError(f"the program did not read keys within {timeout}s; screen:\n" + "\n".join(self.display()))
            self.pump(0.05)

    def send(self, data: str | bytes, pause: float = 0.05) -> None:
        os.write(self.fd, data.encode() if isinstance(data, str) else data)
        self.pump(pause)

    def type(self, text: str) -> None:
        """Keys one at a time, as a person types."""
        for char in text:
            self.send(char, 0.005)

    def resize(self, rows: int, cols: int) -> None:
        self.rows, self.cols = rows, cols
        self.screen.resize(rows, cols)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))  # the kernel sends SIGWINCH
        self.pump(0.3)

    def wait_exit(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump(0.1)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                self.pump(0.1)
                return self.status
        raise AssertionError(f"the chat did not exit within {timeout}s; printed:\n{self.text()[-3000:]}")

    def close(self) -> None:
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.status = -9
        try:
            os.close(self.fd)
        except OSError:
            pass
