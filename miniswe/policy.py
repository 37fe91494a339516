"""The command policy: commands refused before they run (and the model told why), commands that need a person's
yes, and whether local commands are confined to the working directory.

The built-in rules read a command as bash would: split into simple commands (at `;`, `&&`, `||`, `|`, `&`,
newlines, subshells and command substitutions), with redirections, quotes, escapes, leading assignments and
wrappers (`sudo`, `env`, `timeout 5`, `xargs`, ...) taken off, and the text given to `bash -c`, `sh -c`, `eval`,
`su -c` or a shell's here-document read as commands too. Then each rule looks at what runs: the command, its
options anywhere in the arguments (`-rf`, `-R`, `--recursive`, after the operands), and the paths it names (`~`,
`$HOME`, `/*`, `~/..` and a tracked `cd /`, `D=/` resolved).

It is still not a sandbox: a script file, a variable from elsewhere, `python -c` or a command downloaded and run
gets past it. It stops the obvious accident; a container stops the rest. Confinement (`policy.confine`, in
environments/spawner.py) is enforced by the kernel (Landlock, namespaces), not by reading commands.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from miniswe.config import PolicyConfig

# What expansion puts into a word's value, kept apart from the same characters quoted: `"*"` and `'$HOME'` are
# text, `*` and `$HOME` are not. Private-use characters, so no command's own text is taken for them.
HOME, UNKNOWN, STAR, QMARK, BRACKET, LBRACE, COMMA, RBRACE, SPLIT = (chr(0xE000 + i) for i in range(9))
_PLAIN = str.maketrans({STAR: "*", QMARK: "?", BRACKET: "[", LBRACE: "{", COMMA: ",", RBRACE: "}", SPLIT: " "})
_GLOB = STAR + QMARK + BRACKET
_HOME_PATH = f"/{HOME}homes/{HOME}you"  # a home folder's place: `~/..` is every home, `~/../..` the root
_META = " \t\n;&|()<>"
_MAX_DEPTH = 32  # nested $(...) read this deep; deeper text is skipped, not judged
_MAX_SHELLS = 4  # and `bash -c "bash -c '...'"`, `eval eval ...` this deep (each level is read again whole)

# What destroys the machine when removed, or made writable for everyone, as a whole: the root, the home folder,
# the folder holding the homes, the system's top-level folders (their contents, `/etc/*`, too).
PROTECTED = {"/", f"/{HOME}homes", _HOME_PATH} | {
    "/" + name for name in "bin boot dev etc home lib lib32 lib64 libx32 media mnt opt proc root run sbin snap srv "
                           "sys usr var Applications Library System Users Volumes private".split()} | {
    "/usr/" + name for name in "bin include lib lib64 libexec local sbin share".split()} | {"/var/lib"}

_REAL_HOME = posixpath.normpath(os.path.expanduser("~")) if os.path.expanduser("~") != "~" else None

# A whole disk or partition: writing it destroys the file systems on it
_DEVICE = re.compile(r"/dev/(?:[shv]d[a-z]+\d*|xvd[a-z]+\d*|nvme\d+(?:n\d+(?:p\d+)?)?|mmcblk\d+(?:p\d+)?"
                     r"|r?disk\d+(?:s\d+)?|dm-\d+|md\d+|mapper/[^/]+|disk/by-[^/]+/[^/]+)")
_DEVICE_SAMPLES = ["sda", "sda1", "hda", "vda", "xvda", "nvme0n1", "nvme0n1p1", "mmcblk0", "mmcblk0p1", "disk0",
                   "dm-0", "md0"]
_WRITE_REDIRECTS = {">", ">>", ">|", "&>", "&>>", "<>", ">&"}
_KEYWORDS = {"!", "{", "}", "then", "do", "else", "elif", "if", "while", "until", "coproc"}
_SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "rbash"}
_STOP_VERBS = {"reboot", "poweroff", "halt", "kexec", "soft-reboot", "emergency", "rescue", "suspend", "hibernate",
               "hybrid-sleep", "suspend-then-hibernate"}
_STOP_TARGETS = {f"{verb}.target" for verb in _STOP_VERBS | {"shutdown", "sleep"}}


# --------------------------------------------------------------------------------------------- reading commands

_ANSI_C_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{1,2}|u[0-9a-fA-F]{1,4}|U[0-9a-fA-F]{1,8}|[0-7]{1,3}|c.|.)", re.S)
_ANSI_C_NAMED = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
                 "v": "\v"}


def _ansi_c(match: re.Match) -> str:
    r"""One escape of bash's $'...' quoting: `$'\x72m'` is `rm`."""
    code = match.group(1)
    if code[0] in "xuU" and len(code) > 1:
        return chr(min(int(code[1:], 16), 0x10FFFF))
    if code[0] in "01234567":
        return chr(int(code, 8) & 0xFF)
    if code[0] == "c" and len(code) > 1:
        return chr(ord(code[1]) & 0x1F)
    return _ANSI_C_NAMED.get(code, code)


