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
    for command in ("sudo " * 20000 + "ls", "x=1 " * 20000 + "ls", "rm " + "-f " * 20000 + "x", "kill " + "1 " * 20000,
                    "(" * 20000, "sudo a; " * 5000):
        assert verdict(command) is None
    assert time.perf_counter() - started < 10
