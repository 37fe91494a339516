"""Grading a submitted patch by the official SWE-bench rules, as the harness's run_evaluation does it.

The harness's own functions decide: make_test_spec (the instance's eval script, FAIL_TO_PASS and PASS_TO_PASS,
its log parser), its patch-apply commands, and get_eval_report on the test log. What miniswe does differently
is only where the commands run: a fresh container of the task's environment kind (the instance's image; never
the agent's container, which the agent may have damaged), so the batch's container limits, labels and cleanup
hold for grading too.

Each grade has a status, and `resolved` is False only with a reason the official harness also counts as not
resolved (unresolved tests, no patch, a patch that does not apply, an eval past its timeout); grading that could
not happen (an image that cannot be pulled, an engine failure, a stop) leaves `resolved` unknown, for
`miniswe evaluate` to grade again.
"""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Any

from miniswe.errors import MinisweError, SandboxError, UsageError

GRADE_DIR = "grade"  # RUN_DIR/<id>/grade: the patch, eval script, test log and the harness's report
TIMEOUT_S = 1800.0  # the harness's own default (run_evaluation --timeout)
APPLY_TIMEOUT_S = 600.0
# Verdicts the official harness gives too: each is resolved or not.
VERDICTS = {"resolved": True, "unresolved": False, "empty_patch": False, "patch_failed": False, "eval_timeout": False}
# Grading that did not happen: no verdict; a later batch or `miniswe evaluate` grades these again.
NOT_GRADED = ("image_unavailable", "error", "interrupted")
NEEDS = ("image", "eval_script", "log_parser", "eval_type", "FAIL_TO_PASS", "PASS_TO_PASS")


def harness_version() -> str:
    from miniswe.swebench import require

    return f"swebench {getattr(require('swebench', 'grading'), '__version__', '?')}"


def check_grading(tasks: list[Any]) -> str | None:
    """Why these tasks cannot be graded (one line, with the fix), or None when they can."""
    from miniswe.swebench import require

    require("swebench.harness.grading", "grading SWE-bench tasks")
    for task in tasks:
        if not task.swebench:
            return f"task {task.id} is not a SWE-bench instance (no instance_id); only SWE-bench instances are graded"
        missing = [key for key in NEEDS if key not in task.fields]
        if missing:
            return (f"instance {task.id} has no {', '.join(missing)}: the {harness_version()} harness grades instances "
                    "in the current SWE-bench format; load the dataset by name (e.g. verified) or export it again")
    return None


def needs_grade(record: Any) -> bool:
    """A kept ledger record that grading has not given a verdict yet."""
    from miniswe.status import is_agent_outcome

    grade = getattr(record, "grade", None)
    return is_agent_outcome(record.exit_status) and (not grade or grade.get("status") in NOT_GRADED)


def grade_patch(instance: dict[str, Any], patch: str | None, environment: Any, *, run_id: str, folder: str,
                timeout: float = TIMEOUT_S, model: str = "miniswe", stop: Any = None) -> dict[str, Any]:
    """Grade `patch` for `instance` in a fresh container; the grade as the ledger records it. Writes the patch,
    the eval script, the test log and the harness's report into `folder`. Never raises for a failed grading."""
    started, began = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    os.makedirs(folder, exist_ok=True)
    try:
        status, detail, tests = _grade(instance, patch, environment, run_id=run_id, folder=folder, timeout=timeout,
                                       model=model, stop=stop)
    except _Stopped as error:
        status, detail, tests = "interrupted", str(error), None
    except MinisweError as error:
        status, detail, tests = "error", str(error), None
    grade = {
        "status": status, "resolved": VERDICTS.get(status), "detail": detail, "tests": tests,
        "started": began, "wall_s": round(time.monotonic() - started, 3), "harness": harness_version(),
        "log": os.path.join(os.path.basename(os.path.dirname(os.path.abspath(folder))), GRADE_DIR, "test_output.txt"),
    }
    _write(os.path.join(folder, "grade.json"), json.dumps(grade, indent=2) + "\n")
    return grade


