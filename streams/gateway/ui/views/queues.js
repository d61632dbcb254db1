// Queues: pause and resume, depth by state (stacked bar), the oldest task that is due and the
// delayed ones not due yet, throughput and error rate per window (GET /v1/queues), and the queue's history over
// the last hour or day from the server (GET /v1/stats/history): throughput and errors, error
// rate, retries, schedule-to-start and run time p50/p99, depth. The history is the node's, so
// it is there when the page opens, whatever was open before.

import { api } from "../api.js";
import { fmtDuration, h, mount, s, STATUSES, table } from "../dom.js";

const REFRESH_MS = 5000;
const WINDOWS = ["60s", "300s", "3600s"];
const HISTORY_WINDOWS = ["1h", "24h"];
const CHART_W = 260;
const CHART_H = 56;

function depthBar(depth) {
  const total = Object.values(depth).reduce((a, b) => a + b, 0);
  const width = 320;
  let x = 0;
  const parts = STATUSES.filter((name) => depth[name]).map((name) => {
    const w = (depth[name] / Math.max(1, total)) * width;
    const rect = s("rect", { class: `f-${name.toLowerCase()}`, x, y: 0, width: w, height: 16 },
      s("title", {}, `${name}: ${depth[name]}`));
    x += w;
    return rect;
  });
  return s("svg", { class: "depth-bar", viewBox: `0 0 ${width} 16`, width, height: 16,
    role: "img", "aria-label": "depth by state" }, parts);
}

function windowsTable(windows) {
  const rows = WINDOWS.map((name) => {
    const w = windows[name] || { finished_per_s: 0, error_rate: 0 };
    return h("tr", {},
      h("td", {}, name),
      h("td", { class: "num" }, w.finished_per_s),
      h("td", { class: "num" }, `${(w.error_rate * 100).toFixed(1)} %`),
      h("td", {}, s("svg", { class: "rate-bar", viewBox: "0 0 100 10", width: 100, height: 10 },
        s("rect", { class: "track", x: 0, y: 0, width: 100, height: 10 }),
        s("rect", { class: "errors", x: 0, y: 0, width: Math.min(100, w.error_rate * 100),
          height: 10 }))));
  });
  return table(["Window", "Finished / s", "Error rate", ""], rows, { class: "windows" });
}

/** A small line chart of one or more series over the history's points (null: no value). */
function chart(name, points, series, fmt = (v) => String(v)) {
  const values = series.flatMap((one) => points.map(one.value)).filter((v) => v !== null);
  const max = Math.max(0, ...values);
  const step = CHART_W / Math.max(1, points.length - 1);
  const y = (v) => (CHART_H - 2 - (v / Math.max(max, 1e-9)) * (CHART_H - 4)).toFixed(1);
  const lines = series.map((one) => {
    let path = "";
    points.forEach((p, i) => {
      const v = one.value(p);
      if (v === null) return;
      path += `${path && points[i - 1] && one.value(points[i - 1]) !== null ? "L" : "M"}` +
        `${(i * step).toFixed(1)},${y(v)} `;
    });
    return s("path", { class: `line ${one.cls}`, d: path.trim() || "M0,0" });
  });
  const last = points.length ? points[points.length - 1] : null;
  const now = series.map((one) => {
    const v = last ? one.value(last) : null;
    return h("span", { class: `legend ${one.cls}` }, h("i", { class: `sw ${one.cls}` }),
      `${one.label} ${v === null ? "—" : fmt(v)}`);
  });
  return h("figure", { class: "chart", "data-chart": name },
    h("figcaption", {}, h("span", {}, name), h("span", { class: "muted max" }, `max ${fmt(max)}`)),
    s("svg", { viewBox: `0 0 ${CHART_W} ${CHART_H}`, width: CHART_W, height: CHART_H,
      role: "img", "aria-label": name },
    s("title", {}, `${name}: max ${fmt(max)} over ${points.length} points`), lines),
    h("div", { class: "legends" }, now));
}

const ms = (v) => fmtDuration(v);
const pct = (v) => `${(v * 100).toFixed(1)} %`;

function historyCharts(hist) {
  const p = hist.points;
  const per = hist.step_ms >= 60_000 ? `/ ${hist.step_ms / 60_000} min` : "";
  return h("div", { class: "charts", "data-window": hist.window, "data-points": p.length },
    chart(`finished ${per}`, p, [
      { label: "finished", cls: "c-ok", value: (x) => x.finished },
      { label: "not succeeded", cls: "c-fail", value: (x) => x.finished - x.succeeded },
    ]),
    chart("error rate", p, [{ label: "errors", cls: "c-fail", value: (x) => x.error_rate }], pct),
    chart(`retries ${per}`, p, [{ label: "retried", cls: "c-warn", value: (x) => x.retried }]),
    chart("schedule to start", p, [
      { label: "p50", cls: "c-run", value: (x) => x.wait_p50_ms },
      { label: "p99", cls: "c-wait", value: (x) => x.wait_p99_ms },
    ], ms),
    chart("run time", p, [
      { label: "p50", cls: "c-run", value: (x) => x.run_p50_ms },
      { label: "p99", cls: "c-wait", value: (x) => x.run_p99_ms },
    ], ms),
    chart("depth", p, [{ label: "unfinished", cls: "c-idle", value: (x) => x.depth }]));
}

