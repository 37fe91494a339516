// miniswe inspect --html: builds the page from the embedded JSON. Every text goes in through text nodes
// (never innerHTML), so commands and outputs are shown as written. Step bodies are built when opened.
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("miniswe-data").textContent);
  var FIELDS = DATA.step_fields;
  var app = document.getElementById("app");
  var OPEN_LIMIT = 300; // "expand all" opens at most this many steps at once

  // -- small helpers ------------------------------------------------------------------------------------------
  function el(tag, attrs) {
    var node = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (key) {
        var value = attrs[key];
        if (value === null || value === undefined || value === false) return;
        if (key === "class") node.className = value;
        else if (key.slice(0, 2) === "on") node.addEventListener(key.slice(2), value);
        else node.setAttribute(key, value === true ? "" : String(value));
      });
    }
    for (var i = 2; i < arguments.length; i++) add(node, arguments[i]);
    return node;
  }
  function add(node, child) {
    if (child === null || child === undefined || child === false) return;
    if (Array.isArray(child)) child.forEach(function (c) { add(node, c); });
    else node.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
  }
  function int(n) { return n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US"); }
  function money(x) { return x === null || x === undefined ? "—" : "$" + Number(x).toFixed(4); }
  function secs(x) {
    if (x === null || x === undefined) return "—";
    if (x < 10) return x.toFixed(2) + "s";
    if (x < 600) return x.toFixed(1) + "s";
    return (x / 60).toFixed(1) + "min";
  }
  function statusClass(status) {
    if (status === "Submitted") return "s-ok";
    if (["ModelError", "SandboxError", "SetupError", "Error"].indexOf(status) >= 0) return "s-bad";
    return status ? "s-warn" : "muted";
  }
  function plural(n, what) { return n + " " + what + (n === 1 ? "" : "s"); }
  function resolvedText(r) { return r === true ? "yes" : r === false ? "no" : "—"; }
  function firstLine(text, max) {
    var line = String(text || "").split("\n")[0];
    return line.length > max ? line.slice(0, max) + "…" : line;
  }
  // text with each case-insensitive occurrence of `query` in a <mark>
  function marked(text, query) {
    text = String(text);
    if (!query) return text;
    var out = [], lower = text.toLowerCase(), from = 0, at;
    while ((at = lower.indexOf(query, from)) >= 0 && out.length < 2000) {
      out.push(text.slice(from, at), el("mark", null, text.slice(at, at + query.length)));
      from = at + query.length;
    }
    out.push(text.slice(from));
    return out;
  }
  function asStep(row) {
    var step = {};
    for (var i = 0; i < FIELDS.length; i++) step[FIELDS[i]] = row[i];
    return step;
  }
  function marks(s) {
    var kind = s.returncode === 0 && !s.error ? "s-ok" : s.error ? "s-bad" : "muted";
    var out = [el("span", { class: "badge " + kind }, s.status)];
    if (s.elided_chars) out.push(el("span", { class: "badge s-warn" }, int(s.elided_chars) + " bytes not kept"));
    if (s.proposed !== null && s.proposed !== undefined) out.push(el("span", { class: "badge s-warn" }, "command changed"));
    return out;
  }
  function facts(rows) {
    var dl = el("dl", { class: "facts" });
    rows.forEach(function (row) { if (row) { dl.appendChild(el("dt", null, row[0])); dl.appendChild(el("dd", row[2] ? { class: row[2] } : null, row[1])); } });
    return dl;
  }
  function details(summary, body, open) {
    return el("details", { open: !!open }, el("summary", null, summary), body);
  }

  // -- one run -------------------------------------------------------------------------------------------------
  function runView(run, backTo) {
    var h = run.header, u = h.usage;
    var root = el("div", null);
    if (backTo) root.appendChild(el("a", { class: "back", href: "#" }, "← all tasks"));
    root.appendChild(el("h1", null, (h.task_id ? h.task_id + " · " : "") + (h.exit_status || "unfinished")));
    var counts = [String(h.steps)];
    if (h.format_errors) counts.push(plural(h.format_errors, "format error"));
    if (h.timeouts) counts.push(plural(h.timeouts, "timeout"));
    if (h.nonzero_exits) counts.push(plural(h.nonzero_exits, "non-zero exit"));
    if (h.aborted) counts.push(h.aborted + " aborted");
    var config = Object.keys(h.config).map(function (k) { return k + "=" + h.config[k]; }).join(" · ");
    root.appendChild(facts([
      ["task", firstLine(h.task, 300) + (String(h.task).indexOf("\n") >= 0 ? " …" : "")],
      ["model", h.model || "—"],
      ["exit", (h.exit_status || "unfinished") + (h.exit_detail ? " · " + firstLine(h.exit_detail.trim().split("\n").pop(), 300) : ""), statusClass(h.exit_status)],
      h.resolved === null || h.resolved === undefined ? null : ["resolved", resolvedText(h.resolved), h.resolved ? "s-ok" : "s-bad"],
      h.grade ? ["grade", gradeText(h.grade), h.grade.resolved === true ? "s-ok" : h.grade.resolved === false ? "s-bad" : "s-warn"] : null,
      ["steps", counts.join(" · ")],
      ["tokens", (u.total_tokens === null ? "not recorded" : int(u.total_tokens) + " (prompt " + int(u.prompt_tokens) + " · completion " + int(u.completion_tokens) + ")") + " · " + plural(u.model_calls, "model call")],
      ["cost", u.cost === null || u.cost === undefined ? "not recorded" : money(u.cost)],
      ["wall time", secs(h.wall_s) + (h.started ? " (" + h.started + " → " + (h.ended || "still running") + ")" : "")],
      ["config", config || "—"],
      ["file", h.path + " (" + h.source + ")"],
      h.not_recorded.length ? ["not recorded", h.not_recorded.join("; "), "note"] : null,
      h.parent ? ["forked", "from " + h.parent.trajectory + " at step " + h.parent.from_step + (h.parent.run_id ? " (run " + h.parent.run_id + ")" : "")] : null,
      h.pending !== null && h.pending !== undefined ? ["in flight", "step " + h.pending + ": its command never finished (the run was killed)", "note"] : null,
    ].concat((h.resumes || []).map(function (r) {
      var changed = Object.keys(r.changes || {});
      return ["resumed", "at " + r.at + " after step " + r.from_step + (changed.length ? " · changed " + changed.join(", ") : "") + (r.diverged ? " · replay diverged: " + r.diverged : "")];
    })).concat(h.notes.map(function (n) { return ["note", n, "note"]; }))));
    if (String(h.task).indexOf("\n") >= 0 || String(h.task).length > 300) root.appendChild(details("Task", el("pre", null, h.task)));
    if (h.exit_detail && h.exit_detail.trim().indexOf("\n") >= 0) root.appendChild(details("Exit detail", el("pre", null, h.exit_detail)));
    if (h.grade && h.grade.tests) root.appendChild(testsBlock(h.grade.tests));
    if (h.submission !== null && h.submission !== undefined) {
      root.appendChild(details("Submission (" + int(h.submission.length) + " characters)", el("pre", { class: "submission" }, h.submission || "(empty)"), true));
    }
    root.appendChild(stepList(run.steps.map(asStep)));
    return root;
  }

  function stepList(steps) {
    var query = "", errorsOnly = false, timer = null;
    var hay = null; // lower-cased text of each step, made on the first search
    var count = el("span", { class: "muted" });
    var search = el("input", { type: "search", placeholder: "Search thoughts, commands and outputs of every step", "aria-label": "search steps" });
    var errors = el("input", { type: "checkbox", id: "errors-only" });
    var list = el("div", { class: "steps" });
    var rows = steps.map(function (s) { return stepRow(s, function () { return query; }); });
    var frag = document.createDocumentFragment();
    rows.forEach(function (r) { frag.appendChild(r.node); });
    list.appendChild(frag);

    function apply() {
      if (query && !hay) hay = steps.map(function (s) {
        return [s.thought, s.reasoning, s.command, s.format_error, s.observation, s.output].join("\n").toLowerCase();
      });
      var shown = 0;
      rows.forEach(function (r, i) {
        var keep = (!errorsOnly || r.step.error) && (!query || hay[i].indexOf(query) >= 0);
        r.node.classList.toggle("hidden", !keep);
        if (keep) shown++;
        if (r.built && r.node.open) r.rebuild();
      });
      count.textContent = shown === steps.length ? steps.length + " steps" : shown + " of " + steps.length + " steps";
    }
    search.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(function () { query = search.value.trim().toLowerCase(); apply(); }, 120);
    });
    errors.addEventListener("change", function () { errorsOnly = errors.checked; apply(); });
    var expand = el("button", { type: "button", onclick: function () {
      var opened = 0;
      for (var i = 0; i < rows.length && opened < OPEN_LIMIT; i++) {
        if (!rows[i].node.classList.contains("hidden")) { rows[i].node.open = true; opened++; }
      }
      count.textContent = count.textContent.replace(/ · opened.*$/, "") + (opened === OPEN_LIMIT ? " · opened the first " + OPEN_LIMIT + "; search to narrow" : "");
    } }, "Expand all");
    var collapse = el("button", { type: "button", onclick: function () { rows.forEach(function (r) { r.node.open = false; }); } }, "Collapse all");
    var bar = el("div", { class: "toolbar" }, search, el("label", null, errors, " errors only"), expand, collapse, count);
    apply();
    return el("div", null, el("h2", null, "Steps"), bar, steps.length ? list : el("p", { class: "empty" }, "No steps."));
  }

  function stepRow(s, currentQuery) {
    var summary = el("summary", null,
      el("span", { class: "num" }, "step " + s.step),
      el("span", null, marks(s)),
      el("span", { class: "cmd" }, s.command !== null ? "$ " + firstLine(s.command, 200) : firstLine(s.thought, 200)),
      el("span", { class: "meta" }, (s.format_error ? "" : secs(s.duration_s) + " · ") + int(s.tokens) + " tok"));
    var node = el("details", { class: "step" + (s.error ? " err" : ""), id: "step-" + s.step }, summary);
    var row = { node: node, step: s, built: false, body: null };
    row.rebuild = function () {
      if (row.body) node.removeChild(row.body);
      row.body = stepBody(s, currentQuery());
      node.appendChild(row.body);
      row.built = true;
    };
    node.addEventListener("toggle", function () { if (node.open && !row.built) row.rebuild(); });
    return row;
  }

  function stepBody(s, query) {
    var body = el("div", { class: "body" });
    var meta = [s.format_error ? s.status + ": nothing ran" : s.pending ? s.status + ": the run was killed while this command ran; no output was recorded" : s.returncode === null && !s.timed_out && !s.aborted ? "return code not recorded" : s.status];
    if (!s.format_error && !s.pending) meta.push("ran " + secs(s.duration_s));
    meta.push(int(s.tokens) + " tokens (prompt " + int(s.prompt_tokens) + " · completion " + int(s.completion_tokens) + ")");
    if (s.cost) meta.push(money(s.cost));
    if (s.latency_s) meta.push("model " + secs(s.latency_s));
    if (s.finish_reason) meta.push("finish " + s.finish_reason);
    body.appendChild(el("div", { class: "muted" }, meta.join(" · ")));
    if (s.reasoning) body.appendChild(details("Reasoning", el("div", { class: "thought muted" }, marked(s.reasoning, query))));
    if (s.thought) body.appendChild(el("div", { class: "thought" }, marked(s.thought, query)));
    if (s.proposed !== null && s.proposed !== undefined) {
      body.appendChild(el("div", { class: "label" }, "Proposed by the model (changed before it ran)"));
      body.appendChild(el("pre", { class: "command proposed" }, "$ ", marked(s.proposed, query)));
      body.appendChild(el("div", { class: "label" }, "What ran"));
    }
    if (s.command !== null) body.appendChild(el("pre", { class: "command" }, "$ ", marked(s.command, query)));
    if (s.observation !== null) {
      body.appendChild(el("div", { class: "label" }, s.format_error ? "What the model was told" : "Output as the model saw it"));
      body.appendChild(el("pre", { class: "observation" }, marked(s.observation, query)));
    }
    if (s.output !== null && s.command !== null) {
      var label = "Output as stored (" + int(s.output_chars) + " characters" + (s.elided_chars ? "; " + int(s.elided_chars) + " bytes not kept" : "") + ")";
      if (s.observation === null) {
        body.appendChild(el("div", { class: "label" }, label + ": the model was shown nothing after this step"));
        body.appendChild(el("pre", { class: "output" }, marked(s.output || "(empty)", query)));
      } else {
        body.appendChild(details(label, el("pre", { class: "output" }, marked(s.output || "(empty)", query))));
      }
    }
    return body;
  }

  // -- a batch -------------------------------------------------------------------------------------------------
  var COLUMNS = [
    ["id", "id", false], ["exit_status", "exit status", false], ["resolved", "resolved", false], ["steps", "steps", true],
    ["tokens", "tokens", true], ["cost", "cost", true], ["wall_s", "wall", true], ["exit_detail", "detail", false],
  ];
  var batchState = { sort: "id", dir: 1, text: "", status: "", resolved: "" };

  function batchView(batch) {
    var t = batch.totals, root = el("div", null);
    root.appendChild(el("h1", null, "Batch · " + batch.path));
    root.appendChild(facts([
      batch.model ? ["model", batch.model] : null, batch.task_file ? ["task file", batch.task_file] : null,
      batch.status ? ["status", batch.status] : null,
    ]));
    var cards = el("div", { class: "cards" },
      card(int(t.tasks) + (batch.selected && batch.selected !== t.tasks ? " / " + int(batch.selected) : ""), batch.selected && batch.selected !== t.tasks ? "tasks finished / selected" : "tasks"),
      t.evaluated ? card((100 * t.resolved_rate).toFixed(1) + "%", "resolved " + t.resolved + " of " + t.evaluated) : null,
      t.graded ? card(secs(t.grade_wall_s), "grading time (" + t.graded + " graded, apart from the tasks')") : null,
      card(int(t.tokens), "tokens"), card(money(t.cost), "cost"), card(secs(t.wall_s), "wall time (sum)"));
    root.appendChild(cards);
    root.appendChild(timeSplit(t));
    var byStatus = {};
    Object.keys(t.by_status).forEach(function (k) { byStatus[k] = t.by_status[k]; });
    if (t.unfinished) byStatus["unfinished"] = t.unfinished;  // began, no ledger line: the batch stopped while it ran
    if (t.not_run) byStatus["not run"] = t.not_run;  // selected, never started
    var chips = el("div", null, el("span", { class: "muted" }, "by status: "));
    Object.keys(byStatus).forEach(function (status) {
      chips.appendChild(el("button", { type: "button", class: "chip " + statusClass(status) + (batchState.status === status ? " on" : ""), onclick: function () {
        batchState.status = batchState.status === status ? "" : status; statusSelect.value = batchState.status; refresh();
        Array.prototype.forEach.call(chips.querySelectorAll("button"), function (b) { b.classList.toggle("on", b.textContent.indexOf(batchState.status + " ") === 0 && !!batchState.status); });
      } }, status + " " + byStatus[status]));
    });
    root.appendChild(chips);

    var text = el("input", { type: "search", placeholder: "Filter tasks by id or detail", "aria-label": "filter tasks", value: batchState.text });
    var statusSelect = el("select", { "aria-label": "exit status" }, el("option", { value: "" }, "every status"),
      Object.keys(byStatus).map(function (s) { return el("option", { value: s }, s); }));
    statusSelect.value = batchState.status;
    var resolvedSelect = el("select", { "aria-label": "resolved" }, el("option", { value: "" }, "resolved or not"),
      el("option", { value: "yes" }, "resolved"), el("option", { value: "no" }, "not resolved"), el("option", { value: "—" }, "not evaluated"));
    resolvedSelect.value = batchState.resolved;
    var count = el("span", { class: "muted", id: "row-count" });
    root.appendChild(el("div", { class: "toolbar" }, text, statusSelect, resolvedSelect, count));

    var head = el("tr", null);
    var ths = COLUMNS.map(function (c) {
      var th = el("th", { class: c[2] ? "num" : null, scope: "col" }, el("button", { type: "button", onclick: function () {
        if (batchState.sort === c[0]) batchState.dir = -batchState.dir;
        else { batchState.sort = c[0]; batchState.dir = c[2] ? -1 : 1; }
        refresh();
      } }, c[1]));
      head.appendChild(th);
      return th;
    });
    var tbody = el("tbody", null);
    root.appendChild(el("table", { class: "tasks" }, el("thead", null, head), tbody));

    function refresh() {
      var q = batchState.text.toLowerCase();
      var rows = batch.rows.filter(function (r) {
        return (!batchState.status || r.exit_status === batchState.status) &&
          (!batchState.resolved || resolvedText(r.resolved) === batchState.resolved) &&
          (!q || r.id.toLowerCase().indexOf(q) >= 0 || String(r.exit_detail || "").toLowerCase().indexOf(q) >= 0);
      });
      var key = batchState.sort, dir = batchState.dir;
      rows.sort(function (a, b) {
        var x = a[key], y = b[key];
        if (key === "resolved") { x = x === true ? 2 : x === false ? 1 : 0; y = y === true ? 2 : y === false ? 1 : 0; }
        if (x === null || x === undefined) x = "";
        if (y === null || y === undefined) y = "";
        var c = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
        return c * dir || a.id.localeCompare(b.id);
      });
      ths.forEach(function (th, i) { th.setAttribute("aria-sort", COLUMNS[i][0] === key ? (dir > 0 ? "ascending" : "descending") : "none"); });
      var frag = document.createDocumentFragment();
      rows.forEach(function (r) { frag.appendChild(taskRow(r)); });
      tbody.textContent = "";
      tbody.appendChild(frag);
      count.textContent = rows.length === batch.rows.length ? rows.length + " tasks" : rows.length + " of " + batch.rows.length + " tasks";
    }
    var timer = null;
    text.addEventListener("input", function () { clearTimeout(timer); timer = setTimeout(function () { batchState.text = text.value.trim(); refresh(); }, 100); });
    statusSelect.addEventListener("change", function () { batchState.status = statusSelect.value; refresh(); });
    resolvedSelect.addEventListener("change", function () { batchState.resolved = resolvedSelect.value; refresh(); });
    refresh();
    return root;
  }

  // -- SWE-bench grading: its status and reason, and each FAIL_TO_PASS / PASS_TO_PASS test, failed ones first ------
  function gradeText(g) {
    var detail = g.detail ? String(g.detail).trim().split("\n").pop() : "";
    return [g.status, firstLine(detail, 300), "graded in " + secs(g.wall_s || 0), g.harness || ""].filter(Boolean).join(" · ");
  }

  function testsBlock(tests) {
    var body = el("div", null), summary = [];
    ["FAIL_TO_PASS", "PASS_TO_PASS"].forEach(function (key) {
      var t = tests[key]; if (!t) return;
      var ok = t.success || [], bad = t.failure || [], list = el("ul", { class: "tests" });
      summary.push(key + " " + ok.length + "/" + (ok.length + bad.length));
      bad.forEach(function (name) { list.appendChild(el("li", { class: "s-bad" }, "✗ " + name)); });
      ok.forEach(function (name) { list.appendChild(el("li", { class: "s-ok" }, "✓ " + name)); });
      body.appendChild(el("h3", null, key + " (" + ok.length + " passed, " + bad.length + " failed)"));
      body.appendChild(list);
    });
    return details("Tests (" + summary.join(" · ") + ")", body, true);
  }

  // Where the tasks' time went, apart: the agent's runs (model calls within them), the waits for images before
  // they started (a pull, room under the image budget), grading; then what the batch's image pulls came to.
  function timeSplit(t) {
    var box = el("div", { class: "cards" });
    if (!t.model_s && !t.image_wait_s && !t.images) return box;
    box.appendChild(card(secs(t.wall_s - (t.model_s || 0)), "agent time (commands and the rest)"));
    box.appendChild(card(secs(t.model_s || 0), "model time"));
    if (t.image_wait_s || t.images) {
      box.appendChild(card(secs(t.pull_wait_s || 0), "waiting for image pulls"));
      if (t.budget_wait_s) box.appendChild(card(secs(t.budget_wait_s), "queued behind the image budget"));
    }
    if (t.graded) box.appendChild(card(secs(t.grade_wall_s), "grading time"));
    var im = t.images;
    if (im) {
      box.appendChild(card(bytes(im.bytes_pulled), im.pulls + " image(s) pulled in " + secs(im.pull_s)));
      box.appendChild(card(bytes(im.peak_disk), "peak image disk" + (im.budget ? " (budget " + bytes(im.budget) + ")" : "")));
    }
    return box;
  }
  function bytes(n) {
    var units = ["B", "kB", "MB", "GB", "TB"], i = 0;
    n = n || 0;
    while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
    return (i ? n.toFixed(1) : String(n)) + " " + units[i];
  }
  function card(n, label) { return el("div", { class: "card" }, el("div", { class: "n" }, n), el("div", { class: "l" }, label)); }

  function taskRow(r) {
    var href = "#task=" + encodeURIComponent(r.id);
    return el("tr", { "data-id": r.id, onclick: function (event) { if (event.target.tagName !== "A") location.hash = href; } },
      el("td", null, el("a", { href: href }, r.id)),
      el("td", { class: statusClass(r.exit_status) }, r.exit_status),
      el("td", { class: r.resolved === true ? "s-ok" : r.resolved === false ? "s-bad" : "muted", title: r.grade ? gradeText(r.grade) : "" },
        resolvedText(r.resolved) + (r.grade && r.grade.status !== "resolved" && r.grade.status !== "unresolved" ? " (" + r.grade.status + ")" : "")),
      el("td", { class: "num" }, int(r.steps)), el("td", { class: "num" }, int(r.tokens)),
      el("td", { class: "num" }, money(r.cost)), el("td", { class: "num" }, secs(r.wall_s)),
      el("td", { class: "detail", title: r.exit_detail || "" }, r.exit_detail || ""));
  }

  // -- routing: #task=ID shows one task of a batch, #step=N (or #task=ID&step=N) opens that step --------------
  function hashParams() {
    var params = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (part) {
      var at = part.indexOf("=");
      if (at <= 0) return;
      try { params[part.slice(0, at)] = decodeURIComponent(part.slice(at + 1)); } catch (e) { /* a mangled link: ignore it */ }
    });
    return params;
  }
  var scrollBack = 0;
  function route() {
    var params = hashParams(), view;
    var wasTable = !!app.querySelector("table.tasks");
    if (wasTable) scrollBack = window.scrollY;
    if (DATA.kind === "trajectory") view = runView(DATA.run, false);
    else if (params.task !== undefined) {
      var id = params.task, run = Object.prototype.hasOwnProperty.call(DATA.runs, id) ? DATA.runs[id] : null;
      var back = el("a", { class: "back", href: "#" }, "← all tasks");
      if (!run) view = el("div", null, back, el("p", { class: "empty" }, "No task " + id + " in this batch."));
      else if (run.error) view = el("div", null, back, el("h1", null, id), el("p", { class: "note" }, "Its run cannot be shown: " + run.error));
      else {
        if (!run.header.task_id) run.header.task_id = id;
        view = runView(run, true);
      }
    } else view = batchView(DATA.batch);
    app.textContent = "";
    app.appendChild(view);
    app.appendChild(el("footer", null, "miniswe " + DATA.miniswe_version + " · generated " + DATA.generated + " · self-contained: this file loads nothing from the network"));
    var step = params.step && document.getElementById("step-" + params.step);
    if (step) {
      step.open = true;
      step.scrollIntoView();
      // steps above it are laid out as they come into view (content-visibility): settle, then scroll again
      requestAnimationFrame(function () { requestAnimationFrame(function () { step.scrollIntoView(); }); });
    }
    else window.scrollTo(0, DATA.kind === "batch" && params.task === undefined ? scrollBack : 0);
    app.setAttribute("data-rendered-ms", String(Math.round(performance.now())));
  }
  window.addEventListener("hashchange", route);
  route();
})();
