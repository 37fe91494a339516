"""What miniswe prints goes through here: stdout and stderr are wrapped once, at start, so that no known secret
reaches them, and a reader that went away (`| head`, a closed terminal) ends the output, not the run."""

from __future__ import annotations

import io
import sys
from typing import TextIO

from miniswe.redaction import Secrets


# Control characters a model's reply, a command's output or a server's message may hold (ESC starts sequences
# that recolour, retitle or even write the clipboard of the terminal showing it), as visible symbols: C0 as its
# Control Picture, DEL and C1 as \xNN. Everything miniswe shows of them goes through `visible`; miniswe's own
# colours are added after.
_VISIBLE = {**{code: chr(0x2400 + code) for code in range(32) if chr(code) not in "\t\n"}, 0x7F: "\u2421",
            **{code: f"\\x{code:02x}" for code in range(0x80, 0xA0)}}


def visible(text: str) -> str:
    """`text` safe to print on a terminal: line breaks and tabs kept, every other control character shown."""
    return text.replace("\r\n", "\n").translate(_VISIBLE)


class GuardedStream(io.TextIOBase):
    """A text stream that masks the run's secrets in everything written, and goes quiet, for good, when
    writing fails (EPIPE, EIO): the run goes on and still records its end."""

    def __init__(self, stream: TextIO, secrets: Secrets):
        self.stream = stream
        self.secrets = secrets
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                self.stream.write(self.secrets.scrub(text) if self.secrets else text)
            except (OSError, ValueError):  # ValueError: the stream was closed under us
                self.broken = True
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                self.broken = True

    def isatty(self) -> bool:
        try:
            return not self.broken and self.stream.isatty()
        except ValueError:
            return False

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")

    @property
    def errors(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "errors", None) or "strict"  # input() needs it to use readline on a terminal

    def writable(self) -> bool:
        return True


SECRETS = Secrets()  # every secret known to this process so far, masked on both streams


def guard_streams() -> None:
    """Wrap sys.stdout and sys.stderr (once)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, GuardedStream):
            setattr(sys, name, GuardedStream(stream, SECRETS))


def add_secrets(secrets: Secrets) -> None:
    """Mask these values on stdout and stderr from now on; say once which ones are too short to mask."""
    fresh = [where for where in secrets.short if where not in SECRETS.short]
    SECRETS.update(secrets)
    for where in fresh:
        print(f"miniswe: warning: the secret value of {where} is shorter than 8 characters: it is masked in "
              "recorded configs and command lines, but cannot be masked safely in command output", file=sys.stderr)


class PieceMasker:
    """Masking for text that arrives in pieces (a streamed reply): a secret split across pieces is masked too.
    `feed` gives back what may be shown now, masked, holding back only a tail that may be the start of a secret
    (so ordinary text is not delayed); `flush`, at the end of the stream, gives back that tail."""

    def __init__(self, secrets: Secrets | None = None):
        self.secrets = SECRETS if secrets is None else secrets
        self.held = ""

    def feed(self, text: str) -> str:
        text = self.held + text
        if not self.secrets:
            self.held = ""
            return text
        text = self.secrets.scrub(text)
        keep = _secret_start(text, self.secrets.values)
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        text, self.held = self.held, ""
        return self.secrets.scrub(text) if self.secrets else text


def _secret_start(text: str, secrets: list[str]) -> int:
    """The length of the longest end of `text` that some secret begins with (but is not all of)."""
    longest = max((len(secret) for secret in secrets), default=0)
    for size in range(min(len(text), longest - 1), 0, -1):
        tail = text[-size:]
        if any(len(secret) > size and secret.startswith(tail) for secret in secrets):
            return size
    return 0