@dataclass
class _Command:
    """One simple command as bash would run it: its words' values, its redirections, its here-documents."""
    words: list[str] = field(default_factory=list)
    assignment: list[bool] = field(default_factory=list)  # per word: NAME=value
    redirects: list[tuple[str, str]] = field(default_factory=list)
    stdin: list[str] = field(default_factory=list)  # here-document and here-string texts
    piped: bool = False  # its input is the previous command's output


class _Lexer:
    """Reads bash text into simple commands, in one pass (linear time: each character is read once).

    script() returns the text's commands in order; `substitutions` then holds those of each `$(...)`,
    backquote and `<(...)`, which run too. Variables assigned on their own (`D=/; rm -rf $D`) are followed."""

    def __init__(self, text: str, depth: int = 0):
        self.s, self.i, self.n = text, 0, len(text)
        self.depth = depth
        self.closers: list[str] = []  # the substitutions the cursor is in: inside backquotes, one ends a word
        self.vars: dict[str, str] = {}
        self.substitutions: list[list[_Command]] = []
        self.sources: list[str] = []  # each substitution's text, for the rules that read text
        self.heredocs: list[tuple[str, bool, bool, _Command]] = []  # delimiter, strip tabs, expand, command

    def script(self, closer: str | None = None) -> list[_Command]:
        """Commands until `closer` (`)` of a `$(`, a backquote) or the end."""
        s, commands, contexts = self.s, [], []
        command, piped = _Command(), False

        def end(pipe: bool = False) -> None:
            nonlocal command, piped
            if command.words or command.redirects or command.stdin:
                command.piped = piped
                self._remember_assignments(command)
                commands.append(command)
            command, piped = _Command(), pipe

        while self.i < self.n:
            c = s[self.i]
            if c in " \t":
                self.i += 1
            elif s.startswith("\\\n", self.i):
                self.i += 2
            elif c == "\n":
                self.i += 1
                end()
                self._read_heredocs()
            elif c == "#":
                while self.i < self.n and s[self.i] != "\n":
                    self.i += 1
            elif closer == "`" and c == "`":
                self.i += 1
                break
            elif c == ";":
                while self.i < self.n and s[self.i] in ";&":
                    self.i += 1
                end()
            elif c == "&" and not s.startswith("&>", self.i):
                self.i += 2 if s.startswith("&&", self.i) else 1
                end()
            elif c == "|":
                pipe = not s.startswith("||", self.i)
                self.i += 1 if pipe and not s.startswith("|&", self.i) else 2
                end(pipe)
            elif c == "(":
                self.i += 1
                end()
                contexts.append("(")
            elif c == ")":
                self.i += 1
                if contexts and contexts[-1] == "case":
                    command = _Command()  # a case pattern, not a command
                elif contexts:
                    contexts.pop()
                    end()
                elif closer == ")":
                    break
                else:
                    end()
            elif (c in "<>" and not s.startswith("(", self.i + 1)) or c == "&":
                self._redirect(command)
            else:
                start = self.i
                value, assignment = self._word()
                if self.i == start:
                    self.i += 1  # a character no word can start with here (a stray backquote): skipped
                    continue
                if not command.words and s[start:self.i] in _KEYWORDS:
                    continue  # `then rm`, `{ D=/; ...`: the command (or assignment) is what follows
                if self.i < self.n and s[self.i] in "<>" and re.fullmatch(r"\d+|\{\w+\}", _plain(value)):
                    continue  # a file descriptor: `2>`, `{fd}>`
                if not command.words and value == "case":
                    contexts.append("case")
                elif not command.words and value == "esac" and "case" in contexts:
                    while contexts.pop() != "case":
                        pass
                command.words.append(value)
                command.assignment.append(assignment)
        end()
        return commands

    # -- words

    def _word(self) -> tuple[str, bool]:
        """The word at the cursor: its value (quotes removed, expansions marked) and whether it is NAME=value."""
        s, value, quoted, assignment, checked = self.s, [], False, False, False
        start = self.i
        while self.i < self.n:
            c = s[self.i]
            if c in _META:
                if c == "(" and assignment and s[self.i - 1] == "=":  # an array: a=(1 2)
                    self._skip_balanced("(", ")")
                    value.append(UNKNOWN)
                    continue
                if c in "<>" and self.i + 1 < self.n and s[self.i + 1] == "(" and self.i == start:
                    self.i += 2
                    self._substitution(")")  # <(cmd), >(cmd): a path to its output
                    value.append(UNKNOWN)
                    continue
                break
            if c == "`":
                if self.closers and self.closers[-1] == "`":
                    break
                self.i += 1
                self._substitution("`")
                value.append(UNKNOWN)
            elif c == "\\":
                if s.startswith("\\\n", self.i):
                    self.i += 2
                    continue
                value.append(s[self.i + 1:self.i + 2])
                self.i += 2
                quoted = True
            elif c == "'":
                close = s.find("'", self.i + 1)
                close = self.n if close < 0 else close
                value.append(s[self.i + 1:close])
                self.i = close + 1
                quoted = True
            elif c == '"':
                self.i += 1
                self._double(value, '"')
                quoted = True
            elif c == "$":
                quoted = self._dollar(value, in_double=False) or quoted
            elif c == "~" and (self.i == start or (assignment and s[self.i - 1] in "=:")):
                value.append(self._tilde())
            elif c == "=" and not checked:
                checked = True  # only a word's first `=` can make it an assignment
                assignment = not quoted and bool(re.fullmatch(r"[A-Za-z_]\w*\+?", "".join(value)))
                value.append("=")
                self.i += 1
            else:
                value.append({"*": STAR, "?": QMARK, "[": BRACKET, "{": LBRACE, ",": COMMA, "}": RBRACE}.get(c, c))
                self.i += 1
        return "".join(value), assignment

    def _tilde(self) -> str:
        """`~` or `~user` followed by `/` or the word's end is a home folder; otherwise a plain `~`."""
        match = re.compile(r"~[\w.-]*").match(self.s, self.i)
        after = self.s[match.end():match.end() + 1]
        if after in ("", "/", ":", "`") or after in _META:
            self.i = match.end()
            return self.vars.get("HOME", HOME)
        self.i += 1
        return "~"

    def _double(self, value: list[str], closer: str | None) -> None:
        """Inside double quotes (or a here-document's body, `closer` None): only `$`, backquotes and some
        backslashes are special."""
        s = self.s
        while self.i < self.n and s[self.i] != closer:
            c = s[self.i]
            if c == "\\" and self.i + 1 < self.n and s[self.i + 1] in '$`"\\\n':
                value.append("" if s[self.i + 1] == "\n" else s[self.i + 1])
                self.i += 2
            elif c == "$" and not s.startswith("$'", self.i):
                self._dollar(value, in_double=True)
            elif c == "`":
                self.i += 1
                self._substitution("`")
                value.append(UNKNOWN)
            else:
                value.append(c)
                self.i += 1
        self.i += 1

    def _dollar(self, value: list[str], *, in_double: bool) -> bool:
        """An expansion at `$`: its value, or UNKNOWN. Whether it was quoting (`$'...'`, `$"..."`)."""
        s, i = self.s, self.i
        if s.startswith("$'", i):
            close = i + 2
            while close < self.n and s[close] != "'":
                close += 2 if s[close] == "\\" else 1
            raw, self.i = s[i + 2:close], close + 1
            value.append(_ANSI_C_ESCAPE.sub(_ansi_c, raw))
            return True
        if s.startswith('$"', i):
            self.i += 2
            self._double(value, '"')
            return True
        if s.startswith("$((", i):
            self.i += 1
            self._skip_balanced("(", ")")
            value.append(UNKNOWN)
        elif s.startswith("$(", i):
            self.i += 2
            self._substitution(")")
            value.append(UNKNOWN)
        elif s.startswith("${", i):
            self.i += 1
            start = self.i
            self._skip_balanced("{", "}")
            inner = s[start + 1:self.i - 1]
            name = re.match(r"[A-Za-z_]\w*", inner)
            plain = name and (inner == name.group() or re.match(r"[:]?[-=?%]", inner[name.end():]))
            value.append(self._variable(name.group(), in_double) if plain else UNKNOWN)
        elif (name := re.compile(r"[A-Za-z_]\w*").match(s, i + 1)):
            self.i = name.end()
            value.append(self._variable(name.group(), in_double))
        elif i + 1 < self.n and (s[i + 1].isdigit() or s[i + 1] in "@*#?$!-"):
            self.i += 2
            value.append(UNKNOWN)
        else:
            self.i += 1
            value.append("$")
        return False

    def _variable(self, name: str, in_double: bool) -> str:
        if name not in self.vars:
            if name == "IFS" and not in_double:
                return SPLIT  # `rm$IFS-rf$IFS/` is three words
            return HOME if name == "HOME" else UNKNOWN
        known = self.vars[name]
        # unquoted, a value is split into words and its `*` globbed
        return known if in_double else known.translate(
            {ord(" "): SPLIT, ord("\t"): SPLIT, ord("\n"): SPLIT, ord("*"): STAR, ord("?"): QMARK, ord("["): BRACKET})

    def _remember_assignments(self, command: _Command) -> None:
        words, flags = command.words, command.assignment
        if words and words[0] in ("export", "declare", "local", "readonly", "typeset"):
            words, flags = words[1:], flags[1:]
        if words and all(flags):
            for word in words:
                name, _, known = word.partition("=")
                self.vars[name.rstrip("+")] = known

    # -- nesting

    def _substitution(self, closer: str) -> None:
        """A command substitution from the cursor (past its opening) to its `closer`: its commands are read."""
        if self.depth >= _MAX_DEPTH:
            if closer == "`":
                close = self.s.find("`", self.i)
                self.i = self.n if close < 0 else close + 1
            else:
                self.i -= 1
                self._skip_balanced("(", ")")
            return
        self.depth += 1
        self.closers.append(closer)
        start = self.i
        self.substitutions.append(self.script(closer))
        self.sources.append(self.s[start:self.i - 1])
        self.closers.pop()
        self.depth -= 1

    def _skip_balanced(self, opening: str, closing: str) -> None:
        """From an `opening` at the cursor past its matching `closing` (quotes skipped), without reading it."""
        s, level = self.s, 0
        while self.i < self.n:
            c = s[self.i]
            if c == "\\":
                self.i += 2
                continue
            if c in "'\"":
                close = s.find(c, self.i + 1)
                self.i = self.n if close < 0 else close + 1
                continue
            self.i += 1
            if c == opening:
                level += 1
            elif c == closing:
                level -= 1
                if level <= 0:
                    return

    # -- redirections and here-documents

    def _redirect(self, command: _Command) -> None:
        match = re.compile(r"&>>|&>|<<<|<<-|<<|<>|<&|>>|>\||>&|<|>").match(self.s, self.i)
        operator = match.group()
        self.i = match.end()
        while self.i < self.n and self.s[self.i] in " \t":
            self.i += 1
        if self.i >= self.n or self.s[self.i] in _META:
            return
        raw_start = self.i
        target, _ = self._word()
        if operator in ("<<", "<<-"):
            quoted = any(q in self.s[raw_start:self.i] for q in "'\"\\")
            self.heredocs.append((target, operator == "<<-", not quoted, command))
        elif operator == "<<<":
            command.stdin.append(target)
        elif not (operator in (">&", "<&") and re.fullmatch(r"\d*-?", target)):
            command.redirects.append((operator, target))

    def _read_heredocs(self) -> None:
        """After a line that opened here-documents, their bodies, up to each delimiter line."""
        pending, self.heredocs = self.heredocs, []
        for delimiter, strip, expand, command in pending:
            start = self.i
            while self.i < self.n:
                close = self.s.find("\n", self.i)
                close = self.n if close < 0 else close
                line = self.s[self.i:close]
                self.i = min(close + 1, self.n)
                if (line.lstrip("\t") if strip else line) == delimiter:
                    body = self.s[start:close - len(line)]
                    break
            else:
                body = self.s[start:]
            if expand:  # $(...) in an unquoted here-document runs
                reader = _Lexer(body, self.depth + 1)
                reader.vars = self.vars
                value: list[str] = []
                reader._double(value, None)
                self.substitutions += reader.substitutions
                self.sources += reader.sources
                body = "".join(value)
            command.stdin.append(body)


