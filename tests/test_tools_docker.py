"""Tool calls in a container: the file tools run inside it (confined there too), a sub-agent works in the same
container, and an image without python3 says why its file tools cannot run."""

from __future__ import annotations

import json

import pytest
from conftest import SUBMIT, act  # noqa: F401

from replies import TOOL_SUBMIT, call, calls

try:  # the engine gate lives in test_docker.py (a skip without an engine, a failure when CI says there is one)
    from test_docker import IMAGE, _engine_problem, no_python_image  # noqa: F401  (a fixture)
except pytest.skip.Exception as no_engine:
    pytest.skip(no_engine.msg, allow_module_level=True)

pytestmark = pytest.mark.docker


def endpoint(server):
    return ["--base-url", server.base_url, "-m", "test-model"]


def test_file_tools_and_a_sub_agent_work_inside_the_container(cli, server, tmp_path):
    server.push(
        calls(call("write_file", path="notes/a.txt", content="from the parent\n"),
              call("bash", command="ln -s /etc door; hostname > host.txt"),
              call("read_file", path="door/hostname"),
              call("read_file", path="/etc/hostname")),
        calls(call("subagent", task="Append 'from the child' to notes/a.txt")),
        calls(call("edit_file", path="notes/a.txt", action="insert", after_line=1, text="appended by the child")),  # child
        calls(call("submit", command="cat notes/a.txt host.txt")),  # child
        calls(call("read_file", path="notes/a.txt"), call("bash", command="cat host.txt; hostname")),
        TOOL_SUBMIT,
    )
    result = cli("run", "x", *endpoint(server), "--image", IMAGE, "-c", "environment.cwd=/tmp", "-c", "protocol.kind=tools",
                 "-c", "protocol.file_tools=true", "-c", "agent.max_depth=1", "-o", "t.json", timeout=120)
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / "t.json").read_text())
    steps = data["steps"]
    assert steps[0]["output"] == "wrote 16 bytes to notes/a.txt" and steps[0]["returncode"] == 0
    for refused in steps[2:4]:
        assert refused["returncode"] == 1 and "outside the working directory /tmp" in refused["output"]
    assert not (tmp_path / "notes").exists()  # written in the container, not on the host
    link, = steps[4]["children"]
    child = json.loads(open(link["trajectory"]).read())
    assert child["exit_status"] == "Submitted" and child["steps"][0]["output"].startswith("edited notes/a.txt")
    assert steps[5]["output"] == "from the parent\nappended by the child\n"
    host, again = steps[6]["output"].split()
    assert host == again  # the child ran in the parent's container, not in one of its own


def test_an_image_without_python_says_its_file_tools_cannot_run(cli, server, tmp_path, no_python_image):
    server.push(calls(call("read_file", path="x"), call("bash", command="echo bash works")), TOOL_SUBMIT)
    result = cli("run", "x", *endpoint(server), "--image", no_python_image, "-c", "protocol.kind=tools",
                 "-c", "protocol.file_tools=true", "-o", "t.json", timeout=120)
    assert result.returncode == 0, result.stderr
    steps = json.loads((tmp_path / "t.json").read_text())["steps"]
    assert steps[0]["returncode"] == 127 and "the file tools could not start python3 where commands run" in steps[0]["output"]
    assert steps[1]["output"] == "bash works\n"
