"""Loop detection compares commands as the shell reads them: blanks between words and comments changed to get
past an exact-text comparison still make the same command; quoted text, `${#x}` and here-documents are kept."""

from types import SimpleNamespace

import pytest

from miniswe.repeats import RepeatDetector, shell_words
from miniswe.status import Outcome


def step(command, output="a\n"):
    return SimpleNamespace(command=command, returncode=0, timed_out=False, output=output)


@pytest.mark.parametrize("spellings", [
    ["ls", "ls ", " ls", "\tls\n", "ls # try 1", "ls  # try 2", "ls #", "\nls\n\n", "ls \\\n"],
    ["grep -rn foo src", "grep  -rn   foo\tsrc", "grep -rn foo src # again", "# look\ngrep -rn foo src"],
    ["cd x && make", "cd x  &&  make # third time", "cd x &&\\\n make"],
    ["echo 'a  b'", "echo 'a  b'  # try", " echo 'a  b'"],
])
def test_spellings_the_shell_reads_alike_are_one_command(spellings):
    assert len({shell_words(c) for c in spellings}) == 1, {c: shell_words(c) for c in spellings}
    detector = RepeatDetector(limit=3)
    verdicts = [detector._see(step(c)) for c in (spellings * 4)[:4]]
    assert isinstance(verdicts[2], str) and "3 times in a row" in verdicts[2]
    assert isinstance(verdicts[3], Outcome)


@pytest.mark.parametrize("one,other", [
    ('echo "a  b"', 'echo "a b"'),  # blanks inside quotes are the argument
    ("echo 'x # y'", "echo 'x # z'"),  # a `#` inside quotes is text
    ("echo ${#x}", "echo ${#y}"),
    ("echo $#1", "echo $#2"),
    ("echo a#1", "echo a#2"),  # a `#` inside a word is text
    ("echo \\#1", "echo \\#2"),
    ("echo \\ #1", "echo \\ #2"),  # an escaped blank: the `#` is inside the word
    ("echo $'a\\' #1'", "echo $'a\\' #2'"),
    ('echo "a\\" #1"', 'echo "a\\" #2"'),
    ("cat <<EOF\n# 1\nEOF", "cat <<EOF\n# 2\nEOF"),  # a here-document's body is data
    ("cat <<EOF\na  b\nEOF", "cat <<EOF\na b\nEOF"),
    ("ls a", "ls b"),
    ("ls\npwd", "ls pwd"),  # a newline ends a command
])
def test_what_the_shell_reads_differently_stays_different(one, other):
    assert shell_words(one) != shell_words(other)
    detector = RepeatDetector(limit=2)
    assert [detector._see(step(c)) for c in (one, other, one, other)] == [None] * 4


def test_a_changed_output_still_resets_the_count():
    detector = RepeatDetector(limit=2)
    assert detector._see(step("ls", "a")) is None
    assert detector._see(step("ls ", "b")) is None
    assert detector._see(step("ls # again", "b"))  # the warning


def test_a_long_command_is_read_in_linear_time():
    import time

    started = time.perf_counter()
    for command in ("a " * 200_000, "# x\n" * 100_000, "'" * 100_001, '"\\' * 100_000, "x<<E\n" * 100_000):
        shell_words(command)
    assert time.perf_counter() - started < 5
