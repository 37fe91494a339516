"""Model replies as tests and benchmarks write them: one place for the fence, a well-formed action, the submission."""

F = "```"
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def act(command: str, thought: str = "THOUGHT: next.") -> str:
    """A well-formed model reply running `command`."""
    return f"{thought}\n\n{F}bash\n{command}\n{F}\n"


SUBMIT = act(f"echo {SUBMIT_MARKER} && printf 'the patch'")
