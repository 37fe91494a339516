"""The fallback for images that cannot run miniswe's executor (no python3): the container's main process is a
small bash loop, and each command is one `docker exec` of a bash wrapper that times it out from inside.

Slower (an engine round trip per step) and less private than the executor: commands can see the wrapper,
and `pkill sleep` ends its watchdog (the host's own timer then ends the step). Environment values and the
command travel on the exec's stdin, never in its argv.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from collections.abc import Callable

from miniswe.environments import CommandResult
from miniswe.environments.capture import run_captured
from miniswe.environments.containers import first_line
from miniswe.environments.executor import PROLOGUE
from miniswe.errors import SandboxError

# Past the command's own timeout, how long the host waits for the in-container watchdog before giving up on it.
HOST_GRACE_S = 5.0
STDERR_LIMIT = 1 << 16

# Runs inside the container as `bash -c WRAPPER miniswe TIMEOUT SWEEP`, with `NAME=value\0...\0\0COMMAND` on
# stdin; the command's shell reads its text from a pipe, so no argv holds it. Job control gives the command its own process group, so the watchdog (on timeout) and the wrapper
# (after a normal exit) can kill everything it started. With SWEEP=1 (the container has its own PID
# namespace), whatever escaped the group (setsid, double forks) is killed too: nothing but init, the keeper
# and its sleep may outlive a step. The sweep reads /proc with builtins only, forking nothing.
# Markers go to the exec's stderr, which carries nothing else: the command's stderr is merged into stdout.
WRAPPER = r"""set -m
while IFS= read -r -d '' kv && [ -n "$kv" ]; do export "$kv"; done
IFS= read -r -d '' command
exec </dev/null
bash -c 'PROLOGUE' 3< <(printf %s "$command") 2>&1 &
cmd=$!
echo "miniswe:pgid $cmd" >&2
(sleep "$1" && { echo miniswe:timeout >&2; kill -KILL -- -"$cmd"; }) &
dog=$!
wait "$cmd"
rc=$?
kill -KILL -- -"$dog" -"$cmd" 2>/dev/null
if [[ $2 == 1 ]]; then
  keeper=
  for d in /proc/[0-9]*; do
    { mapfile -d '' args < "$d/cmdline"; } 2>/dev/null || continue
    [[ ${args[0]} == bash && ${args[3]} == miniswe-keeper ]] && { keeper=${d#/proc/}; break; }
  done
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [[ $p == 1 || $p == $$ || $p == "$keeper" ]] && continue
    ppid=
    { while read -r key value; do [[ $key == PPid: ]] && { ppid=$value; break; }; done < "$d/status"; } 2>/dev/null
    [[ -n $keeper && $ppid == "$keeper" ]] || kill -KILL "$p" 2>/dev/null
  done
fi
echo "miniswe:exit $rc" >&2
exit $rc
""".replace("PROLOGUE", PROLOGUE.replace("'", "'\\''"))  # the command's text reaches its shell on fd 3, as in the executor

# The container's main process in this mode: it lives out the lifetime ceiling, and a command's `pkill sleep`
# or `pkill bash` (ignored signals) does not end the container under the run; `kill -9 -1` does.
KEEPER = (
    'trap "" TERM INT HUP; '
    'while [ "$SECONDS" -lt "$1" ]; do r=$(( $1 - SECONDS )); sleep $(( r < 10 ? r : 10 )) & wait $!; done'
)


class ExecPerStep:
    """Runs commands in `container` through one `exec` each. `gone()` says why the container can no longer
    run commands (None while it runs)."""

    def __init__(self, exe: str, container: str, *, cwd: str, env: dict[str, str], capture_limit: int,
                 sweep: bool, gone: Callable[[bool], str | None]):
        self.exe = exe
        self.tool = os.path.basename(exe)
        self.container = container
        self.cwd = cwd
        self.capture_limit = capture_limit
        self.sweep = sweep
        self.gone = gone
        self._env = b"".join(f"{k}={v}".encode("utf-8", "surrogateescape") + b"\0" for k, v in env.items()) + b"\0"
        self._running: subprocess.Popen | None = None
        self._interrupted = False

    def execute(self, command: str, timeout: float) -> CommandResult:
        started = time.monotonic()
        argv = [
            self.exe, "exec", "-i", "-w", self.cwd, self.container,
            "bash", "-c", WRAPPER, "miniswe", f"{max(timeout, 0):.3f}", "1" if self.sweep else "0",
        ]  # fmt: skip
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True,  # Ctrl-C at the terminal is for miniswe to handle, not for the exec client
            )  # fmt: skip
        except OSError as error:
            raise SandboxError(f"cannot start {self.exe}: {error.strerror}") from error
        self._interrupted = False
        self._running = proc
        try:
            try:
                proc.stdin.write(self._env + command.encode("utf-8", "surrogateescape").split(b"\0", 1)[0])
                proc.stdin.close()
            except OSError:
                pass  # the exec failed at once: its stderr says why
            result = run_captured(proc, timeout=max(timeout, 0) + HOST_GRACE_S, limit=self.capture_limit,
                                  kill=proc.kill, started=started)
            stderr = proc.stderr.read(STDERR_LIMIT).decode("utf-8", errors="replace")
        finally:
            self._running = None
            proc.stderr.close()
        # whole lines only: bash's job notices on the same stream quote the wrapper's source
        markers = {line.partition(" ")[0]: line.partition(" ")[2] for line in stderr.splitlines()}
        if self._interrupted:
            # the exec client was killed; the container goes with the run, or its next step's sweep
            self._kill_group(markers.get("miniswe:pgid", ""))
            return dataclasses.replace(result, returncode=None, timed_out=False, interrupted=True)
        if result.timed_out:
            # The engine did not end the step in time; the watchdog inside may be gone (`pkill sleep`).
            self._kill_group(markers.get("miniswe:pgid", ""))
            return result
        if "miniswe:timeout" in markers:
            return dataclasses.replace(result, returncode=None, timed_out=True)
        if "miniswe:exit" not in markers:
            # The wrapper never ran or was killed: the exec failed, or the container went away under it.
            gone = self.gone(True)
            if gone and "miniswe:pgid" in markers:  # it died under the command: keep what the step printed
                return dataclasses.replace(result, returncode=None, sandbox_error=gone)
            if gone:
                raise SandboxError(gone)
            if "miniswe:pgid" not in markers:
                raise SandboxError(self._exec_problem(stderr, proc.returncode))
        return result

    def _exec_problem(self, stderr: str, code: int | None) -> str:
        line = first_line(stderr)
        lowered = stderr.lower()
        if "chdir" in lowered or "cwd" in lowered or "working directory" in lowered:
            return (f"cannot start bash in the working directory {self.cwd}: it no longer exists in container "
                    f"{self.container} (a command removed it); the run cannot continue")
        return f"{self.tool} exec failed: {line or f'exit {code}'}"

    def interrupt(self) -> None:
        proc = self._running
        if proc is not None:
            self._interrupted = True
            proc.kill()

    def _kill_group(self, pgid: str) -> None:
        if pgid.isdigit():
            try:
                subprocess.run(
                    [self.exe, "exec", self.container, "bash", "-c", f"kill -KILL -- -{pgid}"],
                    stdin=subprocess.DEVNULL, capture_output=True, timeout=10,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        pass