# ------------------------------------------------------------------------------------------------ resolving

def _plain(value: str) -> str:
    return value.translate(_PLAIN)


def _braces(value: str, limit: int = 256) -> list[str]:
    """Brace expansion: `/{etc,usr}` is `/etc /usr` (a word with too many alternatives stays one word)."""
    if LBRACE not in value or value.count(LBRACE) > 64:
        return [value]
    pending, done = [value], []
    while pending:
        word = pending.pop()
        span = _brace_span(word)
        if span is None:
            done.append(word)
        else:
            start, cuts, stop = span
            pending += [word[:start] + word[a + 1:b] + word[stop + 1:] for a, b in zip(cuts, cuts[1:])]
        if len(pending) + len(done) > limit:
            return [value]
    return done[::-1]


def _brace_span(word: str) -> tuple[int, list[int], int] | None:
    """The first `{a,b}` in `word`: its opening, the positions of its top-level commas (with the braces), close."""
    for start, c in enumerate(word):
        if c != LBRACE:
            continue
        level, cuts = 0, [start]
        for index in range(start, len(word)):
            if word[index] == LBRACE:
                level += 1
            elif word[index] == RBRACE:
                level -= 1
                if level == 0:
                    if len(cuts) > 1:
                        return start, cuts + [index], index
                    break
            elif word[index] == COMMA and level == 1:
                cuts.append(index)
    return None


