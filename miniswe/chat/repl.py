"""The chat REPL: reads the person's messages and slash commands, runs each message as a turn, and keeps the
session going. Ctrl-C during a turn stops that turn (its command killed, its partial output kept) and comes
back to the prompt; Ctrl-C at an empty prompt, Ctrl-D, /quit, SIGTERM or SIGHUP leave after saving."""

from __future__ import annotations

import collections
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from miniswe.chat import store
from miniswe.chat.approval import MODES, Approval
from miniswe.chat.console import Console
from miniswe.chat.editor import make_editor
from miniswe.chat.session import ChatSession
from miniswe.config import Config
from miniswe.errors import UsageError
from miniswe.signals import SignalHandlers, Stop
from miniswe.status import STOP_SIGNALS, signal_exit_code

HELP = """\
Type a task and press Enter: the agent works on it until it submits or a limit
is hit, then the conversation goes on with your next message.
  Enter sends, Ctrl+J (or Alt+Enter) adds a line, Up/Down browse the history,
  Ctrl-C stops the running step, Ctrl-D (or Ctrl-C on an empty line) leaves.
  /mode [MODE]  confirm: you approve each command (y; n and a reason for the
                model; e to edit it first); yolo: commands run unattended;
                human: you type the commands, the model is not called
  /save         keep this session under its id (it is autosaved anyway)
  /list         sessions, newest first: id, time, messages, summary
  /load ID      go on with a session (its id, a unique prefix, or autosave)
  /compact      the model summarises the conversation and goes on from that
  /clear        the model starts afresh (the session file keeps everything)
  /cost         tokens and cost so far
  /help         this help
  /quit         leave (the session is autosaved)"""

COMMANDS = ("save", "list", "load", "compact", "clear", "mode", "cost", "help", "quit", "exit")


class Leave(Exception):
    """End the chat: `code` is the process exit code."""

    def __init__(self, code: int = 0):
        super().__init__(code)
        self.code = code


def chat(config: Config, mode: str, renderer: Any = None) -> int:
    """Run the REPL until the person leaves; the process exit code."""
    console = Console()
    stop = Stop()
    editor = make_editor(store.history_path(), console.color, notice=console.notice)
    approval = Approval(editor, console, stop, mode)
    session = ChatSession(config, stop=stop, renderer=renderer, hooks=[console, approval], notify=console.notice,
                          on_delta=console.delta, ask=approval.policy_ask, mode=mode)
    repl = Repl(session, editor, console, approval, stop)
    try:
        return repl.loop()
    finally:
        try:
            session.close()
        finally:
            if session.claimed:
                console.line(f"session autosaved: {store.autosave_path()} (/load autosave goes on with it)", "note")


