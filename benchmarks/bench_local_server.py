"""A short matrix against a real local model server (llama.cpp's llama-server, llama-cpp-python, Ollama):
small windows, streaming on and off, `run` and `chat`. Not part of `./dev bench`: it needs a server.

    python benchmarks/bench_local_server.py --base-url http://127.0.0.1:8080/v1 -m MODEL [--windows 2048,4096]
        [--steps 12] [--image IMAGE]

Each cell is one run of a task that makes the model explore (so the conversation outgrows a small window),
ended by its step limit or a submission. Reported per cell: how it ended, steps, tokens (and how many of them
were estimated because the server sent no usage), compactions, wall time. What the issue this answers asks
of them: on a 2048 window a run goes on to its step limit; streamed runs count tokens; nothing waits minutes
on an empty stream. `--image` runs the commands in Docker.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

TASK = ("List the files here, then print the first lines of three of them one command at a time, and say "
        "what each holds. Then submit.")


def cell(args, work: str, window: int, stream: bool) -> list[str]:
    out = os.path.join(work, f"w{window}-{'stream' if stream else 'plain'}.traj.json")
    argv = [sys.executable, "-m", "miniswe", "run", TASK, "--base-url", args.base_url, "-m", args.model, "-q",
            "-o", out, "--step-limit", str(args.steps), "-c", f"agent.context_window={window}",
            "-c", f"model.stream={'true' if stream else 'false'}", "--cwd", work]
    if args.image:
        argv += ["--image", args.image]
    started = time.monotonic()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - started
    try:
        with open(out, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return [str(window), str(stream), "no trajectory", "", "", "", "", f"{wall:.1f}"]
    usage = data.get("usage") or {}
    return [str(window), str(stream), data.get("exit_status") or "?", str(len(data.get("steps") or [])),
            str(usage.get("total_tokens", 0)), str(usage.get("estimated_tokens", 0)),
            str(len(data.get("compactions") or [])), f"{wall:.1f}"]


def chat(args, work: str) -> list[str]:
    """A chat of three messages and /cost, /compact, /cost, read from a pipe (no terminal: plain lines)."""
    lines = ["list the files here", "print the first line of one of them", "/cost", "/compact", "/cost", "/quit"]
    env = {**os.environ, "MINISWE_HOME": os.path.join(work, "home")}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "miniswe", "chat", "--base-url", args.base_url, "-m", args.model,
                           "--mode", "yolo", "--cwd", work], input="\n".join(lines) + "\n", capture_output=True,
                          text=True, env=env)
    wall = time.monotonic() - started
    costs = [line[line.index("this session:"):] for line in done.stdout.splitlines() if "this session:" in line]
    return ["chat", "", f"exit {done.returncode}", "", costs[-1] if costs else "no /cost line", "", "", f"{wall:.1f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--windows", default="2048,4096,8192")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--image", default="")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="miniswe-local-")
    for name in ("README", "setup.py", "notes.txt"):
        with open(os.path.join(work, name), "w", encoding="utf-8") as handle:
            handle.write(f"{name}: a small file for the model to read\n" * 20)
    rows = [["window", "stream", "ended", "steps", "tokens", "estimated", "compactions", "wall s"]]
    for window in (int(w) for w in args.windows.split(",")):
        for stream in (False, True):
            rows.append(cell(args, work, window, stream))
            print("  ".join(rows[-1]), flush=True)
    rows.append(chat(args, work))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print()
    for row in rows:
        print("  ".join(value.ljust(width) for value, width in zip(row, widths)))
    print(f"\ntrajectories in {work}")


if __name__ == "__main__":
    main()