def _resolve(value: str, cwd: str | None) -> str | None:
    """The absolute, normalized path a word names, or None when it cannot be known (a variable, a relative path
    in the working directory)."""
    if UNKNOWN in value or not value:
        return None
    path = value.replace(HOME, _HOME_PATH)
    if not path.startswith("/"):
        if cwd is None:
            return None
        path = cwd + "/" + path
    return posixpath.normpath(re.sub("/+", "/", path))


def _protected(value: str, cwd: str | None) -> str | None:
    """The path `value` names (`/*` with its glob) if it is a protected folder or all of one's contents
    (`/*`, `~/.*`); None if not."""
    path = _resolve(value, cwd)
    if path is None:
        return None
    whole = path
    while path != "/" and _all_glob(posixpath.basename(path)):
        path = posixpath.dirname(path)
    if path not in PROTECTED and path != _REAL_HOME and not re.fullmatch(r"/(?:home|Users)/[^/]+", _plain(path)):
        return None
    return _plain(whole)


def _all_glob(name: str) -> bool:
    """A pattern matching every name in a folder (`*`, `.*`, `.??*`, `[a-z]*`), not some (`*.pyc`)."""
    if not any(g in name for g in _GLOB):
        return False
    inside = False
    for c in name:
        if c == BRACKET:
            inside = True
        elif inside:
            inside = c != "]"
        elif c not in _GLOB + ".":
            return False
    return True


def _is_device(value: str, cwd: str | None) -> bool:
    path = _resolve(value, cwd)
    if path is None:
        return False
    if _DEVICE.fullmatch(_plain(path)):
        return True
    folder, name = posixpath.split(path)
    if folder == "/dev" and any(g in name for g in _GLOB):
        pattern = re.escape(name).replace(STAR, ".*").replace(QMARK, ".").replace(BRACKET, "[")
        pattern = pattern.replace(r"\]", "]").replace(r"\-", "-").replace("[!", "[^")
        try:
            return any(re.fullmatch(pattern, sample) for sample in _DEVICE_SAMPLES)
        except re.error:
            return False
    return False