class Repl:
    def __init__(self, session: ChatSession, editor: Any, console: Console, approval: Approval, stop: Stop):
        self.session = session
        self.editor = editor
        self.console = console
        self.approval = approval
        self.stop = stop
        self.loaded = False  # a session was loaded and no turn has run since

    @property
    def mode(self) -> str:
        return self.approval.mode

    def loop(self) -> int:
        self._banner()
        ahead: collections.deque[str] = collections.deque()
        with _leave_on_signals(self.editor):
            try:
                while True:
                    ahead.extend(self._typed_ahead())
                    if ahead:  # typed while the turn ran: taken one line at a time, shown as if at the prompt
                        line = ahead.popleft()
                        self.console.line(f"[{self.mode}]> {line}  (typed during the turn)", "note")
                    else:
                        try:
                            line = self.editor.read(f"[{self.mode}]> ", main=True)
                        except (KeyboardInterrupt, EOFError):
                            self.console.line("")
                            return 0
                    text = line.strip()
                    if not text:
                        continue
                    if _is_command(text):
                        self._command(text)
                    elif self.mode == "human":
                        self._guarded(lambda: self.session.act(text))
                    else:
                        self._guarded(lambda: self.session.turn(text))
            except Leave as leave:
                return leave.code

    def _typed_ahead(self) -> list[str]:
        """Whole lines typed at the terminal while a turn ran: each is its own input, not newlines in the next
        one. (The terminal keeps them line by line until read; a line not finished with Enter stays there, for
        the prompt to show.)"""
        if self.editor.name == "plain":
            return []
        typed = b""
        while select.select([sys.stdin.fileno()], [], [], 0)[0]:
            chunk = os.read(sys.stdin.fileno(), 4096)
            if not chunk:
                break
            typed += chunk
        return [line for line in typed.decode("utf-8", "replace").replace("\r", "\n").split("\n") if line.strip()]

    def _banner(self) -> None:
        model = self.session.model.describe()
        where = model.get("base_url") or model.get("script") or model.get("kind")
        cwd = self.session.env.describe().get("cwd", "")
        self.console.line(f"miniswe chat · {model.get('name') or model.get('kind')} at {where} · in {cwd} · mode {self.mode}",
                          "note")
        self.console.line("Enter sends, Ctrl+J adds a line, Ctrl-C stops a step, Ctrl-D leaves; /help for more.", "note")
        if os.path.exists(store.autosave_path()):
            self.console.line("Your last session was autosaved: /load autosave goes on with it.", "note")

    def _guarded(self, work: Callable[[], Any]) -> Any:
        """Run a turn (or a compaction) with Ctrl-C, SIGTERM and SIGHUP stopping it at once; then the prompt is
        back, unless the signal was one that ends the chat."""
        steps = len(self.session.trajectory.steps)
        self.loaded = False
        try:
            with SignalHandlers(self.stop, first_urgent=True) as handlers:
                result = work()
        finally:
            self.stop.rearm()
        if self.session.trajectory.steps[steps:] or result is not None:
            self.console.outcome(result, self.session.turn_usage(), len(self.session.trajectory.steps) - steps)
        name = handlers.signal_name
        if name and name != "SIGINT":
            raise Leave(signal_exit_code(name))
        return result

    # -- slash commands --------------------------------------------------------------------------------------
    def _command(self, text: str) -> None:
        name, _, argument = text[1:].partition(" ")
        argument = argument.strip()
        handler = getattr(self, f"_do_{name.lower()}", None)
        try:
            if handler is None:
                raise UsageError(f"unknown command /{name}: /help lists them")
            handler(argument)
        except UsageError as error:
            self.console.line(str(error), "error")

    def _do_help(self, argument: str) -> None:
        self.console.line(HELP)

    def _do_quit(self, argument: str) -> None:
        raise Leave(0)

    _do_exit = _do_quit

    def _do_mode(self, argument: str) -> None:
        if not argument:
            self.console.line(f"mode {self.mode} (choose one of: {', '.join(MODES)})")
            return
        if argument not in MODES:
            raise UsageError(f"/mode {argument}: choose one of {', '.join(MODES)}")
        self.approval.mode = self.session.mode = argument
        self.console.line(f"mode {argument}" + (": type commands, the model is not called" if argument == "human" else ""),
                          "note")

    def _do_save(self, argument: str) -> None:
        session_id = self.session.save()
        self.console.line(f"saved as {session_id} ({store.session_path(session_id)})", "note")

    def _do_list(self, argument: str) -> None:
        sessions = store.list_sessions()
        if not sessions:
            self.console.line("no saved sessions yet", "note")
            return
        width = max(len(s.id) for s in sessions)
        for s in sessions:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.mtime))
            self.console.line(f"{s.id:<{width}}  {when}  {s.messages:>4} messages  {s.summary}")

    def _do_load(self, argument: str) -> None:
        if not argument:
            raise UsageError("/load ID: give a session id (or a unique prefix, or autosave); /list shows them")
        loaded, kept = self.session.load(argument)
        self.loaded = True
        if kept:
            self.console.line(f"this session was saved as {kept} first", "note")
        trajectory = self.session.trajectory
        recorded_cwd = (trajectory.resumes[-1].get("changes") or {}).get("environment.cwd")
        self.console.line(f"loaded {loaded}: {len(trajectory.messages)} messages, {len(trajectory.steps)} steps; "
                          f"{(trajectory.session or {}).get('summary', '')}", "note")
        if recorded_cwd and recorded_cwd[0]:
            self.console.line(f"it ran in {recorded_cwd[0]}; commands now run in {recorded_cwd[1]}", "note")

    def _do_compact(self, argument: str) -> None:
        before = self.session.context_size()
        failed = self._guarded(self.session.compact)
        if failed is not None:
            return
        self.console.line(self.session.agent.messages[-1]["content"].strip(), "reasoning")
        self.console.line(f"compacted: the model now sees {self.session.context_size()} messages instead of {before}; "
                          "the session file keeps them all", "note")

    def _do_clear(self, argument: str) -> None:
        self.session.clear()
        self.console.line("cleared: the next message starts afresh (the session file keeps the history)", "note")

    def _do_cost(self, argument: str) -> None:
        usage = self.session.trajectory.usage
        self.console.line(f"this session: {usage.model_calls} model calls, {usage.total_tokens:,} tokens "
                          f"({usage.prompt_tokens:,} prompt, {usage.completion_tokens:,} completion, "
                          f"{usage.cached_tokens:,} cached), ${usage.cost:.4f}, {usage.retries} retries")
        if self.loaded:  # the loaded session's usage is all from before: no turn of it is "the last" here
            self.console.line("last turn: none yet since /load")
            return
        turn = self.session.turn_usage()
        self.console.line(f"last turn: {turn.model_calls} model calls, {turn.total_tokens:,} tokens, ${turn.cost:.4f}")


def _is_command(text: str) -> bool:
    """`/name ...` with a known name; `/usr/bin is missing` is a message."""
    if not text.startswith("/"):
        return False
    name = text[1:].split(" ", 1)[0]
    return "/" not in name and (name.lower() in COMMANDS or name.isalpha())


class _leave_on_signals:
    """At the prompt, SIGTERM and SIGHUP end the chat (after saving); during a turn its own handlers take over."""

    def __init__(self, editor: Any):
        self.editor = editor

    def __enter__(self) -> None:
        self.previous = {}
        for name in ("SIGTERM", "SIGHUP"):
            number = STOP_SIGNALS[name]
            if signal.getsignal(number) is not signal.SIG_IGN:
                self.previous[number] = signal.signal(number, self._handle)

    def __exit__(self, *exc: object) -> None:
        for number, previous in self.previous.items():
            signal.signal(number, previous)

    def _handle(self, signum: int, frame: object) -> None:
        leave = Leave(128 + signum)
        interrupt = getattr(self.editor, "interrupt", None)
        if interrupt is not None and interrupt(leave):
            return  # the prompt being read ends with it (prompt_toolkit must not see it raised in its loop)
        raise leave
