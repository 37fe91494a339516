"""The local environment's spawner: a small process that starts each command as its own child, adopts what
the command leaves behind, and kills all of it when miniswe is gone.

Run as `python3 -I -S spawner.py FD [--confine]` with a SOCK_SEQPACKET socket on fd FD (stdlib only,
imports nothing of miniswe). With `--confine`, each command is confined before it starts: by Linux Landlock,
it may write only under the working directory, /tmp and /dev/shm (and into existing files under /dev), and
(Landlock ABI 6+) may not signal any process outside its own sandbox; in a user and mount namespace of its own
where every other mount is read-only, it may not chmod, chown or touch what is outside either (Landlock has no
right for those), where the kernel allows unprivileged user namespaces (`spawner.py --probe` says whether it
does). It is a child subreaper, so a command's processes that outlive their parents (double forks,
`setsid`, `set -m` jobs) become its children instead of init's, and miniswe finds them all under it. It
ignores the signals a terminal or a `pkill` would send, and lives in its own session, so killing miniswe's
process group does not take it along. When the socket reports EOF (miniswe exited, even by `kill -9`),
it kills every process under it and exits.

Messages on the socket, one per datagram:
    miniswe -> spawner:  b"run" + command bytes, with the output pipe's write end attached (SCM_RIGHTS)
    spawner -> miniswe:  b"pid %d" once the command started; b"exit %d %d" (pid, wait status) when it ended
"""

import ctypes
import os
import select
import signal
import socket
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main() -> None:
    global _GUARD
    if "--confine" in sys.argv:
        _GUARD = guard_works()  # once, here: a command's own process may only succeed or fail closed
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: leftovers go to init, as without a spawner
    # caught, not ignored: an ignored signal would stay ignored in every command (exec keeps SIG_IGN), a
    # caught one is back to its default there
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(number, lambda *_: None)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)  # SIGCHLD wakes the select below
    channel = socket.socket(fileno=int(sys.argv[1]))
    devnull = os.open(os.devnull, os.O_RDONLY)
    commands: dict[int, subprocess.Popen] = {}
    try:
        while True:
            ready, _, _ = select.select([channel, wake_read], [], [])
            if wake_read in ready:
                os.read(wake_read, 4096)
                _reap(channel, commands)
            if channel in ready:
                try:
                    data, fds, _, _ = socket.recv_fds(channel, 1 << 20, 4)
                except OSError:
                    data, fds = b"", []
                if not data:
                    return  # miniswe is gone
                if data.startswith(b"run") and fds:
                    command = subprocess.Popen(
                        ["bash", "-c", data[3:].decode("utf-8", "surrogateescape")],
                        stdin=devnull, stdout=fds[0], stderr=fds[0], start_new_session=True,
                        preexec_fn=confine if "--confine" in sys.argv else None,  # this process has one thread
                    )
                    commands[command.pid] = command
                    channel.send(b"pid %d" % command.pid)
                for fd in fds:
                    os.close(fd)
    finally:
        kill_descendants(os.getpid())


def _reap(channel: socket.socket, commands: dict[int, subprocess.Popen]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        command = commands.pop(pid, None)
        if command is not None:
            # reaped here, so subprocess must never wait for this pid again (it may belong to another process soon)
            command.returncode = os.waitstatus_to_exitcode(status)
            try:
                channel.send(b"exit %d %d" % (pid, status))
            except OSError:
                pass


# Linux Landlock: syscall numbers (the same on every architecture) and access rights.
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_WRITE_FILE, _REMOVE_DIR, _REMOVE_FILE, _MAKE_CHAR, _MAKE_DIR, _MAKE_REG = 1 << 1, 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
_MAKE_SOCK, _MAKE_FIFO, _MAKE_BLOCK, _MAKE_SYM, _REFER, _TRUNCATE = 1 << 9, 1 << 10, 1 << 11, 1 << 12, 1 << 13, 1 << 14
_SCOPE_SIGNAL = 1 << 1
# Mount namespaces: unshare flags, and the new mount API (Linux 5.2, mount_setattr 5.12: older than Landlock)
_CLONE_NEWNS, _CLONE_NEWUSER = 0x20000, 0x10000000
_MS_REC, _MS_PRIVATE = 0x4000, 1 << 18
_OPEN_TREE, _MOVE_MOUNT, _MOUNT_SETATTR = 428, 429, 442
_AT_FDCWD, _AT_RECURSIVE, _OPEN_TREE_CLONE, _MOVE_MOUNT_F_EMPTY_PATH = -100, 0x8000, 1, 4
_MOUNT_ATTR_RDONLY = 1
# Shared with the rest of the machine, as they always are: scratch space, and POSIX shared memory and semaphores
# (multiprocessing.Lock() needs /dev/shm)
SCRATCH = ("/tmp", "/dev/shm")
_GUARD = False  # whether each command gets read-only mounts outside its folders (guard_works(), at start)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none."""
    try:
        abi = ctypes.CDLL(None, use_errno=True).syscall(_CREATE_RULESET, None, 0, 1)
    except (OSError, AttributeError):
        return 0
    return max(abi, 0)


def confine() -> None:
    """In a command's process, before it starts: writes only under the working directory, /tmp and /dev/shm (and
    into existing files under /dev); no chmod, chown or timestamp change elsewhere (where the kernel allows user
    namespaces); no signal to a process outside this sandbox (ABI 6+). Failing to confine must not run the
    command unconfined."""
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    if _GUARD:
        try:
            read_only_outside(os.getcwd())
        except BaseException:  # raised here, it would reach the spawner through Popen and end it
            os._exit(126)
    abi = landlock_abi()
    writes = (_WRITE_FILE | _REMOVE_DIR | _REMOVE_FILE | _MAKE_CHAR | _MAKE_DIR | _MAKE_REG | _MAKE_SOCK | _MAKE_FIFO
              | _MAKE_BLOCK | _MAKE_SYM | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0))
    attr = struct.pack("QQQ", writes, 0, _SCOPE_SIGNAL) if abi >= 6 else struct.pack("Q", writes)
    ruleset = libc.syscall(_CREATE_RULESET, attr, len(attr), 0)
    if ruleset < 0:
        os._exit(126)
    rules = [(os.getcwd(), writes)] + [(path, writes) for path in SCRATCH]
    rules.append(("/dev", _WRITE_FILE | (_TRUNCATE if abi >= 3 else 0)))
    for path, rights in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        rule = struct.pack("=Qi", rights, fd)
        libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, rule, 0)
        os.close(fd)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.syscall(_RESTRICT_SELF, ruleset, 0) != 0:
        os._exit(126)
    os.close(ruleset)


