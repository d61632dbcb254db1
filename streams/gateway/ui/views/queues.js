// Queues: depth by state (stacked bar), age of the oldest ready task, and throughput and error
// rate per window (from GET /v1/queues), plus a sparkline of depth and throughput sampled while
// the page is open.

import { api } from "../api.js";
import { fmtDuration, h, mount, s, STATUSES, table } from "../dom.js";

const REFRESH_MS = 5000;
const SAMPLES_MAX = 60;
const WINDOWS = ["60s", "300s", "3600s"];
const samples = new Map(); // queue -> [{depth, rate}], kept across visits of the view

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

function sparkline(points, label) {
  const width = 160;
  const height = 32;
  if (points.length < 2) return h("span", { class: "muted" }, "collecting…");
  const max = Math.max(...points, 1e-9);
  const step = width / (SAMPLES_MAX - 1);
  const offset = width - (points.length - 1) * step;
  const coords = points.map((v, i) => `${(offset + i * step).toFixed(1)},${
    (height - 2 - (v / max) * (height - 4)).toFixed(1)}`);
  return s("svg", { class: "spark", viewBox: `0 0 ${width} ${height}`, width, height,
    role: "img", "aria-label": label },
    s("polyline", { points: coords.join(" ") }),
    s("title", {}, `${label}: last ${points[points.length - 1]}, max ${max}`));
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

function card(queue) {
  const total = Object.values(queue.depth).reduce((a, b) => a + b, 0);
  const history = samples.get(queue.queue) || [];
  const legend = STATUSES.filter((name) => queue.depth[name]).map((name) =>
    h("span", { class: "legend" }, h("i", { class: `sw f-${name.toLowerCase()}` }),
      `${name} ${queue.depth[name]}`));
  return h("section", { class: "card queue", "data-queue": queue.queue },
    h("h2", {}, queue.queue),
    h("div", { class: "queue-grid" },
      h("div", {},
        h("p", {}, h("strong", { class: "total" }, total), " tasks · oldest ready ",
          h("strong", { class: "age" }, queue.oldest_ready_age_ms === null ? "—"
            : fmtDuration(queue.oldest_ready_age_ms))),
        depthBar(queue.depth),
        h("div", { class: "legends" }, legend)),
      h("div", {}, windowsTable(queue.windows)),
      h("div", { class: "sparks" },
        h("div", {}, h("span", { class: "muted" }, "depth "),
          sparkline(history.map((p) => p.depth), "depth")),
        h("div", {}, h("span", { class: "muted" }, "finished/s (60s) "),
          sparkline(history.map((p) => p.rate), "throughput")))));
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

export async function renderQueues(main, { live }) {
  const list = h("div", { class: "queues" });
  const breakers = h("div", {});
  mount(main, h("h1", {}, "Queues"),
    h("p", { class: "muted" }, `Refreshed every ${REFRESH_MS / 1000} s from the query snapshot.`),
    breakers, list);
  const draw = async () => {
    const reply = await api("GET", "/v1/queues");
    for (const q of reply.queues) {
      const depth = Object.values(q.depth).reduce((a, b) => a + b, 0);
      const rate = (q.windows["60s"] || {}).finished_per_s || 0;
      const history = [...(samples.get(q.queue) || []), { depth, rate }].slice(-SAMPLES_MAX);
      samples.set(q.queue, history);
    }
    mount(breakers, breakersRow(reply.breakers));
    mount(list, reply.queues.length ? reply.queues.map(card)
      : h("p", { class: "muted empty" }, "No queue has tasks yet."));
  };
  await draw();
  live(() => draw().catch(() => {}), REFRESH_MS);
}
