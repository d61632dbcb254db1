// One task: its state, the attempt timeline (worker, timings, error, stack, captured log),
// payload, result and checkpoint, with cancel, retry and re-run. Repaints on each of its
// events (the events stream) until it is terminal.

import { api, hasPath } from "../api.js";
import { codecSettings, hasEncoded, valueBlock } from "../codec.js";
import {
  badge, fmtDuration, fmtTime, h, mount, s, table, taskLink, TERMINAL,
} from "../dom.js";

function facts(task, workflows) {
  const items = [
    ["Task type", task.task_type],
    ["App", task.app],
    ["Queue", task.queue],
    ["Priority", task.priority],
    ["Attempt", task.attempt],
    ["Created", fmtTime(task.created_ms)],
    ["Run at", fmtTime(task.run_at_ms)],
    ["Updated", fmtTime(task.updated_ms)],
    ["Finished", fmtTime(task.finished_ms)],
    ["App version", task.app_version ? `${task.app_version} (resume ${task.resume})` : null],
  ];
  // A pinned task that is ready but may only go to agents of its version says so.
  if (task.waiting_for) items.push(["Waiting for", task.waiting_for]);
  if (workflows) {
    items.push(["Steps", h("a", { href: `#/workflow/${encodeURIComponent(task.task_id)}`,
      class: "workflow-link" }, "workflow view")]);
  }
  return h("dl", { class: "facts" }, items.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v ?? "—")]));
}

function errorBlock(error, title = "Last error") {
  if (!error) return null;
  return h("section", { class: "card error-card" },
    h("h2", {}, title),
    h("p", { class: "error-line" }, h("strong", {}, error.class || "Error"), ": ",
      error.message || ""),
    error.stack ? h("pre", { class: "stack" }, error.stack) : null);
}

/** Attempts as bars on one time axis, from the task's creation to now (or its end). */
function timeline(task, attempts) {
  const timed = attempts.filter((a) => a.started_ms);
  if (!timed.length) return null;
  const start = Math.min(task.created_ms, ...timed.map((a) => a.started_ms));
  const end = Math.max(task.finished_ms || Date.now(), ...timed.map((a) => a.finished_ms || 0));
  const span = Math.max(1, end - start);
  const width = 600;
  const rowH = 22;
  const x = (ms) => 90 + ((ms - start) / span) * (width - 100);
  const bars = timed.map((a, i) => {
    const x0 = x(a.started_ms);
    const x1 = Math.max(x0 + 2, x(a.finished_ms || end));
    const kind = (a.outcome || "running").toLowerCase();
    return s("g", { class: `bar o-${kind}` },
      s("text", { x: 4, y: i * rowH + 15 }, `attempt ${a.attempt}`),
      s("rect", { x: x0, y: i * rowH + 4, width: x1 - x0, height: rowH - 8, rx: 3 },
        s("title", {}, `${a.outcome || "running"} · ${fmtDuration(
          (a.finished_ms || end) - a.started_ms)} · ${a.worker || "?"}`)));
  });
  return s("svg", { class: "timeline", viewBox: `0 0 ${width} ${timed.length * rowH + 4}`,
    role: "img", "aria-label": "attempt timeline" }, bars);
}

function logCell(attempt) {
  if (attempt.log_url) {
    // The log endpoint needs the API key, so it is fetched, not linked.
    const out = h("div", { class: "log-box" });
    const button = h("button", { type: "button", class: "link show-log", onclick: async () => {
      try {
        const reply = await api("GET", attempt.log_url);
        mount(out, h("pre", { class: "log" }, reply.log || "(empty)"));
        button.hidden = true;
      } catch (err) {
        mount(out, h("span", { class: "error" }, err.message));
      }
    } }, "show log");
    return h("div", {}, button, out);
  }
  if (attempt.log_ref) return h("code", { title: "captured output on the agent's host" },
    attempt.log_ref);
  return h("span", { class: "muted" }, "—");
}

function attemptsTable(attempts) {
  if (!attempts.length) return h("p", { class: "muted" }, "No attempt has started yet.");
  const rows = attempts.map((a) => h("tr", { class: "attempt", "data-attempt": a.attempt },
    h("td", { class: "num" }, a.attempt),
    h("td", {}, a.worker || "—"),
    h("td", {}, fmtTime(a.started_ms)),
    h("td", {}, fmtTime(a.finished_ms)),
    h("td", { class: "num" }, a.started_ms && a.finished_ms
      ? fmtDuration(a.finished_ms - a.started_ms) : "—"),
    h("td", {}, a.outcome ? badge(a.outcome) : h("span", { class: "muted" }, "running")),
    h("td", { class: "attempt-error" }, a.error
      ? h("details", {}, h("summary", {}, `${a.error.class || "Error"}: ${a.error.message || ""}`),
        a.error.stack ? h("pre", { class: "stack" }, a.error.stack) : h("p", { class: "muted" },
          "no stack"))
      : ""),
    h("td", {}, logCell(a))));
  return table(["#", "Worker", "Started", "Finished", "Took", "Outcome", "Error", "Output"], rows,
    { class: "attempts" });
}

