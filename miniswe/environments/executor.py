"""miniswe's executor: the main process (PID 1) of a run's container. It runs each command it is sent as a
fresh `bash -c` in its own session and streams the output back, in length-prefixed frames over its
stdin and stdout (the attached `docker run -i` client on the host).

Standard library only, Python 3.6 or later: it runs on the image's own python3. The host sends this
source over stdin (see BOOT), so no file or argv in the container names it or any command.

Why PID 1: the kernel ignores a signal sent to a namespace's init from inside unless init handles it,
so `kill -9 -1`, `pkill python3` or `kill 1` from a command cannot end it. Every orphan in the container
is re-parented to it, so "everything this run started" is its descendants; with a shared PID namespace
(an unsafe run_args) it is a child subreaper for the same effect. Timeouts are timers here, not processes.
"""

import json
import os
import select
import signal
import struct
import sys
import time

try:  # imported once: a command may delete the standard library under the running executor
    import fcntl
except ImportError:
    fcntl = None

# Frame: kind (1 byte), payload length (4 bytes, big-endian), payload.
HEADER = struct.Struct(">cI")
# host -> executor
CONFIG = b"C"  # JSON: env (overrides), cwd, capture_limit, lifetime, heartbeat
RUN = b"R"  # JSON header line {"timeout": s}, b"\n", then the command's bytes
KILL = b"K"  # kill the running command now (an interrupt)
# executor -> host
HELLO = b"H"  # JSON: pid, python, bash (path or null), cwd (problem or null), exposed (see _exposed)
STARTED = b"S"  # JSON: pid of the command's shell
OUTPUT = b"O"  # bytes the command printed (stdout and stderr merged)
DROPPED = b"D"  # 8-byte count of bytes elided from the middle (see Output)
BEAT = b"B"  # still alive, sent while a command runs and prints nothing
EXIT = b"X"  # JSON: rc (null when killed), timed_out, killed
ERROR = b"E"  # JSON: the command could not start (what, message)

# The command's shell reads the command from fd 3 (a memfd, or a pipe), so its text is in no argv or
# environment. Read in a command substitution, it leaves no variable behind, fd 3 is closed while it
# runs, and errors read as they would from `bash -c` ("bash: eval: line 1: ..." for "bash: -c: line 1:").
PROLOGUE = 'eval "$(IFS= read -r -d "" -u 3 c; printf %s "$c")" 3<&-'
CHUNK = 1 << 16
PENDING_MAX = 1 << 20  # bytes queued for the host before the command's pipe is left unread (backpressure)
SCAN_ROUNDS = 200  # stop-the-world rounds of a sweep, ample for a fork bomb within a pids limit
NAME = b"miniswe-executor"  # PID 1's name and command line once it runs (see _rename)
DRAIN_S = 1.0  # after the sweep, how long the rest of the output may take to arrive

BOOT = (
    "# miniswe's executor: runs this container's commands\n"
    "import os, sys\n"
    "if sys.version_info < (3, 6):\n"  # the one failure that says "this python3 cannot run it" (exit 4)
    " sys.stderr.write('miniswe-executor: python ' + sys.version.split()[0] + ' is older than 3.6\\n')\n"
    " raise SystemExit(4)\n"
    "def r(n):\n"
    " b=b''\n"
    " while len(b)<n:\n"
    "  c=os.read(0,n-len(b))\n"
    "  if not c: raise SystemExit(3)\n"
    "  b+=c\n"
    " return b\n"
    "exec(compile(r(int(r(10))),'miniswe-executor','exec'),{'__name__':'__main__'})\n"
)  # fmt: skip


def boot_payload(source):
    """What the host writes first on the executor's stdin: BOOT reads a 10-digit length, then the source."""
    data = source.encode("utf-8")
    return b"%010d" % len(data) + data


def frame(kind, payload=b""):
    return HEADER.pack(kind, len(payload)) + payload


def parse_frames(buffer):
    """Complete frames at the start of `buffer` (a bytearray, consumed in place), as (kind, payload)."""
    frames = []
    offset = 0
    size = len(buffer)
    while size - offset >= HEADER.size:
        kind, length = HEADER.unpack_from(buffer, offset)
        end = offset + HEADER.size + length
        if end > size:
            break
        frames.append((kind, bytes(buffer[offset + HEADER.size : end])))
        offset = end
    if offset:
        del buffer[:offset]
    return frames