def read_only_outside(cwd: str) -> None:
    """Put this process in a user and mount namespace of its own where every mount is read-only except `cwd`,
    /tmp, /dev/shm (and /proc, whose writes Landlock governs): chmod, chown and utime outside them fail with
    EROFS. Landlock cannot refuse those: it has no access right for a file's metadata (ABI 1-7).

    The process keeps its user and group ids (mapped to themselves; other users' files show as owned by
    nobody). A second namespace inside the first locks the read-only flags, so not even root in it can mount
    them writable again; Landlock, applied next, forbids any mount change too."""
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()

    def call(result: int, what: str) -> int:
        if result < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"{what}: {os.strerror(code)}")
        return result

    writable = []
    for path in sorted({os.path.realpath(p) for p in (cwd, *SCRATCH) if os.path.isdir(p)}):
        if not any(path == w or path.startswith(w.rstrip("/") + "/") for w in writable):
            writable.append(path)  # a folder inside another writable one comes with it
    if "/" in writable:
        return  # the working directory is the root: nothing is outside it
    call(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "unshare")
    _map_own_ids(uid, gid)
    call(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
    trees = [(call(libc.syscall(_OPEN_TREE, _AT_FDCWD, path.encode(), _OPEN_TREE_CLONE | os.O_CLOEXEC | _AT_RECURSIVE),
                   f"open_tree {path}"), path) for path in writable]
    read_only = struct.pack("QQQQ", _MOUNT_ATTR_RDONLY, 0, 0, 0)
    writable_again = struct.pack("QQQQ", 0, _MOUNT_ATTR_RDONLY, 0, 0)
    call(libc.syscall(_MOUNT_SETATTR, _AT_FDCWD, b"/", _AT_RECURSIVE, read_only, len(read_only)), "read-only /")
    # /proc stays writable: the second namespace's id maps are written there (Landlock refuses the command's own
    # writes to /proc)
    if os.path.ismount("/proc"):
        call(libc.syscall(_MOUNT_SETATTR, _AT_FDCWD, b"/proc", _AT_RECURSIVE, writable_again, len(writable_again)),
             "writable /proc")
    for fd, path in trees:  # the writable copies, taken before, go back over their folders
        call(libc.syscall(_MOVE_MOUNT, fd, b"", _AT_FDCWD, path.encode(), _MOVE_MOUNT_F_EMPTY_PATH),
             f"move_mount {path}")
        os.close(fd)
    call(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "unshare")
    _map_own_ids(uid, gid)
    os.chdir(cwd)  # onto the writable copy: the old working directory is the read-only folder under it


def _map_own_ids(uid: int, gid: int) -> None:
    """In a new user namespace: this process's ids mean the same as outside (the only mapping an unprivileged
    process may write)."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def guard_works() -> bool:
    """Whether read_only_outside() works here (unprivileged user namespaces allowed, the new mount API present),
    tried in a throwaway child of this single-threaded process."""
    pid = os.fork()
    if pid == 0:
        try:
            read_only_outside(os.getcwd())
            code = 0
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def children(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc (every thread's list)."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found += [int(child) for child in handle.read().split()]
        except OSError:
            continue
    return found


def descendants(pid: int) -> list[int]:
    """Every process under `pid`, parents before their children."""
    found, queue = [], children(pid)
    while queue:
        child = queue.pop(0)
        found.append(child)
        queue += children(child)
    return found


def kill_descendants(pid: int, *, deadline_s: float = 2.0) -> int:
    """Stop, then kill, every process under `pid` until none is left (a fork bomb gets frozen first)."""
    killed = 0
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        found = descendants(pid)
        if not found:
            break
        for victim in found:
            try:
                os.kill(victim, signal.SIGSTOP)
            except OSError:
                pass
        for victim in found:
            try:
                os.kill(victim, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        if pid == os.getpid():
            _reap_quietly()
        time.sleep(0.005)
    return killed


def _reap_quietly() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


if __name__ == "__main__":
    if sys.argv[1:2] == ["--probe"]:
        sys.exit(0 if guard_works() else 1)
    main()
    os._exit(0)  # all it started is dead: the interpreter's teardown (about 8 ms) would only hold miniswe's exit
