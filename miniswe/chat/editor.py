"""Reading what the person types: prompt_toolkit when it is installed and both ends are a terminal, readline
when it is not, plain lines when input is not a terminal (a script piping a conversation in).

prompt_toolkit draws the prompt and the input itself, knowing every character's width, so a line longer than
the terminal wraps cleanly and redraws after a resize; readline is told which bytes of the prompt are escape
codes (\\001...\\002), the classic cause of a wrapped line drawn over the prompt. Both keep the history in the
miniswe home, edit with the arrow keys, and insert a newline with Ctrl+J (Enter sends the message).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

INSTALL_HINT = "line editing works best with prompt_toolkit: pip install -e '.[chat]' in the miniswe checkout (using readline for now)"


class PlainLines:
    """Lines from a stdin that is not a terminal: no editing, no history."""

    name = "plain"

    def read(self, prompt: str, *, default: str = "", main: bool = False) -> str:
        sys.stdout.write(prompt)
        sys.stdout.flush()
        line = sys.stdin.readline()
        if not line:
            raise EOFError
        text = line.rstrip("\n")
        return text if text or not default else default


class ToolkitEditor:
    """prompt_toolkit: multi-line input (Ctrl+J or Alt+Enter insert a newline), history in a file, a clean
    redraw at any width; Ctrl-C clears a line that has text, and leaves (KeyboardInterrupt) at an empty one."""

    name = "prompt_toolkit"

    def __init__(self, history: str, color: bool):
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory
        from prompt_toolkit.key_binding import KeyBindings

        keys = KeyBindings()

        @keys.add("c-j")
        @keys.add("escape", "enter")
        def _newline(event) -> None:
            event.current_buffer.insert_text("\n")

        main_keys = KeyBindings()

        @main_keys.add("c-c")
        def _interrupt(event) -> None:
            if event.current_buffer.text:
                event.current_buffer.reset()
            else:
                event.app.exit(exception=KeyboardInterrupt, style="class:aborting")

        from prompt_toolkit.key_binding import merge_key_bindings

        os.makedirs(os.path.dirname(history), exist_ok=True)
        self.color = color
        def continuation(width: int, line: int, wrap: int) -> str:  # a wrapped line goes on at the left edge
            return "" if wrap else "." * max(width - 1, 0) + " "

        self.main = PromptSession(history=FileHistory(history), key_bindings=merge_key_bindings([keys, main_keys]),
                                  prompt_continuation=continuation, enable_open_in_editor=True)
        self.answers = PromptSession(key_bindings=keys, prompt_continuation=continuation, enable_open_in_editor=True)

        self._app = None  # the application of the prompt being read, if one is
        self._interrupted: BaseException | None = None

    def read(self, prompt: str, *, default: str = "", main: bool = False) -> str:
        from prompt_toolkit.formatted_text import FormattedText

        text = FormattedText([("bold" if self.color else "", prompt)])
        session = self.main if main else self.answers
        self._interrupted = None
        self._app = session.app
        try:
            return session.prompt(text, default=default, pre_run=self._exit_if_interrupted)
        finally:
            self._app = None
            interrupted, self._interrupted = self._interrupted, None
            if interrupted is not None:
                raise interrupted  # noqa: B012  (it wins over the line read, or a Ctrl-C)

    def interrupt(self, exception: BaseException) -> bool:
        """From a signal handler: end the prompt being read, making `read` raise `exception`; False when no prompt
        is being read. Raising inside prompt_toolkit's loop (a redraw, a key read) would leave it hanging on
        "Press ENTER to continue...": its application is asked to exit from its own loop instead, or at its
        start (`pre_run`) if that has not come yet; a prompt that has just ended raises it on its way out."""
        app = self._app
        if app is None:
            return False
        self._interrupted = exception
        loop = app.loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._exit_if_interrupted)
            except RuntimeError:  # the loop closed: `read` raises it on its way out
                pass
        return True

    def _exit_if_interrupted(self) -> None:
        app, exception = self._app, self._interrupted
        if app is not None and exception is not None and app.future is not None and not app.future.done():
            app.exit(exception=exception)


class ReadlineEditor:
    """readline, when prompt_toolkit is missing: history in a file, Ctrl+J inserts a newline, and the prompt's
    escape codes wrapped in \\001...\\002 so a long line never overwrites it."""

    name = "readline"

    def __init__(self, history: str, color: bool):
        import readline

        self.readline = readline
        self.history = history
        self.color = color
        os.makedirs(os.path.dirname(history), exist_ok=True)
        try:
            readline.read_history_file(history)
        except OSError:
            pass
        readline.parse_and_bind(r'"\C-j": "\C-v\C-j"')  # a literal newline; Enter (\C-m) sends
        readline.parse_and_bind("set horizontal-scroll-mode off")

    def read(self, prompt: str, *, default: str = "", main: bool = False) -> str:
        readline = self.readline
        shown = f"\001\033[1m\002{prompt}\001\033[0m\002" if self.color else prompt
        readline.set_startup_hook((lambda: readline.insert_text(default)) if default else None)
        before = readline.get_current_history_length()
        try:
            with _interruptible():
                line = input(shown)
        except KeyboardInterrupt:
            if main and readline.get_line_buffer():
                print()
                return self.read(prompt, default=default, main=main)
            raise
        finally:
            readline.set_startup_hook(None)
        if main:
            try:
                readline.append_history_file(max(readline.get_current_history_length() - before, 0), self.history)
            except OSError:
                pass
        elif readline.get_current_history_length() > before:
            readline.remove_history_item(readline.get_current_history_length() - 1)  # answers are not history
        return line


@contextmanager
def _interruptible() -> Iterator[None]:
    """Ctrl-C at a readline prompt raises KeyboardInterrupt, whatever handler a running turn installed."""
    try:
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def make_editor(history: str, color: bool, notice=lambda message: None):
    """The best line editor this terminal and this installation allow."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        return PlainLines()
    try:
        import prompt_toolkit  # noqa: F401
    except ImportError:
        notice(INSTALL_HINT)
        return ReadlineEditor(history, color)
    return ToolkitEditor(history, color)
