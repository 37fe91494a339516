"""The command line. Thin: each command imports what it runs, so `miniswe --help` loads typer only."""

from __future__ import annotations

import os
import signal
import sys
from typing import Annotated, Optional

import typer

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    help="miniswe: a small coding agent that runs one shell command per model reply.",
)

ConfigOpt = Annotated[list[str], typer.Option("-c", "--config", help="YAML file or key.path=value; repeatable, merged left to right.")]
ModelOpt = Annotated[Optional[str], typer.Option("-m", "--model", help="Model name (default: model.name, or $MINISWE_MODEL).")]
BaseUrlOpt = Annotated[Optional[str], typer.Option("--base-url", help="OpenAI-compatible endpoint (default: $OPENAI_BASE_URL, else model.base_url).")]
StepOpt = Annotated[Optional[int], typer.Option("--step-limit", help="Model calls per run (0 = unlimited).")]
TokenOpt = Annotated[Optional[int], typer.Option("--token-limit", help="Total tokens per run (0 = unlimited).")]
CostOpt = Annotated[Optional[float], typer.Option("--cost-limit", help="USD per run (0 = unlimited).")]
TimeOpt = Annotated[Optional[float], typer.Option("--time-limit", help="Wall seconds per run (0 = unlimited).")]
EnvOpt = Annotated[Optional[str], typer.Option("--env", help="Environment kind: local or docker.")]
ImageOpt = Annotated[Optional[str], typer.Option("--image", help="Docker image (implies --env docker).")]
QuietOpt = Annotated[bool, typer.Option("-q", "--quiet", help="Print only the final line.")]


def fail(error: Exception) -> None:
    """One line on stderr, then the exit code of the error's class."""
    print(f"miniswe: {error}", file=sys.stderr)
    raise typer.Exit(getattr(error, "exit_code", 3))


def _sigterm_as_interrupt() -> None:
    from miniswe.agent import Interrupt

    def handler(signum, frame):
        raise Interrupt("SIGTERM")

    signal.signal(signal.SIGTERM, handler)


def resolve_config(
    sources: list[str], *, model=None, base_url=None, step_limit=None, token_limit=None, cost_limit=None,
    time_limit=None, env=None, image=None, cwd=None, script=None,
):
    """Defaults, then -c sources, then flags. $OPENAI_BASE_URL and $MINISWE_MODEL fill what config leaves empty."""
    from miniswe.config import load_config, override

    config = load_config(*sources)
    sections: dict = {"model": {}, "agent": {}, "environment": {}}
    base_url = base_url or (None if config.model.base_url else os.environ.get("OPENAI_BASE_URL"))
    model = model or (None if config.model.name else os.environ.get("MINISWE_MODEL"))
    if base_url:
        sections["model"]["base_url"] = base_url
    if model:
        sections["model"]["name"] = model
    if script:
        sections["model"].update(kind="scripted", script=script)
    for key, value in (("step_limit", step_limit), ("token_limit", token_limit),
                       ("cost_limit", cost_limit), ("time_limit", time_limit)):
        if value is not None:
            sections["agent"][key] = value
    if image:
        sections["environment"].update(kind="docker", image=image)
    if env:
        sections["environment"]["kind"] = env
    if cwd:
        sections["environment"]["cwd"] = cwd
    sections = {name: values for name, values in sections.items() if values}
    return override(config, **sections) if sections else config


@app.command()
def run(
    task: Annotated[Optional[str], typer.Argument(help="The task text (or use --task-file).")] = None,
    task_file: Annotated[Optional[str], typer.Option("--task-file", "-t", help="Read the task text from a file.")] = None,
    config: ConfigOpt = [],
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    cwd: Annotated[Optional[str], typer.Option("--cwd", help="Working directory of the commands.")] = None,
    output: Annotated[Optional[str], typer.Option("-o", "--output", help="Trajectory path (default: trajectories/<run id>-<task>.traj.json).")] = None,
    step_limit: StepOpt = None,
    token_limit: TokenOpt = None,
    cost_limit: CostOpt = None,
    time_limit: TimeOpt = None,
    env: EnvOpt = None,
    image: ImageOpt = None,
    script: Annotated[Optional[str], typer.Option("--script", help="Use the scripted model with replies from this YAML/JSON file.")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Solve one task, showing each step; exit 0 submitted, 1 not submitted, 2 bad input, 3 infrastructure failure."""
    from miniswe.errors import MinisweError, UsageError
    from miniswe.status import exit_code

    try:
        if task_file:
            try:
                with open(task_file, encoding="utf-8") as handle:
                    task = handle.read()
            except OSError as error:
                raise UsageError(f"--task-file {task_file}: {error.strerror}") from None
        if not task or not task.strip():
            raise UsageError("no task given: pass the task text as an argument or --task-file FILE")
        cfg = resolve_config(config, model=model, base_url=base_url, step_limit=step_limit, token_limit=token_limit,
                             cost_limit=cost_limit, time_limit=time_limit, env=env, image=image, cwd=cwd, script=script)
        from miniswe.display import make_display, summary_line
        from miniswe.runner import check_ready, default_trajectory_path, new_run_id, run_task

        renderer = check_ready(cfg)
        _warn_orphans(cfg)
        run_id = new_run_id()
        path = output or default_trajectory_path(task, run_id)
        display = make_display(quiet)
        _sigterm_as_interrupt()
        result = run_task(cfg, task, path, run_id=run_id, renderer=renderer, on_step=display.step)
    except MinisweError as error:
        fail(error)
    detail = result.outcome.detail
    if detail and result.outcome.status.value in ("ModelError", "SandboxError", "LimitsExceeded", "TimeExceeded", "RepeatedFormatError", "Interrupted"):
        print(f"miniswe: {result.outcome.status}: {detail.splitlines()[-1] if detail else ''}", file=sys.stderr)
    elif result.outcome.status.value == "Error":
        print(f"miniswe: internal error (traceback saved in {result.trajectory.path}): {detail.strip().splitlines()[-1]}", file=sys.stderr)
    display.final(summary_line(result))
    raise typer.Exit(exit_code(result.outcome.status, result.outcome.detail))


@app.command()
def demo(
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    output: Annotated[str, typer.Option("-o", "--output", help="Run directory.")] = "trajectories/demo",
    quiet: QuietOpt = False,
) -> None:
    """Run the bundled demo tasks offline with the scripted model (or a real model with --base-url and -m)."""
    from miniswe.errors import MinisweError
    from miniswe.resources import config_dir

    demo_dir = os.path.join(config_dir(), "demo")
    try:
        raise NotImplementedError
    except MinisweError as error:
        fail(error)


def _warn_orphans(cfg) -> None:
    if cfg.environment.kind != "docker":
        return
    try:
        from miniswe.environments.docker import find_orphans
    except ImportError:
        return
    try:
        orphans = find_orphans(cfg.environment.executable)
    except Exception:
        return
    if orphans:
        print(f"miniswe: warning: {len(orphans)} container(s) left by dead miniswe runs; remove them with `miniswe cleanup`", file=sys.stderr)


def main() -> None:
    app()
