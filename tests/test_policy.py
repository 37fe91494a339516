"""The default command policy, read as a careless model writes commands: what it must refuse however it is
spelled, and the lookalikes it must leave alone. No command here is ever run: the policy only reads them."""

from types import SimpleNamespace

import pytest

from miniswe.policy import DENY, CommandPolicy, PolicyConfig

REFUSED = {
    "delete-root-or-home": [
        "rm -rf /", "rm -rf ~", "rm -rf ~/", "rm -rf $HOME", "rm -rf $HOME/", "rm -rf ${HOME}/*", 'rm -rf "$HOME"',
        'rm -rf "/"', "rm -rf '/'", "rm -fr --no-preserve-root /", "  rm -rf /", "cd x && rm -rf /*",
        "if true; then rm -rf /; fi", "sudo -E rm -rf /", "sudo -u root rm -rf ~", "/bin/rm -rf /", "\\rm -rf ~",
        "find . | xargs rm -rf /", "X=1 rm -rf /", "echo $(rm -rf ~)", "env LC_ALL=C rm -r /",
    ],
    "mkfs": ["mkfs.ext4 /dev/sdb1", "sudo mkfs -t ext4 /dev/sdb", "ls; mkfs /dev/sdb"],
    "raw-disk-write": ["dd if=/dev/zero of=/dev/sda bs=1M", "cat img > /dev/nvme0n1", "echo x >/dev/vda"],
    "fork-bomb": [":(){ :|:& };:", "bomb() { bomb | bomb & }; bomb"],
    "shutdown": ["shutdown -h now", "sudo reboot", "nohup reboot", "exec poweroff", "systemctl reboot", "init 0",
                 "sleep 1; halt"],
    "kill-all": ["kill -9 -1", "kill -- -1", "kill -s KILL -1", "kill -KILL -1", "sudo kill -9 -1"],
    "chmod-root": ["chmod -R 777 /", "sudo chown -R me /", "chgrp -R staff /"],
}

ALLOWED = [
    "rm -rf ./build", "rm -rf build/", "rm -rf /tmp/x", "rm -rf ~/project/build", "rm -rf $HOME/.cache/pip",
    "rm -rf '$HOME'", 'rm -rf "~"', "ls /", "ls ~", 'echo "rm -rf /"', "echo 'sudo reboot'", "# rm -rf /",
    "grep -rn mkfs src/", "man mkfs", "git grep mkfs", "cat mkfs.txt", "echo mkfs", "grep reboot /var/log/syslog",
    "man shutdown", "kill -1 $(cat app.pid)", "kill -9 1234", "kill -HUP 42", "chmod -R 755 ./dist",
    "chown -R me /srv/app", "dd if=/dev/zero of=disk.img bs=1M count=1", "cat /dev/sda1.txt", "pkill -f my-server",
    "python -c 'import os'", "grep -c 'of=/dev/sda' notes.md",
]


def verdict(command: str, config: PolicyConfig = PolicyConfig()) -> str | None:
    event = SimpleNamespace(command=command, veto=None, tool="bash")
    CommandPolicy(config, environment_kind="local").before_command(event)
    return event.veto


@pytest.mark.parametrize("rule,command", [(rule, c) for rule, commands in REFUSED.items() for c in commands])
def test_the_defaults_refuse_host_destroying_commands_however_they_are_written(rule, command):
    veto = verdict(command)
    assert veto and f"(policy.deny: {rule})" in veto, f"{command!r} was not refused as {rule}: {veto}"


@pytest.mark.parametrize("command", ALLOWED)
def test_the_defaults_leave_their_lookalikes_alone(command):
    assert verdict(command) is None


def test_every_built_in_rule_is_on_by_default_and_can_be_left_out_by_name():
    assert PolicyConfig().deny == list(DENY)
    assert verdict("mkfs /dev/sdb", PolicyConfig(deny=["delete-root-or-home"])) is None
    assert "(policy.deny: delete-root-or-home)" in verdict("rm -rf ~", PolicyConfig(deny=["delete-root-or-home"]))
    mine = verdict("terraform destroy -auto-approve", PolicyConfig(deny=[r"terraform\s+destroy"]))
    assert mine.startswith("refused by the command policy: it matches policy.deny (policy.deny: terraform\\s+destroy)")