function actions(task, { nav, flash, reload }) {
  const cancel = h("button", { type: "button", class: "danger", id: "cancel-task",
    disabled: TERMINAL.has(task.status) || task.cancel_requested, onclick: async () => {
      try {
        const reply = await api("POST", `/v1/tasks/${encodeURIComponent(task.task_id)}/cancel`,
          { body: { reason: "canceled from the dashboard" } });
        flash(`Cancel sent: the task is ${reply.status}.`, "ok");
        await reload();
      } catch (err) {
        flash(err.message, "error");
      }
    } }, task.cancel_requested ? "Cancel requested" : "Cancel");
  const retry = h("button", { type: "button", id: "retry-task", disabled: task.status !== "FAILED",
    title: task.status === "FAILED" ? "" : "only FAILED tasks can be retried",
    onclick: async () => {
      try {
        const reply = await api("POST", "/v1/tasks:retry", { body: { task_ids: [task.task_id] } });
        const [item] = reply.retried;
        if (!item) return flash("Nothing was retried (the task is no longer FAILED).", "warn");
        flash(`Retried ${task.task_id} as`, "ok", taskLink(item.new_task_id));
        nav("task", item.new_task_id);
      } catch (err) {
        flash(err.message, "error");
      }
    } }, "Retry");
  // A re-run is a new task with the same spec (any finished task, fresh steps); its key is
  // minted per click, so a resent request does not run it twice.
  const key = crypto.randomUUID();
  const rerun = h("button", { type: "button", id: "rerun-task", class: "secondary",
    disabled: !TERMINAL.has(task.status),
    title: TERMINAL.has(task.status) ? "enqueue it again as a new task" : "it has not finished",
    onclick: async () => {
      try {
        const reply = await api("POST", `/v1/tasks/${encodeURIComponent(task.task_id)}/rerun`,
          { body: { idempotency_key: key } });
        flash(`Re-ran ${task.task_id} as`, "ok", taskLink(reply.new_task_id));
        nav("task", reply.new_task_id);
      } catch (err) {
        flash(err.message, "error");
      }
    } }, "Re-run");
  return h("div", { class: "actions" }, rerun, retry, cancel);
}

export async function renderTask(main, ctx) {
  const path = `/v1/tasks/${encodeURIComponent(ctx.arg)}`;
  const workflows = await hasPath("/v1/workflows/");
  let shown = null;
  const paint = (task) => {
    shown = task;
    mount(main,
      h("div", { class: "title-row" },
        h("h1", {}, "Task ", h("span", { class: "mono", id: "task-id" }, task.task_id)),
        badge(task.status),
        task.cancel_requested ? h("span", { class: "badge s-canceled" }, "cancel requested") : null,
        task.compensating && !TERMINAL.has(task.status)
          ? h("span", { class: "badge s-canceled" }, "compensating") : null,
        h("span", { class: "spacer" }),
        actions(task, { ...ctx, reload })),
      facts(task, workflows),
      errorBlock(task.error),
      h("section", { class: "card" }, h("h2", {}, "Attempts"), timeline(task, task.attempts),
        attemptsTable(task.attempts)),
      h("div", { class: "columns" },
        h("section", { class: "card payload" }, h("h2", {}, "Payload"), valueBlock(task.payload)),
        h("section", { class: "card result" }, h("h2", {}, "Result"), valueBlock(task.result)),
        task.checkpoint !== null && task.checkpoint !== undefined
          ? h("section", { class: "card checkpoint" }, h("h2", {}, "Checkpoint"),
            valueBlock(task.checkpoint))
          : null),
      // Encoded values (conveyor.codecs): where to have them decoded.
      [task.payload, task.result, task.checkpoint].some(hasEncoded)
        ? codecSettings(() => paint(shown)) : null);
  };
  async function reload() {
    const task = await api("GET", path);
    // Repaint only on a change, so an open <details> or a button under the pointer stays put.
    if (!shown || task.updated_ms !== shown.updated_ms || task.status !== shown.status) paint(task);
    return task;
  }
  const task = await reload();
  if (!TERMINAL.has(task.status)) {
    // Live from the events stream (its type and queue; this task's events repaint it), not by
    // polling: every change of a task is an event.
    const stop = ctx.events({ task_type: task.task_type, queue: task.queue }, {
      onOpen: () => reload().catch(() => null),
      onEvent: async (event) => {
        if (event.task_id !== task.task_id) return;
        const now = await reload().catch(() => null);
        if (now && TERMINAL.has(now.status)) stop();
      },
    });
  }
}