function readyLine(queue) {
  const delayed = queue.delayed
    ? [" · ", h("strong", { class: "delayed" }, queue.delayed), " delayed, next due in ",
      h("strong", { class: "next-due" }, fmtDuration(queue.next_due_in_ms))]
    : null;
  const total = Object.values(queue.depth).reduce((a, b) => a + b, 0);
  return h("p", {}, h("strong", { class: "total" }, total), " tasks · oldest ready ",
    h("strong", { class: "age" }, queue.oldest_ready_age_ms === null ? "—"
      : fmtDuration(queue.oldest_ready_age_ms)), delayed);
}

function card(queue, state) {
  const legend = STATUSES.filter((name) => queue.depth[name]).map((name) =>
    h("span", { class: "legend" }, h("i", { class: `sw f-${name.toLowerCase()}` }),
      `${name} ${queue.depth[name]}`));
  const charts = h("div", { class: "history" }, h("span", { class: "muted" }, "loading history…"));
  const typeSelect = h("select", { name: "task_type", "aria-label": "task type",
    onchange: () => { state.types.set(queue.queue, typeSelect.value); state.redraw(); } },
  h("option", { value: "" }, "every task type"));
  const section = h("section", { class: "card queue", "data-queue": queue.queue,
    "data-paused": queue.paused ? "true" : "false" },
    h("div", { class: "title-row" }, h("h2", {}, queue.queue),
      queue.paused ? h("span", { class: "badge s-expired paused",
        title: "no task of it is leased; enqueues are accepted" }, "paused") : null,
      pauseButton(queue, state), typeSelect),
    h("div", { class: "queue-grid" },
      h("div", {}, readyLine(queue), depthBar(queue.depth),
        h("div", { class: "legends depth-legend" }, legend)),
      h("div", {}, windowsTable(queue.windows))),
    charts);
  const chosen = state.types.get(queue.queue) || "";
  api("GET", "/v1/stats/history", { query: { window: state.window, queue: queue.queue,
    task_type: chosen } }).then((hist) => {
    for (const type of hist.task_types) {
      typeSelect.append(h("option", { value: type, selected: type === chosen }, type));
    }
    mount(charts, historyCharts(hist));
  }).catch((err) => mount(charts, h("p", { class: "error" }, err.message)));
  return section;
}

// Pause stops dispatch from the queue on every partition (its tasks stay ENQUEUED, enqueues
// are accepted); resume deals its ready tasks again.
function pauseButton(queue, state) {
  const verb = queue.paused ? "resume" : "pause";
  return h("button", { type: "button", class: "secondary pause-toggle", onclick: async () => {
    try {
      await api("POST", `/v1/queues/${encodeURIComponent(queue.queue)}/${verb}`);
      state.flash(`Queue ${queue.queue} ${queue.paused ? "resumed" : "paused"}.`, "ok");
      await state.redraw();
    } catch (err) {
      state.flash(err.message, "error");
    }
  } }, queue.paused ? "Resume" : "Pause");
}

// The circuit breakers agents hold open (a task type whose guests keep crashing is not claimed
// by them for a while; their other types go on), from the agents' polls.
function breakersRow(breakers) {
  if (!breakers || !breakers.length) return null;
  return h("p", { class: "card breakers" }, h("strong", {}, "Open circuit breakers: "),
    breakers.map((b) => h("span", { class: "badge s-failed breaker", "data-task-type": b.task_type,
      title: `${b.agents} agent(s) of app ${b.app} hold ${b.task_type} back after guest crashes` },
    `${b.app} / ${b.task_type} × ${b.agents}`)));
}

export async function renderQueues(main, { query, nav, flash, live }) {
  const list = h("div", { class: "queues" });
  const breakers = h("div", {});
  const state = { window: HISTORY_WINDOWS.includes(query.window) ? query.window : "1h",
    types: new Map(), redraw: () => draw(), flash };
  const toggle = HISTORY_WINDOWS.map((name) => h("button", { type: "button",
    class: name === state.window ? "" : "secondary", "data-window": name,
    onclick: () => nav("queues", "", { window: name }) }, `last ${name}`));
  mount(main, h("div", { class: "title-row" }, h("h1", {}, "Queues"),
    h("span", { class: "actions history-window" }, toggle)),
  h("p", { class: "muted" }, `Refreshed every ${REFRESH_MS / 1000} s from the query snapshot; ` +
    "history from the node, kept per minute."),
  breakers, list);
  const draw = async () => {
    const reply = await api("GET", "/v1/queues");
    mount(breakers, breakersRow(reply.breakers));
    mount(list, reply.queues.length ? reply.queues.map((q) => card(q, state))
      : h("p", { class: "muted empty" }, "No queue has tasks yet."));
  };
  await draw();
  live(() => draw().catch(() => {}), REFRESH_MS);
}