def _options(args: list[str], with_argument: str = "", long_with_argument: tuple[str, ...] = (), *,
             start: int = 0, permute: bool = True) -> tuple[list[tuple[str, str | None]], list[str], int]:
    """GNU-style options from args[start:]: each option with its argument, the operands, and the index after
    them. With `permute`, an option may follow an operand; without (a wrapper, whose options end at its
    command), the operands are left out and the index is the first operand's."""
    options, operands, index = [], [], start
    while index < len(args):
        arg = _plain(args[index])
        index += 1
        if arg == "--":
            return options, (operands + args[index:]) if permute else [], index
        if arg.startswith("--"):
            name, equals, argument = arg.partition("=")
            if not equals and any(long.startswith(name[2:]) and len(name) > 3 for long in long_with_argument):
                argument, index = (args[index] if index < len(args) else ""), index + 1
            options.append((name, argument if equals or argument else None))
        elif arg.startswith("-") and len(arg) > 1:
            for position, letter in enumerate(arg[1:], 2):
                if letter in with_argument:
                    argument = arg[position:]
                    if not argument:
                        argument, index = (args[index] if index < len(args) else ""), index + 1
                    options.append(("-" + letter, argument))
                    break
                options.append(("-" + letter, None))
        elif permute:
            operands.append(args[index - 1])
        else:
            return options, [], index - 1
    return options, operands, index


def _has(options: list[tuple[str, str | None]], short: str, long: str = "") -> bool:
    return any(name == short or (long and name.startswith("--") and len(name) > 4 and long.startswith(name[2:]))
               for name, _ in options)


# wrapper: (options that take an argument, long ones that do, operands before the command)
_WRAPPERS = {
    "sudo": ("CDghpRrTtUu", ("chdir", "chroot", "close-from", "command-timeout", "group", "host", "other-user",
                             "prompt", "role", "type", "user"), 0),
    "doas": ("uC", (), 0), "env": ("uCS", ("unset", "chdir", "split-string"), 0), "command": ("", (), 0),
    "builtin": ("", (), 0), "exec": ("a", (), 0), "nohup": ("", (), 0), "nice": ("n", ("adjustment",), 0),
    "ionice": ("cnpPu", ("class", "classdata", "pid", "pgid", "uid"), 0), "setsid": ("", (), 0),
    "stdbuf": ("ioe", ("input", "output", "error"), 0), "timeout": ("sk", ("signal", "kill-after"), 1),
    "xargs": ("aEdILnPs", ("arg-file", "delimiter", "max-args", "max-procs", "max-chars", "process-slot-var"), 0),
    "time": ("of", ("output", "format"), 0), "taskset": ("", (), 1), "chrt": ("T", (), 1),
    "flock": ("wEc", ("timeout", "conflict-exit-code", "command"), 1), "unbuffer": ("", (), 0),
    "strace": ("abeEIoOpPsSuUX", (), 0), "ltrace": ("aAeEnopsSu", (), 0), "busybox": ("", (), 0),
    "watch": ("nd", ("interval",), 0), "runuser": ("ugGc", ("user", "group", "command"), 0),
    "su": ("cgGs", ("command", "group", "shell"), 0),
}


def _unwrap(words: list[str]) -> tuple[list[str], list[str], bool]:
    """The command that actually runs: (its argv, shell texts it runs, whether it reads its input as shell
    commands or, after xargs, as more arguments: then the argv ends with an empty word)."""
    argv: list[str] = []
    for word in words:
        for expanded in _braces(word):
            argv += [part for part in expanded.split(SPLIT) if part] if SPLIT in expanded else [expanded]
    index = 0
    while index < len(argv):
        name = posixpath.basename(_plain(argv[index]))
        if name == "eval":
            return [], [" ".join(map(_plain, argv[index + 1:]))], False
        if name in _SHELLS:
            options, _, first = _options(argv, "oO", ("rcfile", "init-file"), start=index + 1, permute=False)
            if any("c" in flag for flag, _ in options if not flag.startswith("--")):
                return [], [_plain(argv[first])] if first < len(argv) else [], False
            return [], [], first >= len(argv)  # no script file: it reads commands from its input
        if name not in _WRAPPERS:
            break
        with_argument, long_with_argument, skip = _WRAPPERS[name]
        options, _, first = _options(argv, with_argument, long_with_argument, start=index + 1, permute=False)
        if name in ("su", "runuser"):  # `su root -c CMD`: options after the user
            options = _options(argv, with_argument, long_with_argument, start=index + 1)[0]
        given = {flag: value for flag, value in options}
        if name in ("su", "runuser") and ("-c" in given or "--command" in given):
            return [], [_plain(given.get("-c") or given.get("--command") or "")], False
        if name == "su" or (name == "runuser" and "-u" not in given and "--user" not in given):
            return [], [], False  # a login shell reading its terminal
        if name == "env" and ("-S" in given or "--split-string" in given):
            split = given.get("-S") or given.get("--split-string") or ""
            return [], [" ".join([_plain(split)] + [_plain(word) for word in argv[first:]])], False
        if (name == "command" and ({"-v", "-V"} & set(given))) or (name in ("ionice", "taskset", "chrt", "strace")
                                                                    and {"-p", "-P", "-u", "--pid"} & set(given)):
            return [], [], False  # looks a command up, or acts on running processes
        if name == "flock" and ("-c" in given or "--command" in given):
            return [], [_plain(given.get("-c") or given.get("--command") or "")], False
        if name == "watch":
            return [], [" ".join(map(_plain, argv[first:]))], False  # watch runs its arguments with sh -c
        if name == "xargs" and not {"-a", "--arg-file"} & set(given):
            argv.append("")  # its input words go last
        index = first + skip
        while index < len(argv) and name in ("sudo", "env", "doas") and re.match(r"[A-Za-z_]\w*=", argv[index]):
            index += 1
        if name == "flock" and index < len(argv) and _plain(argv[index]) in ("-c", "--command"):
            return [], [_plain(argv[index + 1]) if index + 1 < len(argv) else ""], False
    return argv[index:], [], False