class Output:
    """One command's output on its way to the host, bounded as the host keeps it: the first half of
    `limit` bytes goes out at once, the rest through a tail of `limit - limit // 2` bytes whose overflow
    is dropped here (and counted in a DROPPED frame), so a flood never crosses the engine. The host's
    BoundedBuffer ends up with the same head and tail as if it had seen every byte."""

    def __init__(self, send, limit):
        self.send = send
        self.head = limit // 2 if limit > 0 else -1
        self.tail = limit - limit // 2
        self.sent = 0
        self.ring = bytearray()
        self.dropped = 0

    def add(self, data):
        if self.head < 0:
            self.send(OUTPUT, data)
            return
        room = self.head - self.sent
        if room > 0:
            part = data[:room]
            self.send(OUTPUT, part)
            self.sent += len(part)
            data = data[room:]
        if data:
            self.ring += data
            if len(self.ring) > 2 * self.tail:  # trimmed lazily: one memmove per tail's worth of output
                self._trim()

    def _trim(self):
        extra = len(self.ring) - self.tail
        if extra > 0:
            del self.ring[:extra]
            self.dropped += extra

    def flush(self):
        self._trim()
        if self.dropped:
            self.send(DROPPED, struct.pack(">Q", self.dropped))
            self.dropped = 0
        if self.ring:
            self.send(OUTPUT, bytes(self.ring))
            self.ring = bytearray()


class Step:
    """The command running now."""

    def __init__(self, pid, out, deadline):
        self.pid = pid
        self.out = out  # read end of the command's stdout+stderr pipe; None after EOF
        self.deadline = deadline
        self.status = None  # the shell's wait status once reaped
        self.timed_out = False
        self.killed = False
        self.output = None