def test_a_pathological_command_does_not_stall_the_run():
    """Patterns that could match a command in many ways took minutes on these (catastrophic backtracking)."""
    import time

    started = time.perf_counter()
    for command in ("sudo " * 20000 + "ls", "x=1 " * 20000 + "ls", "rm " + "-f " * 20000 + "x", "kill " + "2 " * 20000,
                    "(" * 20000, "sudo a; " * 5000, "cat > blob.hex <<'EOF'\n" + "a1" * 50000 + "\nEOF"):
        assert verdict(command) is None
    assert time.perf_counter() - started < 10


# ------------------------------------------------------------------ docs/security.md's table is the policy

def table_rows():
    """docs/security.md's deny table: (rule, what it refuses, what it leaves alone), each a list of commands."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).parent.parent / "docs" / "security.md").read_text()
    rows = []
    for line in text[text.index("| rule | refuses"):].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        rule = cells[0].strip("`")
        rows.append((rule, re.findall(r"`([^`]+)`", cells[1]), re.findall(r"`([^`]+)`", cells[2])))
    return rows


def spellings(command: str) -> list[str]:
    """Ways a shell accepts to write `command`: each must be read as the same command."""
    import shlex

    quoted = shlex.quote(command)
    ways = [command, "  \t" + command, command + " # why not", "true; " + command, "true && " + command,
            "false || " + command, "true\n" + command, "(" + command + ")", "{ " + command + "; }",
            "if true; then " + command + "; fi", "for x in 1; do " + command + "; done", "echo $(" + command + ")",
            'echo "$(' + command + ')"', "echo `" + command + "`", "bash -c " + quoted, "sh -c " + quoted,
            "bash -lc " + quoted, "eval " + quoted, "su -c " + quoted, "sh <<'EOF'\n" + command + "\nEOF",
            "echo " + quoted + " | sh", "bash <<< " + quoted]
    if command.startswith((":", "bomb")):
        return ways  # a fork bomb is a function definition: no options, redirections or wrappers
    name, _, rest = command.partition(" ")
    ways += [command + " >/dev/null", command + " 2>/dev/null", command + " 2>&1", command + " &>/dev/null",
             command + " </dev/null", command + " &"]
    if not command[-1].isdigit():  # `init 0>x` is init with its input redirected
        ways.append(command + ">/dev/null 2>&1")
    simple = not any(c in command for c in ";&|\n$")
    if simple:
        ways += [prefix + command for prefix in (
            "sudo ", "sudo -u root -E ", "sudo -- ", "doas ", "env ", "env LC_ALL=C ", "X=1 ", "X=1 Y=2 ",
            "nohup ", "nice -n 5 ", "timeout 5 ", "timeout -s KILL 5 ", "command ", "exec ",
            "setsid ", "stdbuf -o0 ", "time ", "! ", "git ls-files | xargs ", "xargs -0 ", "sudo env X=1 nice ")]
        ways += ["\\" + command, "/usr/bin/" + command, '"' + name + '" ' + rest, "'" + name + "' " + rest,
                 name + " \\\n" + rest, name + "\t" + rest]
    return ways


ROWS = table_rows()


def test_the_table_lists_every_built_in_rule():
    assert [rule for rule, _, _ in ROWS] == list(DENY)


@pytest.mark.parametrize("rule,command", [(rule, c) for rule, refused, _ in ROWS for c in refused])
def test_every_command_the_table_refuses_is_refused_however_it_is_spelled(rule, command):
    missed = [way for way in spellings(command) if f"(policy.deny: {rule})" not in (verdict(way) or "")]
    assert not missed, f"{rule} let through: {missed}"


@pytest.mark.parametrize("command", [c for _, _, allowed in ROWS for c in allowed])
def test_every_command_the_table_leaves_alone_runs_however_it_is_spelled(command):
    import shlex

    ways = [command, "sudo " + command, command + " 2>/dev/null", "true && " + command, "(" + command + ")",
            "bash -c " + shlex.quote(command), "echo $(" + command + ")"]
    assert [way for way in ways if verdict(way)] == []


# ------------------------------------------------------------------ what issue 18 found, and its class

REFUSED_TOO = {
    "delete-root-or-home": [
        "rm -rf ~>/dev/null", "rm -rf ~ 2>/dev/null", "rm -rf ~&>/dev/null", "rm -rf ~;", "rm -rf ~|cat", "rm -Rf ~",
        "rm -r -f ~", "rm --recursive --force ~", "rm --rec ~", "rm ~ -rf", "rm -- ~", "rm -rf ~root",
        "rm -rf ${HOME:?}/", "rm -rf \"${HOME}\"/", "rm -rf $HOME/.", "rm -rf ~/./", "rm -rf ~/x/../", "rm -rf //",
        "rm -rf /./", "rm -rf /tmp/../", "rm -rf '/'*", "rm -rf /.[!.]*", "rm -rf /home", "rm -rf /home/*",
        "rm -rf /boot", "rm -rf /usr/local", "rm -rf /var/*", "cd / && rm -rf *", "cd; rm -rf .", "cd ~/x && rm -rf ..",
        "pushd /etc && rm -rf ./*", "D=/; rm -rf $D", "D=~; rm -rf \"$D\"", "export D=/etc; rm -rf $D",
        "{rm,-rf,/}", "rm -rf /{tmp/x,etc}", "r''m -rf /", "$'\\x72m' -rf /", "r\\m -rf /", "rm -rf $'/'",
        "env -S 'rm -rf /'", "watch rm -rf /", "flock /tmp/l rm -rf /", "flock /tmp/l -c 'rm -rf /'",
        "busybox rm -rf /", "sh -c \"sh -c 'rm -rf /'\"", "bash -e -x -c 'rm -rf /'", "cat <(rm -rf ~)",
        "x=$(rm -rf ~)", "f() { rm -rf ~; }", "sh <<EOF\nls\nrm -rf ~\nEOF", "cat <<EOF\n$(rm -rf ~)\nEOF",
        "printf 'rm -rf ~' | bash", "case x in x) rm -rf ~;; esac", "rm$IFS-rf$IFS/", "r=rm; $r -rf ~",
        "echo ~ | xargs rm -rf", "echo / | sudo xargs -n1 rm -rf", "rm -rf /Users/alice", "rm -rf /root",
    ],
    "chmod-root": [
        "chmod 777 -R /", "chmod --recursive 777 /", "chmod -R 777 /*", "chmod -fR 777 /", "chmod -Rv 777 /",
        "chmod --rec 777 /", "chmod -R -- 777 /", "chmod -R a+w ~", "chmod -R 777 ~/", "chown -R me:me /etc",
        "chown me / -R", "chgrp --recursive staff /usr", "chmod 000 /", "chmod 777 /*", "sudo chmod -R 777 /",
        "chown -hR me /", "chattr -R +i /", "setfacl -R -m u:x:rwx ~",
    ],
    "raw-disk-write": [
        "tee /dev/sda", "tee -a /dev/sdb1", "echo x | tee x.log /dev/nvme0n1", "cp x /dev/sda", "cp -f x /dev/sda",
        "cp -t /dev/sda x", "install x /dev/vda", "cat x >/dev/sda", "cat x >> /dev/sda", "cat x &>/dev/sda",
        "cat x 1>/dev/sda", "cat x >|/dev/sda", "exec 3<>/dev/sda", "cd /dev && cat x > sda", "tee /dev/sd?",
        "dd of=/dev/mmcblk0p1 if=x", "dd if=x of=/dev/disk/by-id/ata-X", "dd if=x of=/dev/mapper/root",
        "shred -n 1 /dev/sda", "blkdiscard /dev/nvme0n1", "ddrescue in.img /dev/sdc", "rsync -a x /dev/sda",
        "sfdisk /dev/sda < table", "parted -s /dev/sda mklabel gpt", ": > /dev/sda", "> /dev/sda", "exec >/dev/sda",
    ],
    "shutdown": [
        "telinit 6", "telinit 0", "init 6", "systemctl -i reboot", "systemctl reboot -i", "systemctl --force poweroff",
        "systemctl halt", "systemctl kexec", "systemctl suspend", "systemctl start poweroff.target",
        "loginctl reboot", "/sbin/reboot -f", "echo o > /proc/sysrq-trigger", "echo b | tee /proc/sysrq-trigger",
        "kexec -e", "busybox reboot", "kill -INT 1", "kill 1", "sudo kill -s TERM 1",
    ],
    "kill-all": ["kill -9 -- -1", "kill -n 9 -1", "kill --signal KILL -1", "kill -sKILL -1", "kill 123 -1",
                 "pkill -9 -u me", "pkill -U 1000", "pkill .", "killall -9 -u me", "builtin kill -9 -1", "kill -9 -01",
                 "kill -9 '-1'"],
    "mkfs": ["mke2fs /dev/sdb", "mkfs.xfs -f /dev/nvme0n1", "mkswap /dev/sdb2", "command mkfs /dev/sdb", "mkdosfs /dev/sdb"],
    "fork-bomb": ["bash -c ':(){ :|:& };:'", "f(){ f|f& };f", "function f { f|f& }; f", ":(){ :|:& };\n:",
                  "f() { f & f; }; f"],
}

ALLOWED_TOO = [
    "rm -rf ./build", "rm -rf build 2>/dev/null", "rm -rf ~/.cache/pip >/dev/null", "rm -rf ~/*.pyc", "rm -rf /tmp/x",
    "rm -rf /usr/local/lib/x", "rm -f /etc/foo.conf", "rm -rf $TMPDIR/x", "rm -rf \"$DIR\"", "rm -rf ~user/x",
    "cd /tmp && rm -rf x", "cd ~/proj && rm -rf build", "D=/tmp/x; rm -rf $D", "HOME=/tmp/h; rm -rf ~",
    "echo rm -rf /", "echo 'rm -rf ~' > notes.txt", "cat <<EOF\nrm -rf ~\nEOF", "cat <<'EOF'\n$(rm -rf ~)\nEOF",
    "git commit -m \"rm -rf /\"", "git commit -m 'chmod -R 777 /'", "grep -rn 'reboot' .", "echo '# rm -rf /'",
    "ls | xargs -I{} rm -rf {}", "find . -name '*.pyc' -delete", "command -v rm", "type reboot", "which shutdown",
    "chmod -R 755 ./dist", "chmod +x run.sh", "chmod -x ~/bin/tool", "chmod 700 ~", "chmod -R go-w ~/project",
    "chown -R me /srv/app", "echo hi > /dev/null", "echo hi >/dev/stderr", "cat /dev/sda", "cat /dev/sda > disk.img",
    "dd if=/dev/sda of=disk.img", "cp /dev/sda disk.img", "cat x > /dev/sda1.txt", "ls /dev/sd*", "lsblk /dev/sda",
    "systemctl status reboot.target", "systemctl restart nginx", "journalctl -b -1", "init 3", "kill -1 123",
    "kill -l", "kill -9 $(cat app.pid)", "pkill -f server", "pkill -u me python", "killall -u me python",
    "case $1 in reboot) echo soon;; esac", "echo ${#x}", "echo $((1<<2))", "x=(rm -rf /)", "man rm",
    "rm -rf /home/alice/project/build", "echo build | xargs rm -rf", "ls | xargs rm -rf", "kill -0 1", "kill 12",
    "chattr +i notes.txt", "parted /dev/sda print", "sfdisk -l /dev/sda", "sgdisk -p /dev/sda",
    "f() { echo f | grep f; }; f", "f(){ f|f& }; echo f", "fib() { fib 1; }", "printf '%s' / | xargs ls",
]


@pytest.mark.parametrize("rule,command", [(rule, c) for rule, commands in REFUSED_TOO.items() for c in commands])
def test_other_spellings_of_the_rules_are_refused(rule, command):
    veto = verdict(command)
    assert veto and f"(policy.deny: {rule})" in veto, f"{command!r} was not refused as {rule}: {veto}"


@pytest.mark.parametrize("command", ALLOWED_TOO)
def test_lookalikes_of_other_spellings_are_left_alone(command):
    assert verdict(command) is None


def test_own_regexes_read_the_text_a_command_hands_to_a_shell():
    config = PolicyConfig(deny=[r"terraform\s+destroy"], confirm=[r"git\s+push"])
    assert verdict("bash -c 'terraform destroy'", config)
    assert verdict("echo 'terraform destroy'", config) is None
    assert "policy.confirm" in verdict("sh -c 'git push --force'", config)
    assert verdict("git commit -m 'git push later'", config) is None


def test_random_shell_text_never_breaks_the_reader():
    """Unbalanced quotes, stray operators and deep nesting: read in linear time, never an exception."""
    import random
    import time

    from miniswe.policy import read_command

    pieces = ["rm", " -rf", " /", " ~", "'", '"', "\\", "$(", ")", "`", "(", "{", "}", "<<", "EOF", "\n", ";", "&",
              "|", ">", "2>&1", "$HOME", "${", "$'", "#", "=", "x", "*", ",", "~/", "..", " ", "<(", "sudo ", "-c "]
    rng = random.Random(18)
    started = time.perf_counter()
    for _ in range(3000):
        read_command("".join(rng.choice(pieces) for _ in range(rng.randrange(1, 60))))
    for text in ("$(" * 20000, "`" * 20001, "'" * 20001, "{" * 20000, "{a,b}" * 40, "x<<E\n" * 20000, "bash -c " * 5000,
                 "eval " * 20000 + "ls", "rm " + "~ " * 20000, "a=" * 20000, "\\" * 20001):
        read_command(text)
    assert time.perf_counter() - started < 20
