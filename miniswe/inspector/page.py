"""`inspect --html`: one self-contained page (inline CSS and JS, no network, no server) for a run or a batch.

The data is embedded once, as JSON in a `<script type="application/json">` element, escaped so that no text in
it can end that element; page.js builds every element from it with textContent, so commands and outputs are
shown, never interpreted. Steps are compact arrays (their field names listed once), a stored output is kept only
where it differs from what the model was shown, and step bodies are built when opened.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from miniswe import __version__
from miniswe.inspector.views import NOT_RUN, header_view, not_recorded, observations, pending_view, run_view, step_view
from miniswe.trajectory import Trajectory

# Characters of a stored output the page keeps (head and tail) when it differs from what the model saw;
# the whole of it is in the trajectory (`miniswe inspect TRAJ --full`).
PAGE_OUTPUT_LIMIT = 50_000
STEP_FIELDS = ("step", "thought", "reasoning", "command", "format_error", "returncode", "timed_out", "aborted",
               "status", "error", "duration_s", "observation", "output", "output_chars", "elided_chars", "tokens", "prompt_tokens",
               "completion_tokens", "cost", "latency_s", "finish_reason", "proposed", "pending")
# Everything a page may load: nothing from the network, only its own inline script and style.
CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
_ASSETS = os.path.dirname(__file__)


def run_data(trajectory: Trajectory) -> dict[str, Any]:
    """A run as the page reads it: its header view, and its steps as arrays of STEP_FIELDS. A stored output is
    kept only where the model was not shown all of it."""
    seen = observations(trajectory)
    missing = not_recorded(trajectory)
    steps = []
    for step in trajectory.steps:
        view = step_view(step, seen.get(step.step), missing)
        shown = view["observation"]
        view["output"] = _bounded(step.output) if shown is None or step.output not in shown else None
        steps.append([view.get(name) for name in STEP_FIELDS])
    pending = pending_view(trajectory, missing)
    if pending is not None:
        steps.append([pending.get(name) for name in STEP_FIELDS])
    return {"header": header_view(trajectory), "steps": steps}


def _bounded(text: str | None) -> str | None:
    if text is None or len(text) <= PAGE_OUTPUT_LIMIT:
        return text
    half = PAGE_OUTPUT_LIMIT // 2
    return (f"{text[:half]}\n[... {len(text) - PAGE_OUTPUT_LIMIT:,} characters left out of this page; "
            f"`miniswe inspect TRAJ --full` shows them ...]\n{text[-half:]}")


def trajectory_page(trajectory: Trajectory) -> str:
    title = f"miniswe run · {trajectory.metadata.get('task_id') or os.path.basename(trajectory.path)}"
    return render(title, {"kind": "trajectory", "run": run_data(trajectory)})


def batch_page(run_dir: str) -> str:
    """A batch: its totals and rows, and every task's run, each reachable from its row."""
    from miniswe.mini_swe_agent import load_any

    view = run_view(run_dir)
    inside = os.path.realpath(run_dir) + os.sep
    runs: dict[str, Any] = {}
    for row in view["rows"]:
        if row["exit_status"] == NOT_RUN:
            runs[row["id"]] = {"error": "not run: the batch stopped before this task started"}
            continue
        path = os.path.realpath(os.path.join(run_dir, row["trajectory"] or ""))
        if not row["trajectory"] or not path.startswith(inside):  # a page shows this batch's files, nothing else
            runs[row["id"]] = {"error": f"the ledger names no trajectory inside the run directory ({row['trajectory']!r})"}
            continue
        try:
            runs[row["id"]] = run_data(load_any(path))
            if row.get("grade") is not None:  # the ledger's grade is the batch's word on it
                runs[row["id"]]["header"]["grade"] = row["grade"]
        except Exception as error:  # noqa: BLE001 - one unreadable file must not lose the page of the others
            runs[row["id"]] = {"error": f"{row['trajectory']}: {error}"}
    return render(f"miniswe batch · {os.path.basename(view['path'])}", {"kind": "batch", "batch": view, "runs": runs})


def render(title: str, data: dict[str, Any]) -> str:
    data = {**data, "step_fields": STEP_FIELDS, "generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "miniswe_version": __version__}
    return "".join((
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
        f"<title>{_escape_text(title)}</title>\n<style>\n{_asset('page.css')}</style>\n</head>\n<body>\n",
        "<div id=\"app\"><p class=\"loading\">Loading…</p></div>\n",
        f"<script type=\"application/json\" id=\"miniswe-data\">{embed_json(data)}</script>\n",
        f"<script>\n{_asset('page.js')}</script>\n</body>\n</html>\n",
    ))


def embed_json(data: Any) -> str:
    """JSON that can sit inside a <script> element: `<`, `>` and `&` (and the two JS line separators) are
    written as \\u escapes, which JSON.parse reads back as the same characters, so `</script>` and `<!--` in
    a command or an output cannot end or change the element."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escape)
    return text


def _escape_text(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _asset(name: str) -> str:
    with open(os.path.join(_ASSETS, name), encoding="utf-8") as handle:
        return handle.read()


def write_page(path: str, page: str) -> int:
    """Write the page atomically; its size in bytes."""
    from miniswe.atomic import write_atomic
    from miniswe.errors import UsageError

    data = page.encode("utf-8", "replace")  # a lone surrogate in some output must not lose the page
    try:
        write_atomic(path, data)
    except OSError as error:
        raise UsageError(f"--html {path}: cannot write: {error.strerror or error}") from None
    return len(data)