class Executor:
    def __init__(self):
        self.pid = os.getpid()
        self.inbox = bytearray()
        self.pending = bytearray()
        self.env = dict(os.environ)
        self.cwd = "/"
        self.limit = 0
        self.heartbeat = 0.5
        self.ends = None  # the container's lifetime ceiling (monotonic)
        self.bash = None
        self.step = None
        self.statuses = {}  # wait statuses of reaped children, by pid
        self.devnull = os.open(os.devnull, os.O_RDWR)
        self.wake_r, self.wake_w = os.pipe()
        for fd in (0, 1, self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        self.host_gone = False
        self.exposed = False  # a command could reach this process's stream (see _exposed)

    # -- frames ----------------------------------------------------------------------------------------
    def send(self, kind, payload=b""):
        self.pending += frame(kind, payload)
        self.last_sent = time.monotonic()

    def send_json(self, kind, value):
        self.send(kind, json.dumps(value).encode())

    def flush_pending(self):
        while self.pending:
            try:
                written = os.write(1, self.pending)
            except BlockingIOError:
                return
            except OSError:  # the host's client is gone
                self.host_gone = True
                self.pending = bytearray()
                return
            del self.pending[:written]

    # -- children --------------------------------------------------------------------------------------
    def reap(self):
        """Collect exited children; True while any child remains."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            except InterruptedError:
                continue
            if pid == 0:
                return True
            self.statuses[pid] = status

    def descendants(self):
        """Pids of every live process below this one, read from /proc (orphans were re-parented here)."""
        children = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % name, "rb") as stat:
                    raw = stat.read()
            except OSError:
                continue
            fields = raw[raw.rfind(b")") + 2 :].split()
            if len(fields) > 1 and fields[0] not in (b"Z", b"X"):
                children.setdefault(int(fields[1]), []).append(int(name))
        found, queue = [], [self.pid]
        while queue:
            for child in children.get(queue.pop(), ()):
                found.append(child)
                queue.append(child)
        return found

    def sweep(self):
        """Kill everything this executor started: stop all of it first (a stopped process cannot fork,
        so a fork bomb cannot outrun the scan), then kill it. Touches nothing that is not a descendant."""
        if not self.reap():
            return
        try:
            self._sweep()
        except OSError:  # no descriptor left to read /proc (a lowered open-file limit)
            if self.pid == 1:
                _signal(-1, signal.SIGKILL)  # from a namespace's init: every other process in it
            self.reap()

    def _sweep(self):
        stopped = set()
        for _ in range(SCAN_ROUNDS):
            fresh = [pid for pid in self.descendants() if pid not in stopped]
            if not fresh:
                break
            for pid in fresh:
                _signal(pid, signal.SIGSTOP)
                stopped.add(pid)
        for pid in stopped:
            _signal(pid, signal.SIGKILL)
        for pid in self.descendants():  # only if the rounds ran out
            _signal(pid, signal.SIGKILL)
        self.reap()

    # -- commands --------------------------------------------------------------------------------------
    def configure(self, settings):
        self.env.update(settings.get("env") or {})
        self.cwd = settings.get("cwd") or "/"
        self.limit = int(settings.get("capture_limit") or 0)
        self.heartbeat = float(settings.get("heartbeat") or 0.5)
        lifetime = settings.get("lifetime")
        self.ends = time.monotonic() + float(lifetime) if lifetime else None
        self.bash = _which("bash", self.env.get("PATH", os.defpath))
        cwd_problem = None
        if not os.path.isdir(self.cwd):
            cwd_problem = "not a directory" if os.path.exists(self.cwd) else "does not exist"
        self.send_json(HELLO, {
            "pid": self.pid, "python": sys.version.split()[0], "bash": self.bash, "cwd": cwd_problem,
            "exposed": self.exposed,
        })  # fmt: skip

    def start(self, payload):
        header, _, command = payload.partition(b"\n")
        timeout = max(float(json.loads(header.decode()).get("timeout", 0)), 0.0)
        command = command.split(b"\0", 1)[0]  # as argv would carry it
        try:
            text = _command_fd(command)
        except OSError as error:
            self.send_json(ERROR, {"what": "memory", "message": os.strerror(error.errno or 0)})
            return
        try:
            out_r, out_w = os.pipe()
        except OSError as error:
            os.close(text)
            self.send_json(ERROR, {"what": "pipe", "message": os.strerror(error.errno or 0)})
            return
        _bigger_pipe(out_r)
        err_r, err_w = os.pipe()
        try:
            pid = os.fork()
        except OSError as error:
            for fd in (text, out_r, out_w, err_r, err_w):
                os.close(fd)
            self.send_json(ERROR, {"what": "fork", "message": os.strerror(error.errno or 0)})
            return
        if pid == 0:
            self._child(text, out_w, err_w)
        for fd in (text, out_w, err_w):
            os.close(fd)
        problem = _read_all(err_r)
        os.close(err_r)
        if problem:
            os.close(out_r)
            while self.reap() and pid not in self.statuses:
                time.sleep(0.001)
            self.statuses.pop(pid, None)
            self.send(ERROR, problem)
            return
        os.set_blocking(out_r, False)
        self.step = Step(pid, out_r, time.monotonic() + timeout)
        self.step.output = Output(self.send, self.limit)
        self.send_json(STARTED, {"pid": pid})

    def _child(self, text, out_w, err_w):
        """In the forked child: become a session leader with the pipe as stdout and stderr, then bash."""
        what = "setup"
        try:
            _as_command()
            os.setsid()
            os.dup2(self.devnull, 0)
            os.dup2(out_w, 1)
            os.dup2(out_w, 2)
            if text == 3:
                os.set_inheritable(3, True)
            else:
                os.dup2(text, 3)
            for number in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGINT):
                signal.signal(number, signal.SIG_DFL)  # ignored signals would stay ignored across exec
            signal.set_wakeup_fd(-1)
            # under memory pressure commands die before PID 1; at the maximum, even a PID 1 whose score a
            # command raised (`echo 1000 > /proc/1/oom_score_adj`) is only picked when it is the biggest
            _write_file("/proc/self/oom_score_adj", b"1000")
            what = "cwd"
            os.chdir(self.cwd)
            what = "exec"
            if not self.bash:
                raise FileNotFoundError(2, "No such file or directory")
            os.execve(self.bash, ["bash", "-c", PROLOGUE], self.env)
        except BaseException as error:
            code = getattr(error, "errno", None) or 0
            message = os.strerror(code) if code else repr(error)
            try:
                os.write(err_w, json.dumps({"what": what, "message": message, "path": self.cwd}).encode())
            finally:
                os._exit(127)

    def finish(self):
        """The command's shell is gone (or was killed): kill the rest, send the remaining output and EXIT."""
        step = self.step
        self.sweep()
        if step.status is None:
            step.status = self.statuses.pop(step.pid, None)
        deadline = time.monotonic() + DRAIN_S
        while step.out is not None and time.monotonic() < deadline:
            ready = select.select([step.out], [], [], max(deadline - time.monotonic(), 0))[0]
            if ready and not self.read_output(limit=64):
                continue
            if not ready:
                break
        if step.out is not None:
            os.close(step.out)
            step.out = None
        step.output.flush()
        rc = None
        if not (step.timed_out or step.killed) and step.status is not None:
            if os.WIFEXITED(step.status):
                rc = os.WEXITSTATUS(step.status)
            elif os.WIFSIGNALED(step.status):
                rc = 128 + os.WTERMSIG(step.status)  # as a shell reports it
        self.send_json(EXIT, {"rc": rc, "timed_out": step.timed_out, "killed": step.killed})
        self.step = None
        self.statuses.clear()  # orphans reaped along the way: nobody asks for theirs

    def read_output(self, limit=16):
        """Read what the command's pipe holds (up to `limit` chunks); False at EOF (the pipe is closed)."""
        step = self.step
        for _ in range(limit):
            try:
                data = os.read(step.out, CHUNK * 16)
            except BlockingIOError:
                return True
            if not data:
                os.close(step.out)
                step.out = None
                return False
            step.output.add(data)
            if len(self.pending) > PENDING_MAX:
                return True
        return True

    def kill_step(self, timed_out=False):
        step = self.step
        step.timed_out = step.timed_out or timed_out
        step.killed = step.killed or not timed_out
        self.sweep()
        step.status = self.statuses.pop(step.pid, step.status)
        self.finish()

    # -- the loop --------------------------------------------------------------------------------------
    def handle(self, kind, payload):
        if kind == CONFIG:
            self.configure(json.loads(payload.decode()))
        elif kind == RUN and self.step is None:
            try:
                self.start(payload)
            except Exception as error:  # never let one command take PID 1, and the container, down
                if self.step is None:
                    self.send_json(ERROR, {"what": "executor", "message": repr(error)})
                else:
                    raise
        elif kind == KILL and self.step is not None:
            self.kill_step()

    def serve(self):
        self.last_sent = time.monotonic()
        while not self.host_gone:
            now = time.monotonic()
            step = self.step
            if self.ends is not None and now >= self.ends:
                break  # the lifetime ceiling: exiting ends the container, and --rm removes it
            if step is not None and step.status is None and step.pid in self.statuses:
                step.status = self.statuses.pop(step.pid)
            if step is not None and step.status is not None:
                self.finish()
                continue
            if step is not None and now >= step.deadline:
                self.kill_step(timed_out=True)
                continue
            if step is not None and now - self.last_sent >= self.heartbeat:
                step.output.flush()
                if now - self.last_sent >= self.heartbeat:
                    self.send(BEAT)
            waits = [self.ends]
            if step is not None:
                waits += [step.deadline, self.last_sent + self.heartbeat]
            timeout = min([w for w in waits if w is not None] or [now + 3600]) - now
            readers = [0, self.wake_r]
            if step is not None and step.out is not None and len(self.pending) <= PENDING_MAX:
                readers.append(step.out)
            writers = [1] if self.pending else []
            try:
                readable, writable, _ = select.select(readers, writers, [], max(timeout, 0))
            except InterruptedError:
                continue
            if writable:
                self.flush_pending()
            if self.wake_r in readable:
                _drain(self.wake_r)
                self.reap()
                if self.step is None:
                    self.statuses.clear()
            if step is not None and step.out is not None and step.out in readable:
                self.read_output()
                if step.out is not None and not select.select([step.out], [], [], 0)[0]:
                    step.output.flush()  # the command paused: let the host see its output now
            if 0 in readable:
                try:
                    data = os.read(0, CHUNK)
                except BlockingIOError:
                    data = None
                if data == b"":
                    break  # the host is gone: nothing will read a result, so end the container
                if data:
                    self.inbox += data
                    for kind, payload in parse_frames(self.inbox):
                        self.handle(kind, payload)
            self.flush_pending()
        if self.step is not None:
            self.kill_step()
        self.sweep()


def _signal(pid, number):
    try:
        os.kill(pid, number)
    except OSError:
        pass


def _drain(fd):
    try:
        while os.read(fd, 4096):
            pass
    except OSError:
        pass


def _read_all(fd):
    data = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except InterruptedError:
            continue
        if not chunk:
            return data
        data += chunk


def _write_file(path, data):
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return
    try:
        os.write(fd, data)
    except OSError:
        pass
    finally:
        os.close(fd)


def _command_fd(command):
    """A file descriptor to read `command` from, at its start: a memfd (a regular file, which bash's `read`
    takes in big reads); without memfd (Python < 3.8, old kernels) a pipe when the command fits in one,
    else an unlinked temporary file. Written whole before bash starts, so nothing here can block."""
    create = getattr(os, "memfd_create", None)
    fd = None
    if create is not None:
        try:
            fd = create("command", getattr(os, "MFD_CLOEXEC", 1))
        except OSError:
            fd = None
    if fd is None and len(command) < 1 << 16:
        read, write = os.pipe()
        _write_all(write, command)  # fits in the pipe's buffer
        os.close(write)
        return read
    if fd is None:
        import tempfile

        with tempfile.TemporaryFile() as handle:
            fd = os.dup(handle.fileno())  # non-inheritable, like every descriptor Python opens
    _write_all(fd, command)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _bigger_pipe(fd, size=1 << 20):
    if fcntl is not None:
        try:
            fcntl.fcntl(fd, 1031, size)  # F_SETPIPE_SZ: fewer, larger reads during a flood
        except OSError:
            pass


def _which(name, path):
    for folder in path.split(os.pathsep):
        candidate = os.path.join(folder or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _harden():
    """Signals and process attributes that keep the executor alive and in charge. Every step has a way
    without ctypes (a python3 built without libffi lacks it); _exposed then checks the result."""
    # Python's own SIGINT handler would make `kill -INT 1` from a command land; a default disposition
    # is ignored by a namespace's init.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, lambda number, frame: None)  # wakes select through the wakeup fd
    try:
        _rename()  # first: once not dumpable, a non-root process may no longer write its own /proc files
    except OSError:
        pass
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come back here even when not PID 1
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no ptrace, /proc/1/mem or /proc/1/fd for the commands
    except Exception:
        pass
    # A saved gid that differs from the real one: the kernel lets a process prlimit, ptrace or open the
    # descriptors of another of its user only when the caller's gid equals all of the target's gids, so a
    # command (without CAP_SYS_RESOURCE or CAP_SYS_PTRACE, as in a default container) cannot lower PID 1's
    # limits (`prlimit --pid 1 --nofile=4:4`) or reach its stream. Changing the effective gid on the way
    # also makes this process non-dumpable, as PR_SET_DUMPABLE does. Commands get the plain gids back.
    gid = os.getgid()
    spare = 65534 if gid != 65534 else 65533
    try:
        os.setresgid(gid, spare, spare)
        os.setresgid(gid, gid, spare)
    except OSError:  # not root: prctl alone, if there was ctypes
        pass


def _as_command():
    """In a child that runs a command: a command's plain gids (see _harden)."""
    gid = os.getgid()
    try:
        os.setresgid(gid, gid, gid)
    except OSError:
        pass


def _exposed(pid):
    """Whether a command could reach this process's stream to the host (read its descriptors, so also write
    frames into it), tried from a child with a command's credentials. The host refuses such an executor."""
    child = os.fork()
    if child == 0:
        code = 0
        try:
            _as_command()
            os.readlink("/proc/%d/fd/1" % pid)  # needs the same access as opening it
            code = 1
        except OSError:
            pass
        finally:
            os._exit(code)
    while True:
        try:
            return os.waitpid(child, 0)[1] != 0
        except InterruptedError:
            continue


def _rename():
    """Show as NAME, not as `python3 ... import os ...`: a command's `pkill python3`, `pgrep -f import` or
    `killall python3` must find no process of miniswe's. The name (comm) through /proc/self/comm; the
    command line by overwriting the argv area in place (what /proc/PID/cmdline reads), as setproctitle does,
    through /proc/self/mem (no ctypes needed)."""
    with open("/proc/self/comm", "wb") as comm:
        comm.write(NAME[:15])  # the kernel keeps 15 bytes
    with open("/proc/self/stat", "rb") as stat:
        raw = stat.read()
    fields = raw[raw.rfind(b")") + 2 :].split()  # fields from the 3rd (state) on
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48 and 49)
    if end - start > len(NAME):
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(NAME + b"\0" * (end - start - len(NAME)))


def main():
    _harden()
    executor = Executor()
    executor.exposed = _exposed(executor.pid)
    signal.set_wakeup_fd(executor.wake_w)
    try:
        executor.serve()
    finally:
        executor.flush_pending()


if __name__ == "__main__":
    main()