def _grade(instance, patch, environment, *, run_id, folder, timeout, model, stop) -> tuple[str, str, dict | None]:
    from miniswe.swebench import require

    harness = require("swebench.harness.run_evaluation", "grading SWE-bench tasks")
    from swebench.harness.constants import APPLY_PATCH_FAIL, CONTAINER_PATCH_FILE
    from swebench.harness.grading import get_eval_report
    from swebench.harness.utils import make_test_spec

    if not (patch or "").strip():
        return "empty_patch", "no patch was submitted", None
    try:
        spec = make_test_spec(instance)
    except KeyError as error:
        raise UsageError(f"instance {instance.get('instance_id')} has no {error.args[0]}; the harness needs it to "
                         "grade: load the dataset by name (e.g. verified) or export it again") from None
    if not hasattr(environment, "image"):
        raise UsageError(f"environment.kind {environment.kind}: grading runs the instance's image in a container; "
                         "use a container kind (docker)")
    _write(os.path.join(folder, "patch.diff"), patch)
    eval_script = spec.eval_script
    if spec.image_assets:  # multimodal: binary test files a text patch cannot carry, restored before the tests
        eval_script = _with_assets(harness, spec, folder, eval_script)
    _write(os.path.join(folder, "eval.sh"), eval_script)
    # the harness's container: the instance's image, at its workdir, every byte of the test log kept
    from swebench.image_builder.constants import CONTAINER_WORKDIR

    config = environment.model_copy(update={"image": spec.image, "cwd": CONTAINER_WORKDIR, "capture_limit": 0})
    from miniswe.environments import build_environment

    try:
        env = build_environment(config, run_id=run_id, stop=stop)
    except SandboxError as error:
        text = str(error)
        unavailable = text.startswith("cannot pull image") or "is not present" in text
        return ("image_unavailable" if unavailable else "error"), text, None
    try:
        run = _runner(env, stop)
        run(_put(CONTAINER_PATCH_FILE, patch), 60)
        applied, output = False, ""
        for attempt, command in enumerate(harness.GIT_APPLY_CMDS):
            if attempt:  # as the harness does: a failed attempt (--reject) leaves partial state behind
                run("git checkout -- . ; git clean -fd", APPLY_TIMEOUT_S)
            result = run(f"{command} {CONTAINER_PATCH_FILE}", APPLY_TIMEOUT_S)
            output = result.output
            if result.returncode == 0:
                applied = True
                break
        if not applied:  # the chain can leave the patch applied while each command still exited non-zero
            applied = run(f"git apply --check --reverse {CONTAINER_PATCH_FILE}", APPLY_TIMEOUT_S).returncode == 0
        if not applied:
            _write(os.path.join(folder, "test_output.txt"), f"{APPLY_PATCH_FAIL}:\n{output}")
            return "patch_failed", f"the patch does not apply: {_last_line(output)}", None
        run(_put("/eval.sh", eval_script), 60)
        result = run("/bin/bash /eval.sh", timeout)
    finally:
        env.close()
    log = os.path.join(folder, "test_output.txt")
    _write(log, result.output + (f"\n\nTimeout error: {timeout:g} seconds exceeded." if result.timed_out else ""))
    if result.timed_out:
        return "eval_timeout", f"the eval script ran past its {timeout:g}s timeout (the harness counts that as not resolved)", None
    prediction = {"instance_id": spec.instance_id, "model_name_or_path": model, "model_patch": patch}
    report = get_eval_report(test_spec=spec, prediction=prediction, test_log_path=log, include_tests_status=True)
    _write(os.path.join(folder, "report.json"), json.dumps(report, indent=4))
    verdict = report[spec.instance_id]
    tests = {key: value for key, value in (verdict.get("tests_status") or {}).items() if key in ("FAIL_TO_PASS", "PASS_TO_PASS")}
    if verdict.get("resolved"):
        return "resolved", _counts(tests), tests
    if not verdict.get("patch_successfully_applied"):  # the harness found no test results in the log
        why = verdict.get("infra_failure_reason") or "the test patch did not apply, or the tests errored before reporting"
        return "unresolved", f"no test results in the log ({why}); see {GRADE_DIR}/test_output.txt", tests or None
    return "unresolved", _counts(tests), tests


def _runner(env: Any, stop: Any):
    """env.execute that a stop interrupts, and that turns a dead container into SandboxError."""
    def run(command: str, timeout: float):
        if stop is not None and stop.outcome is not None:
            raise _Stopped()
        if stop is not None:
            with stop.cancelling(env.interrupt):
                result = env.execute(command, timeout=timeout)
        else:
            result = env.execute(command, timeout=timeout)
        if result.sandbox_error:
            raise SandboxError(result.sandbox_error)
        if result.interrupted:
            raise _Stopped()
        return result

    return run


class _Stopped(SandboxError):
    def __init__(self) -> None:
        super().__init__("the batch was stopped during grading; grade again with `miniswe evaluate RUN_DIR`")


def _put(path: str, text: str) -> str:
    """A command writing `text` to `path` in the container: base64 on stdin keeps any byte of a patch intact."""
    encoded = base64.b64encode(text.encode("utf-8", "surrogateescape")).decode("ascii")
    lines = "\n".join(encoded[i:i + 76] for i in range(0, len(encoded), 76))
    return f"base64 -d > {path} <<'MINISWE_B64'\n{lines}\nMINISWE_B64"


def _with_assets(harness: Any, spec: Any, folder: str, eval_script: str) -> str:
    """The harness's own asset staging, adapted to a miniswe container: fetch each declared asset (a URL), and
    restore it in the working tree just before the tests, as `_inject_asset_restore` places it."""
    import logging

    restore, puts = [], []
    for key in ("test_patch", "patch"):
        for entry in spec.image_assets.get(key) or []:
            if not entry.get("path"):
                continue
            data = harness._resolve_asset_bytes({**entry, "instance_id": spec.instance_id}, None, logging.getLogger("miniswe"))
            if data is None:
                continue
            flat = entry["path"].replace("/", "__")
            encoded = base64.b64encode(data).decode("ascii")
            puts.append(f"mkdir -p /image_assets && base64 -d > /image_assets/{flat} <<'MINISWE_B64'\n{encoded}\nMINISWE_B64")
            restore.append(f"mkdir -p $(dirname {entry['path']}) && cp /image_assets/{flat} {entry['path']}")
    return harness._inject_asset_restore(eval_script, puts + restore)


def _counts(tests: dict[str, Any]) -> str:
    parts = []
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        found = tests.get(key) or {}
        passed, failed = len(found.get("success") or []), len(found.get("failure") or [])
        parts.append(f"{key} {passed}/{passed + failed} passed")
    return ", ".join(parts)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def _write(path: str, text: str) -> None:
    from miniswe.atomic import write_atomic

    write_atomic(path, text.encode("utf-8", "surrogateescape"))
