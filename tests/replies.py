"""Model replies as tests and benchmarks write them: one place for the fence, a well-formed action, the submission."""

F = "```"
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def act(command: str, thought: str = "THOUGHT: next.") -> str:
    """A well-formed model reply running `command`."""
    return f"{thought}\n\n{F}bash\n{command}\n{F}\n"


SUBMIT = act(f"echo {SUBMIT_MARKER} && printf 'the patch'")


# The pieces a reply parser reacts to, for replies generated to find its slow paths.
ADVERSARIAL_PIECES = ["`", "``", "```", "~~~", "````bash", "```bash\n", "a", "b ", " ", "\t", "\n", "\n```\n",
                      "<<EOF\n", "<<-'X'\n", "EOF\n", "X\n", "</think>", "<think>", "\r\n", "\u200b"]


def adversarial_reply(seed: int, size: int) -> str:
    """A reply of `size` characters: runs of parser-relevant pieces, each piece's weight and run length random."""
    import random

    rng = random.Random(seed)
    weights = [rng.random() for _ in ADVERSARIAL_PIECES]
    out, length = [], 0
    while length < size:
        piece = rng.choices(ADVERSARIAL_PIECES, weights)[0] * rng.choice((1, 1, 1, 50, 2000))
        out.append(piece)
        length += len(piece)
    return "".join(out)[:size]


# Single lines that made earlier parsers quadratic: an opening fence over a long line, a long backtick run.
SLOW_LINES = {
    "fence over a long line": "```" + "a" * (1 << 20) + "`",
    "long backtick run": "```bash\necho\nx" + "`" * (1 << 20) + "y",
    "backticks and letters": "".join("`a"[(i * 7919) % 3 == 0] for i in range(1 << 20)),
}


def call(tool: str, arguments=None, **fields) -> dict:
    """One native tool call, as the scripted model and the scripted server take it (`arguments`: an object, or
    the raw text a model might send; else the keyword arguments)."""
    return {"name": tool, "arguments": fields if arguments is None else arguments}


def calls(*items: dict, content: str = "") -> dict:
    """A reply that calls tools: `items` made with `call`."""
    return {"content": content, "tool_calls": list(items)}


TOOL_SUBMIT = calls(call("submit", command="printf 'the patch'"))