# --------------------------------------------------------------------------------------------------- judging

def _command_rules(name: str, args: list[str], cwd: str | None) -> list[str]:
    """The built-in rules this command (its name and arguments) breaks."""
    broken = []
    if name == "rm":
        if any(_protected(target, cwd) for target in _options(args)[1]):
            broken.append("delete-root-or-home")
    elif name in ("chmod", "chown", "chgrp", "setfacl", "chattr"):
        if name == "chmod":  # `-w`, `-x` are modes, not options
            options, operands, ended = [], [], False
            for arg in args:
                plain = _plain(arg)
                if not ended and plain == "--":
                    ended = True
                elif not ended and re.fullmatch(r"-[cfvR]+|--\w[\w-]*(=.*)?", plain):
                    options.append((plain.partition("=")[0], None))
                else:
                    operands.append(arg)
        else:
            options, operands, _ = _options(args, "mMxX" if name == "setfacl" else "pv" if name == "chattr" else "",
                                            ("modify", "modify-file", "remove", "remove-file", "set", "set-file"))
        recursive = any(re.fullmatch(r"-\w*R\w*", flag) for flag, _ in options) or _has(options, "", "recursive")
        given_mode = name == "setfacl" or any(flag.startswith("--ref") for flag, _ in options)
        targets = operands if given_mode else operands[1:]  # after chmod's mode, chown's owner, chattr's +i
        for target in targets:
            what = _protected(target, cwd)
            if what and (recursive or what in ("/", "/*")):
                broken.append("chmod-root")
                break
    elif re.fullmatch(r"mkfs(\..+)?|mke2fs|mkdosfs|mkntfs|mkexfatfs|mkreiserfs|newfs(_.+)?", name) or (name == "mkswap" and any(_is_device(a, cwd) for a in args)):
        broken.append("mkfs")
    elif name in ("shutdown", "reboot", "halt", "poweroff"):
        broken.append("shutdown")
    elif name in ("init", "telinit"):
        if any(_plain(a) in ("0", "6", "1", "s", "S", "single") for a in args):
            broken.append("shutdown")
    elif name in ("systemctl", "loginctl"):
        operands = {_plain(a) for a in _options(args, "tpsHMno", ("type", "property", "signal", "host", "machine",
                                                                 "lines", "output", "root"))[1]}
        if operands & _STOP_VERBS or ({"start", "isolate", "restart"} & operands and operands & _STOP_TARGETS):
            broken.append("shutdown")
    elif name == "kexec":
        if _has(_options(args)[0], "-e", "exec"):
            broken.append("shutdown")
    elif name == "kill":
        signal, targets = _kill_targets([_plain(a) for a in args])
        if -1 in targets:
            broken.append("kill-all")
        elif 1 in targets and signal not in ("0", "-0"):
            broken.append("shutdown")  # init: SIGINT reboots a systemd machine, any end of it stops a container
    elif name == "killall5":
        broken.append("kill-all")
    elif name in ("pkill", "killall"):
        options, operands, _ = _options(args, "gGPstuUFd" if name == "pkill" else "suoyn",
                                        ("signal", "user", "uid", "euid", "group", "parent", "session", "terminal"))
        by_user = any(flag in ("-u", "-U", "--user", "--uid", "--euid") for flag, _ in options)
        if (by_user and not operands) or (name == "pkill" and any(_plain(o) in (".", ".*", "^", "") for o in operands)):
            broken.append("kill-all")
    for path in _written(name, args):
        if _is_device(path, cwd):
            broken.append("raw-disk-write")
        elif _resolve(path, cwd) == "/proc/sysrq-trigger":
            broken.append("shutdown")
    return broken


