"""The text protocol's decisions, one row per case a real model reply produces."""

import pytest

from miniswe.protocol import FormatError, parse_command, strip_reasoning, submission

from replies import SLOW_LINES, F, adversarial_reply

VALID = [
    ("plain", f"THOUGHT: list\n\n{F}bash\nls -la\n{F}\n", "ls -la"),
    ("default tag", f"{F}mswea_bash_command\nmake test\n{F}", "make test"),
    ("tag case-insensitive", f"{F}Bash\npwd\n{F}", "pwd"),
    ("info string extras", f"{F}bash title=x\npwd\n{F}", "pwd"),
    ("python quote before action", f"Here is the fix:\n{F}python\nx = 1\n{F}\n{F}bash\npython3 t.py\n{F}", "python3 t.py"),
    ("untagged and diff blocks ignored", f"{F}\nplain\n{F}\n{F}diff\n-a\n+b\n{F}\n{F}bash\ngit diff\n{F}", "git diff"),
    ("fence mid-sentence is not a fence", f"I will use a {F}bash block:\n{F}bash\nls\n{F}", "ls"),
    ("four-backtick fence holds a three-backtick line", f"````bash\nprintf '%s\\n' '{F}'\n{F}\n````", f"printf '%s\\n' '{F}'\n{F}"),
    ("tilde fence", "~~~bash\nls\n~~~", "ls"),
    ("indented up to three spaces", f"   {F}bash\n   ls\n     sub\n   {F}", "ls\n  sub"),
    ("crlf and trailing spaces", f"{F}bash  \r\nls -1\r\n{F}   \r\n", "ls -1"),
    ("closing fence glued to the command", f"{F}bash\nls -la{F}", "ls -la"),
    ("closing fence glued, then prose", f"{F}bash\ncat a.txt{F}\n", "cat a.txt"),
    ("text after the closing fence", f"{F}bash\nls\n{F}\nThis will list the files.", "ls"),
    ("heredoc holding a markdown fence", f"{F}bash\ncat > README.md <<'EOF'\n# T\n{F}python\nprint(1)\n{F}\nEOF\n{F}", f"cat > README.md <<'EOF'\n# T\n{F}python\nprint(1)\n{F}\nEOF"),
    ("heredoc with <<- and tabs", f"{F}bash\ncat <<-END\n\t{F}\n\tEND\n{F}", f"cat <<-END\n\t{F}\n\tEND"),
    ("unterminated heredoc falls back to CommonMark", f"{F}bash\necho '<<EOF'\n{F}", "echo '<<EOF'"),
    ("non-ascii kept", f"{F}bash\necho 'héllo → 世界'\n{F}", "echo 'héllo → 世界'"),
    ("zero-width characters removed", f"{F}bash\nl\u200bs\ufeff -la\u2060\n{F}", "ls -la"),
    ("think section ignored", f"<think>maybe\n{F}bash\nrm -rf /\n{F}\n</think>\n{F}bash\nls\n{F}", "ls"),
    ("reasoning without its opening tag", f"draft:\n{F}bash\nrm -rf /\n{F}\n</think>\n{F}bash\nls\n{F}", "ls"),
    ("think tag inside a command", f"{F}bash\ngrep -rn '<think>' src/ | head\n{F}", "grep -rn '<think>' src/ | head"),
    ("closed think pair inside a heredoc", f"{F}bash\ncat > t.txt <<'EOF'\n<think>a</think>\nEOF\n{F}", "cat > t.txt <<'EOF'\n<think>a</think>\nEOF"),
    ("multi-line command", f"{F}bash\ncd src &&\n  make\n{F}", "cd src &&\n  make"),
]

INVALID = [
    ("no block", "I think we are done.", "no_action"),
    ("only a python block", f"{F}python\nprint(1)\n{F}", "no_action"),
    ("two actions", f"{F}bash\nls\n{F}\nthen\n{F}bash\npwd\n{F}", "several_actions"),
    ("two actions with different tags", f"{F}mswea_bash_command\nls\n{F}\n{F}bash\npwd\n{F}", "several_actions"),
    ("empty action", f"{F}bash\n\n   \n{F}", "empty_action"),
    ("empty reply", "", "empty_reply"),
    ("reasoning only", "<think>hmm</think>  ", "empty_reply"),
    ("cut off inside the block", f"THOUGHT: edit\n{F}bash\ncat > a.py <<'EOF'\nimport os\n", "unclosed"),
    ("shorter closing fence does not close", f"````bash\nls\n{F}\n", "unclosed"),
    ("only the think block has an action", f"<think>{F}bash\nls\n{F}</think>done", "no_action"),
]


@pytest.mark.parametrize(("reply", "expected"), [row[1:] for row in VALID], ids=[row[0] for row in VALID])
def test_valid_reply_yields_its_one_command(reply, expected):
    assert parse_command(reply) == expected


@pytest.mark.parametrize(("reply", "kind"), [row[1:] for row in INVALID], ids=[row[0] for row in INVALID])
def test_invalid_reply_names_what_is_wrong(reply, kind):
    with pytest.raises(FormatError) as caught:
        parse_command(reply)
    assert caught.value.kind == kind
    assert str(caught.value)


def test_action_tags_are_configurable():
    reply = f"{F}sh\nls\n{F}\n{F}bash\npwd\n{F}"
    assert parse_command(reply, action_tags=["sh"]) == "ls"


def test_strip_reasoning_keeps_the_rest():
    assert strip_reasoning("<think>a</think>b") == "b"


@pytest.mark.parametrize(
    ("output", "returncode", "expected"),
    [
        ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\ndiff --git a b\n", 0, "diff --git a b\n"),
        ("  COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT  \n", 0, ""),
        ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", 0, ""),
        ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n", 1, None),
        ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n", None, None),
        ("hello\nCOMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n", 0, None),
        ("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n", 0, None),
        ("\nCOMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n", 0, None),
    ],
    ids=["with patch", "padded", "no newline", "nonzero exit", "timed out", "not first line", "marker mentioned", "blank first line"],
)
def test_submission_needs_marker_first_and_exit_zero(output, returncode, expected):
    assert submission(output, returncode) == expected


def test_custom_submit_marker():
    assert submission("DONE\nok", 0, marker="DONE") == "ok"


@pytest.mark.parametrize("case", [*SLOW_LINES, *range(8)], ids=[*SLOW_LINES, *[f"random-{i}" for i in range(8)]])
def test_parsing_is_linear_in_the_reply(case):
    """A 1 MB reply of whatever shape parses in well under a second (a quadratic parser would take hours)."""
    import time

    text = SLOW_LINES[case] if isinstance(case, str) else adversarial_reply(case, 1 << 20)
    started = time.thread_time()  # the parser's own CPU time, which the tests running beside it do not take
    try:
        parse_command(text)
    except FormatError:
        pass
    assert time.thread_time() - started < 1.5
