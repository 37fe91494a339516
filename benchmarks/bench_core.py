"""Agent core overhead on this machine, against a zero-latency scripted server on 127.0.0.1.

    python benchmarks/bench_core.py [--steps 300]

Reports: `miniswe --help` wall time and a run that ends at its first step (wall and peak RSS), each against
a bare standard-library process doing one step (one HTTP call, one regex, one `bash -c`); per-step overhead
(server's answer -> the agent's next request) over N steps, against the same bare loop, against the bare loop
that also saves its record atomically after every step (what "every finished step stays on disk" costs at
least), and with context compaction at work (2 KB outputs, a 16k-token window enforced by the server); peak
RSS of a run whose commands each print 100 MB.
"""

from __future__ import annotations

import argparse
import http.client
import inspect
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from urllib.parse import urlsplit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)
from openai_server import ScriptedServer  # noqa: E402
from replies import SLOW_LINES, SUBMIT_MARKER, act, adversarial_reply  # noqa: E402

from miniswe.protocol import FormatError, parse_command  # noqa: E402

SUBMIT = act(f"echo {SUBMIT_MARKER}")


def child_peak_rss(argv: list[str], cwd: str, env: dict) -> tuple[float, float, int]:
    """(wall s, peak RSS MB, returncode) of one child, via wait4 so earlier children don't count."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    return time.perf_counter() - started, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def parse_seconds(text: str) -> float:
    started = time.perf_counter()
    try:
        parse_command(text)
    except FormatError:
        pass
    return time.perf_counter() - started


def gaps(requests: list[dict]) -> list[float]:
    chat = [r for r in requests if "answered" in r]
    return [(b["received"] - a["answered"]) * 1000 for a, b in zip(chat, chat[1:])]


def bare_loop(base_url: str, steps: int, record: str | None = None) -> None:
    """What any agent must do per step: one HTTP call, one regex, one `bash -c`; with `record`, also the
    conversation saved as JSON after every step, atomically (a temporary file renamed over the record)."""
    url = urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port)
    messages = [{"role": "system", "content": "s" * 3000}, {"role": "user", "content": "task"}]
    pattern = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
    for _ in range(steps):
        conn.request("POST", url.path + "/chat/completions", json.dumps({"model": "m", "messages": messages}),
                     {"Content-Type": "application/json"})
        content = json.loads(conn.getresponse().read())["choices"][0]["message"]["content"]
        command = pattern.search(content)[1]
        out = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
        messages += [{"role": "assistant", "content": content},
                     {"role": "user", "content": f"<returncode>{out.returncode}</returncode>\n<output>\n{out.stdout}</output>"}]
        if record:
            with open(record + ".tmp", "w") as handle:
                json.dump({"messages": messages}, handle)
            os.replace(record + ".tmp", record)


# The bare loop as a process of its own, for one step: the start-up floor of any agent in Python.
BARE_START = ("import http.client, json, os, re, subprocess, sys\nfrom urllib.parse import urlsplit\n"
              + inspect.getsource(bare_loop) + "\nbare_loop(sys.argv[1], 1)\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions of the per-step runs")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="miniswe-bench-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["PYTHONPATH"] = ROOT
    rows = []

    # Interleaved, medians of 9: the bare process and miniswe see the same moments of a noisy machine.
    helps, ones, bares = [], [], []
    with ScriptedServer([SUBMIT] * 30) as server:
        for _ in range(9):
            bares.append(child_peak_rss([sys.executable, "-c", BARE_START, server.base_url], work, env)[0])
            helps.append(child_peak_rss([sys.executable, "-m", "miniswe", "--help"], work, env)[0])
            ones.append(child_peak_rss([sys.executable, "-m", "miniswe", "run", "bench", "--base-url", server.base_url,
                                        "-m", "m", "-q", "-o", "one.json"], work, env))
    bare_start = statistics.median(bares)
    rows.append(("bare stdlib process, one step (median of 9)", f"{bare_start:.3f} s", "the floor"))
    # the first --help fills the help cache (miniswe/help_cache.py), the others are answered from it
    rows.append(("miniswe --help wall (median of 9)", f"{statistics.median(helps):.3f} s",
                 f"{statistics.median(helps) / bare_start:.2f}x bare start; target <= 1.2x"))
    one = ones
    rows.append(("one-step run wall (median of 9)", f"{statistics.median(o[0] for o in one):.3f} s",
                 f"{statistics.median(o[0] for o in one) / bare_start:.2f}x bare start; target <= 0.4 s"))
    rows.append(("one-step run peak RSS", f"{max(o[1] for o in one):.1f} MB", "< 60 MB"))

    # Measured while this process is small: a child's peak RSS can include its parent's pages from before exec,
    # and the per-step runs below keep every request they time.
    with ScriptedServer([act("head -c 100000000 /dev/zero | tr '\\0' x")] * 3 + [SUBMIT]) as server:
        wall, rss, code = child_peak_rss([sys.executable, "-m", "miniswe", "run", "flood", "--base-url", server.base_url,
                                          "-m", "m", "-q", "-o", "flood.json"], work, env)
    rows.append(("peak RSS, 3 commands x 100 MB output", f"{rss:.1f} MB", "< 80 MB"))

    # Interleaved rounds, medians: a shared VM's noise moves single runs by 30% or more.
    results: dict[str, list[list[float]]] = {"-q": [], "default display": [], "-q, 2 KB outputs": [],
                                           "-q, 2 KB outputs, compacting": [], "bare loop": [],
                                           "bare loop saving its record": []}
    compactions = []
    steps = [act(f"echo step output {n}") for n in range(args.steps)]  # distinct: loop detection stays quiet
    for _ in range(args.rounds):
        for label, quiet in (("default display", []), ("-q", ["-q"])):
            with ScriptedServer(steps + [SUBMIT]) as server:
                argv = [sys.executable, "-m", "miniswe", "run", "bench", "--base-url", server.base_url, "-m", "m",
                        "--step-limit", str(args.steps + 1), "-o", "long.json", *quiet]
                code = child_peak_rss(argv, work, env)[2]
                assert code == 0, f"benchmark run failed with exit {code}"
                results[label].append(gaps(server.requests))
        printer = [act(f"echo {n}; head -c 2000 /dev/zero | tr '\\0' o") for n in range(args.steps)]
        for label, window in (("-q, 2 KB outputs", 0), ("-q, 2 KB outputs, compacting", 16_000)):
            with ScriptedServer(printer + [SUBMIT], context_window=window,
                                rules=[("outgrow your context window", "SUMMARY: printed blocks.")]) as server:
                argv = [sys.executable, "-m", "miniswe", "run", "bench", "--base-url", server.base_url, "-m", "m", "-q",
                        "--step-limit", "0", "-o", "printer.json", "-c", f"agent.context_window={window}"]
                code = child_peak_rss(argv, work, env)[2]
                assert code == 0 and not server.overflows, f"{label} run failed with exit {code}"
                results[label].append(gaps(server.requests))
            if window:
                with open(os.path.join(work, "printer.json")) as handle:
                    compactions.append(len(json.load(handle).get("compactions", [])))
        with ScriptedServer(steps + [steps[0]]) as server:
            bare_loop(server.base_url, args.steps + 1)
            results["bare loop"].append(gaps(server.requests))
        with ScriptedServer(steps + [steps[0]]) as server:
            bare_loop(server.base_url, args.steps + 1, record=os.path.join(work, "bare.json"))
            results["bare loop saving its record"].append(gaps(server.requests))
    def paired(runs: list[list[float]], against: str) -> float:
        """The median over rounds of each round's ratio (paired): runs of one round saw the same moment of the
        machine, whose speed drifts by half between rounds here."""
        return statistics.median(statistics.median(run) / statistics.median(base)
                                 for run, base in zip(runs, results[against]))

    for label, runs in results.items():
        typical = statistics.median(statistics.median(run) for run in runs)
        first = statistics.median(g for run in runs for g in run[:10])
        last = statistics.median(g for run in runs for g in run[-10:])
        rows.append((f"per-step gap, {label}: median / first 10 / last 10", f"{typical:.2f} / {first:.2f} / {last:.2f} ms",
                     f"{paired(runs, 'bare loop'):.2f}x bare, {paired(runs, 'bare loop saving its record'):.2f}x bare "
                     f"saving{' (target <= 1.15x)' if label == '-q' else ''}; last/first {last / first:.2f}"))

    rows.append(("compactions per compacting run", str(statistics.median(compactions)), "elisions and summaries"))

    # last: the replies make this process large, and a child's peak RSS (wait4) starts at its parent's size
    worst = max(parse_seconds(text) for text in (*SLOW_LINES.values(), *(adversarial_reply(seed, 1 << 20) for seed in range(30))))
    rows.append(("parse_command, worst of 33 adversarial 1 MB replies", f"{worst * 1000:.0f} ms", "< 1000 ms"))

    width = max(len(r[0]) for r in rows)
    print(f"miniswe core benchmark ({args.steps} steps x {args.rounds} rounds; python {sys.version.split()[0]}; {os.cpu_count()} cores)")
    for name, value, note in rows:
        print(f"  {name:<{width}}  {value:<24} {note}")


if __name__ == "__main__":
    main()