def _kill_targets(args: list[str]) -> tuple[str, list[int]]:
    """kill's signal and process ids: after its signal option (`-9`, `-KILL`, `-s KILL`, `-n 9`), `-1` is every
    process."""
    index, signal = 0, ""
    if args and args[0] in ("-s", "-n", "--signal"):
        index, signal = 2, args[1] if len(args) > 1 else ""
    elif args and re.fullmatch(r"-[lL].*", args[0]):
        return "", []  # lists signals
    elif args and args[0].startswith("-") and args[0] != "--":
        index, signal = 1, args[0]
    if index < len(args) and args[index] == "--":
        index += 1
    return signal, [int(arg) for arg in args[index:] if re.fullmatch(r"-?\d{1,18}", arg)]


def _written(name: str, args: list[str]) -> list[str]:
    """The files a command writes into, by its arguments."""
    if name == "dd":
        return [arg[3:] for arg in args if _plain(arg).startswith("of=")]
    if name == "tee":
        return _options(args)[1]
    if name in ("cp", "install", "rsync"):
        options, operands, _ = _options(args, "StgmoT" if name == "install" else "St" if name != "rsync" else "eTf",
                                        ("target-directory", "suffix", "backup", "rsh", "temp-dir", "filter"))
        target = [value for flag, value in options if flag in ("-t", "--target-directory") and value]
        if target:
            return target
        return operands[-1:] if len(operands) > 1 else []
    if name == "ddrescue":
        operands = _options(args)[1]
        return operands[1:2]
    if name in ("shred", "blkdiscard", "badblocks"):
        return _options(args, "nsoctbp" if name != "badblocks" else "bcdeiopst")[1]
    if name in ("sgdisk", "sfdisk", "parted"):
        options, operands, _ = _options(args, "" if name == "parted" else "ANdnrtcu")
        reads = {"-l", "--list"} if name == "parted" else {"-l", "-d", "-J", "-s", "-V", "-p", "-i", "-v", "--list",
                                                            "--dump", "--json", "--show-size", "--verify", "--print",
                                                            "--info", "--backup"}
        writes_table = name != "parted" or bool({"mklabel", "mktable", "mkpart", "rm", "resizepart"} & set(operands))
        return operands[:1] if writes_table and not reads & {flag for flag, _ in options} else []
    if name == "wipefs":
        options, operands, _ = _options(args, "obt", ("offset", "backup", "types"))
        return operands if _has(options, "-a", "all") or _has(options, "-o", "offset") else []
    return []


@dataclass
class Reading:
    """What the built-in rules found in a command, and every shell text in it (the command, and what it hands to
    `bash -c`, `eval`, ...) for the regex rules."""
    rules: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)


def read_command(command: str) -> Reading:
    reading = Reading()
    _read(command, 0, reading)
    return reading


def _read(text: str, depth: int, reading: Reading) -> None:
    lexer = _Lexer(text, depth)
    commands = lexer.script()
    for source in [text, *lexer.sources]:  # "$(...)" is quoted text to _unquoted, and runs
        reading.texts.append(source)
        if "fork-bomb" not in reading.rules and _fork_bomb(_unquoted(source)):
            reading.rules.append("fork-bomb")
    for script in [commands, *lexer.substitutions]:
        _judge(script, depth, reading)


def _judge(commands: list[_Command], depth: int, reading: Reading) -> None:
    cwd: str | None = None  # None: the working directory, which the policy does not know
    previous: list[str] = []
    for command in commands:
        found: list[str] = []
        for operator, target in command.redirects:
            if operator in _WRITE_REDIRECTS:
                if _is_device(target, cwd):
                    found.append("raw-disk-write")
                elif _resolve(target, cwd) == "/proc/sysrq-trigger":
                    found.append("shutdown")
        first = next((i for i, assignment in enumerate(command.assignment) if not assignment), len(command.words))
        argv, texts, reads_stdin = _unwrap(command.words[first:])
        echoed = [word for word in previous[1:] if not _plain(word).startswith("-")] \
            if command.piped and previous and posixpath.basename(_plain(previous[0])) in ("echo", "printf") else []
        if reads_stdin:
            texts = list(command.stdin) + ([" ".join(map(_plain, echoed))] if echoed else [])
        if argv and argv[-1] == "":  # xargs: `echo / | xargs rm -rf`
            argv = argv[:-1] + [part for word in echoed for part in word.split(SPLIT)]
        if depth < _MAX_SHELLS:
            for inner in texts:
                _read(inner, depth + 1, reading)
        if argv:
            name = posixpath.basename(_plain(argv[0]))
            found += _command_rules(name, argv[1:], cwd)
            if name in ("cd", "pushd"):
                operands = [a for a in argv[1:] if a == "-" or not _plain(a).startswith("-")]
                cwd = _HOME_PATH if not operands else None if operands[0] == "-" else _resolve(operands[0], cwd)
        previous = argv
        reading.rules += [rule for rule in found if rule not in reading.rules]


# ------------------------------------------------------------------------------------------------- the rules

# The built-in rules, by name (policy.deny lists names and regexes; its default, config.DENY_RULES, names
# these): what each would do, for the model's refusal message. docs/security.md's table lists what each
# refuses; tests/test_policy.py refuses every row there in many spellings.
DENY = {
    "delete-root-or-home": "deletes the whole file system or the home folder (or a system folder)",
    "mkfs": "formats a disk",
    "raw-disk-write": "writes to a raw disk",
    "fork-bomb": "is a fork bomb",
    "shutdown": "stops or restarts the machine",
    "kill-all": "signals every process the user may signal",
    "chmod-root": "changes permissions of the whole file system (or of a system folder or the home folder)",
}

# a name starts where a word does: retried from inside a long word, the match took quadratic time (a 30 KB line
# of hex in a here-document held the run for 22 s before its command ran)
_FUNCTION = re.compile(r"(?:\bfunction\s+([\w:.-]+)\s*(?:\(\s*\))?|(?<![\w:.-])([\w:.-]+)\s*\(\s*\))\s*\{([^{}]*)\}")


def _fork_bomb(text: str) -> bool:
    """A function that starts itself at least twice, in a pipe or in the background, and is called: each call
    doubles the processes (`:(){ :|:& };:`, `bomb() { bomb & bomb; }; bomb`, `function f { f|f& }; f`)."""
    for checked, match in enumerate(_FUNCTION.finditer(text)):
        if checked > 100:
            return False
        name, body = match.group(1) or match.group(2), match.group(3)
        call = re.compile(rf"(?:^|[;&|(\n])\s*{re.escape(name)}(?![\w:.-])")  # as a command, not an argument
        if len(call.findall(body)) >= 2 and re.search(r"[|&]", body) and call.search(text, match.end() - 1):
            return True
    return False

# A quoted word that still names the root or the home folder: "/" and '/' are `/`; "$HOME" expands in double
# quotes (in single quotes, or as "~", it is a name in the working directory)
_QUOTED_TARGET = re.compile(r"\"(/|\$HOME/?|\$\{HOME\}/?)\"|'(/)'")


def _unquoted(command: str) -> str:
    """The command with quoted strings and comments taken out (`echo "rm -rf /"` prints, it does not delete),
    except quoted words that are the root or the home folder: what policy.deny's and policy.confirm's own
    regexes read."""
    text = re.sub(r"'[^']*'|\"(?:\\.|[^\"\\])*\"",
                  lambda m: next((g for g in _QUOTED_TARGET.fullmatch(m.group()).groups() if g), "")
                  if _QUOTED_TARGET.fullmatch(m.group()) else "''", command)
    return re.sub(r"(?:^|(?<=\s))#[^\n]*", "", text)


class CommandPolicy:
    """A hook: refuses denied commands, and those that need a yes when `ask` gives none (or is missing)."""

    def __init__(self, config: PolicyConfig, *, environment_kind: str,
                 ask: Callable[[str, str], bool] | None = None):
        self.applies = environment_kind == "local" or config.containers
        self.deny = [(entry, None if entry in DENY else re.compile(entry, re.M),
                      DENY.get(entry, "matches policy.deny")) for entry in config.deny]
        self.confirm = [re.compile(pattern, re.M) for pattern in config.confirm]
        self.ask = ask
        self._last: tuple[str, Reading, list[str]] | None = None  # one command is judged by deny, then confirm

    def _read(self, command: str) -> tuple[Reading, list[str]]:
        """The command's reading and its shell texts unquoted, for the rules and the patterns."""
        if self._last is None or self._last[0] != command:
            reading = read_command(command)
            self._last = (command, reading, [_unquoted(text) for text in reading.texts])
        return self._last[1], self._last[2]

    def needs_confirmation(self, command: str) -> str | None:
        """The confirm pattern `command` matches, if any (chat asks for these even in yolo mode); the text it
        hands to `bash -c`, `eval`, ... is read too."""
        if not self.applies or not self.confirm:
            return None
        texts = self._read(command)[1]
        return next((p.pattern for p in self.confirm if any(p.search(text) for text in texts)), None)

    def before_command(self, event) -> None:
        if not self.applies or event.veto or getattr(event, "tool", "bash") not in ("bash", "submit"):
            return  # the file tools are confined to the working directory; their rendering is not shell
        event.veto = self._denied(event.command)
        if event.veto:
            return
        pattern = self.needs_confirmation(event.command)
        if pattern and not (self.ask and self.ask(event.command, pattern)):
            event.veto = (f"refused: the command policy wants a person's yes for this command (policy.confirm: "
                          f"{pattern}), and {'the person said no' if self.ask else 'nobody is here to say it'}.")

    def rewritten(self) -> RewrittenCommands:
        """The hook that reads a command again after the hooks between (a plugin, a person's edit) rewrote it."""
        return RewrittenCommands(self)

    def _denied(self, command: str) -> str | None:
        reading, texts = self._read(command)
        for entry, pattern, why in self.deny:
            if pattern is None:
                if entry not in reading.rules:
                    continue
            else:
                if not any(pattern.search(text) for text in texts):
                    continue
            return f"refused by the command policy: it {why} (policy.deny: {entry}). Do the task another way."
        return None


class RewrittenCommands:
    """Last before a command runs: what a hook or a person rewrote is read by policy.deny too, so no rewrite runs
    a denied command. (A person's own edit is their yes: policy.confirm is not asked again.)"""

    def __init__(self, policy: CommandPolicy):
        self.policy = policy

    def before_command(self, event) -> None:
        if self.policy.applies and not event.veto and event.command != event.proposed:
            event.veto = self.policy._denied(event.command)
