// Workflows: the list (GET /v1/workflows, filters and search), and one workflow
// (GET /v1/workflows/{id}): a timing waterfall, the steps in order as a graph with per-step
// state, each parallel step fanned out to its children, the step values from the paged
// history, and, while it runs, a form to send it an event (the one it waits for, if any).
// On a node without the endpoint the view says so and links the root task instead.
//
//   {"workflow": <task summary + waiting_for, waiting_for_event: {name, step, deadline_ms}>,
//    "steps": [{"identity", "position", "kind": run|sleep|parallel|event, "state", "claims",
//               "wake_at_ms", "started_ms", "ended_ms"}],
//    "parallel": [{"identity", "position", "mode", "total", "fired", "counts": {status: n},
//                  "children": [{"index", "task_id", "status", "created_ms", "started_ms",
//                                "finished_ms"}], "children_truncated"}]}

import { api, hasPath } from "../api.js";
import { valueBlock } from "../codec.js";
import {
  badge, field, fmtDuration, fmtTime, fromLocalInput, h, mount, s, STATUSES, table,
  taskLink, TERMINAL, toLocalInput,
} from "../dom.js";

const NODE_W = 200;
const NODE_H = 30;
const CHILD_W = 110;
const GAP = 18;
const CHILDREN_DRAWN_MAX = 8;
const HISTORY_PAGE = 1000;
const REFRESH_MS = 3000;

function label(text, max) {
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

/** Steps top to bottom; a parallel step's children to its right (the first few, then "+n"). */
function graph(steps, parallel) {
  if (!steps.length) return null;
  const byIdentity = new Map(parallel.map((p) => [p.identity, p]));
  const edges = []; // drawn first, under the nodes they join
  const parts = [];
  let y = 4;
  let width = NODE_W + 8;
  steps.forEach((step, i) => {
    if (i > 0) {
      edges.push(s("line", { x1: 4 + NODE_W / 2, y1: y - GAP, x2: 4 + NODE_W / 2, y2: y }));
    }
    parts.push(s("g", { class: `node st-${step.state.toLowerCase()}`, "data-step": step.identity },
      s("rect", { x: 4, y, width: NODE_W, height: NODE_H, rx: 5 }),
      s("text", { x: 12, y: y + 19 }, label(`${step.identity} · ${step.state}`, 30)),
      s("title", {}, `${step.identity} (${step.kind}): ${step.state}, ${step.claims} claim(s)`)));
    const fan = byIdentity.get(step.identity);
    if (fan) {
      const drawn = fan.children.slice(0, CHILDREN_DRAWN_MAX);
      drawn.forEach((child, j) => {
        const x = 4 + NODE_W + 30 + j * (CHILD_W + 8);
        edges.push(s("line", { x1: 4 + NODE_W, y1: y + NODE_H / 2, x2: x, y2: y + NODE_H / 2,
          class: "fan" }));
        parts.push(s("a", { href: `#/task/${encodeURIComponent(child.task_id)}` },
          s("g", { class: `node child st-${child.status.toLowerCase()}` },
            s("rect", { x, y, width: CHILD_W, height: NODE_H, rx: 5 }),
            s("text", { x: x + 8, y: y + 19 }, `#${child.index} ${label(child.status, 10)}`),
            s("title", {}, `child ${child.index} ${child.task_id}: ${child.status}`))));
        width = Math.max(width, x + CHILD_W + 4);
      });
      const rest = fan.total - drawn.length;
      if (rest > 0) {
        const x = 4 + NODE_W + 30 + drawn.length * (CHILD_W + 8);
        parts.push(s("text", { x, y: y + 19, class: "more" }, `+${rest} more`));
        width = Math.max(width, x + 80);
      }
    }
    y += NODE_H + GAP;
  });
  return s("svg", { class: "graph", viewBox: `0 0 ${width} ${y - GAP + 8}`, width,
    height: y - GAP + 8, role: "img", "aria-label": "workflow steps" }, edges, parts);
}

const WATERFALL_W = 720;
const WATERFALL_LABEL_W = 170;
const WATERFALL_ROW_H = 20;
const OUTCOME = { COMMITTED: "succeeded", SUCCEEDED: "succeeded", ENDED: "succeeded",
  FAILED: "failed", CANCELED: "canceled", EXPIRED: "canceled" };

/** The bars of the waterfall: each step from its start (its first claim) to its end (its
 * commit; a sleep to its wake time), a parallel step's children under it (created, leased,
 * finished). A bar with no end yet runs to the right edge; a step whose start the snapshot has
 * not folded yet is left out. */
function waterfallRows(steps, parallel) {
  const fans = new Map(parallel.map((p) => [p.identity, p]));
  const rows = [];
  for (const step of steps) {
    const fan = fans.get(step.identity);
    const start = step.started_ms ?? (fan ? fan.created_ms : null);
    if (start === null || start === undefined) continue;
    const stop = step.kind === "sleep" && step.wake_at_ms ? step.wake_at_ms : step.ended_ms;
    rows.push({ label: step.identity, start, stop, state: step.state, key: step.identity });
    for (const child of (fan ? fan.children.slice(0, CHILDREN_DRAWN_MAX) : [])) {
      if (!child.created_ms) continue;
      rows.push({ label: `  child #${child.index}`, start: child.created_ms,
        run: child.started_ms, stop: child.finished_ms, state: child.status,
        key: child.task_id });
    }
  }
  return rows;
}

/** Steps and children as bars on one time axis (GET /v1/workflows/{id}: started_ms, ended_ms
 * of each step and the times of each child). */
function waterfall(wf, steps, parallel) {
  const rows = waterfallRows(steps, parallel);
  if (!rows.length) return null;
  const t0 = Math.min(wf.created_ms, ...rows.map((r) => r.start));
  const t1 = Math.max(wf.finished_ms || Date.now(), ...rows.map((r) => r.stop || 0));
  const span = Math.max(1, t1 - t0);
  const x = (ms) => WATERFALL_LABEL_W + ((ms - t0) / span) * (WATERFALL_W - WATERFALL_LABEL_W - 8);
  const bars = rows.map((r, i) => {
    const y = i * WATERFALL_ROW_H;
    const x0 = x(r.start);
    const x1 = Math.max(x0 + 2, x(r.stop || t1));
    const kind = OUTCOME[r.state] || "running";
    const took = r.stop ? fmtDuration(r.stop - r.start) : "not ended";
    return s("g", { class: `bar o-${kind}${r.stop ? "" : " open"}`, "data-bar": r.key },
      s("text", { x: 4, y: y + 14 }, label(r.label, 26)),
      s("rect", { x: x0, y: y + 4, width: x1 - x0, height: WATERFALL_ROW_H - 8, rx: 2 },
        s("title", {}, `${r.label}: ${r.state} · ${took}` +
          (r.run ? ` · started ${fmtDuration(r.run - r.start)} after it was created` : ""))));
  });
  const height = rows.length * WATERFALL_ROW_H + 18;
  const axis = [0, 0.5, 1].map((f) => s("text", { x: Math.min(x(t0 + f * span), WATERFALL_W - 40),
    y: height - 4, class: "tick" }, `+${fmtDuration(f * span)}`));
  return s("svg", { class: "timeline waterfall", viewBox: `0 0 ${WATERFALL_W} ${height}`,
    role: "img", "aria-label": "step timing waterfall" }, bars, axis);
}

function stepsTable(steps, values) {
  if (!steps.length) return h("p", { class: "muted" }, "No steps recorded yet.");
  const rows = steps.map((step) => h("tr", { "data-step": step.identity },
    h("td", { class: "num" }, step.position < 0 ? "keyed" : step.position),
    h("td", { class: "mono" }, step.identity),
    h("td", {}, step.kind),
    h("td", {}, badge(step.state)),
    h("td", { class: "num" }, step.claims),
    h("td", {}, step.wake_at_ms ? fmtTime(step.wake_at_ms) : "—"),
    h("td", {}, values.has(step.identity)
      ? h("details", {}, h("summary", {}, "value"), valueBlock(values.get(step.identity)))
      : h("span", { class: "muted" }, "—"))));
  return table(["#", "Step", "Kind", "State", "Claims", "Wakes", "Value"], rows,
    { class: "steps" });
}

function parallelCard(fan) {
  const counts = Object.entries(fan.counts).map(([status, n]) =>
    h("span", { class: "legend" }, badge(status), ` ${n}`));
  const rows = fan.children.map((child) => h("tr", {},
    h("td", { class: "num" }, child.index),
    h("td", {}, taskLink(child.task_id)),
    h("td", {}, badge(child.status))));
  return h("section", { class: "card parallel", "data-step": fan.identity },
    h("h2", {}, `Parallel step ${fan.identity}`),
    h("p", {}, `${fan.total} children · ${fan.mode.toLowerCase().replace("_", " ")} · `,
      fan.fired ? "fan-in done" : "waiting for children"),
    h("div", { class: "legends" }, counts),
    h("details", {}, h("summary", {}, "children"),
      table(["#", "Task", "State"], rows, { class: "children" }),
      fan.children_truncated ? h("p", { class: "muted" }, "Only the first children are listed.")
        : null));
}

async function stepValues(id) {
  const values = new Map();
  const reply = await api("GET", `/v1/workflows/${encodeURIComponent(id)}/history`,
    { query: { limit: HISTORY_PAGE } }).catch(() => ({ steps: [] }));
  for (const row of reply.steps) if (row.committed) values.set(row.identity, row.value);
  return values;
}

const LIST_PAGE = 50;
const ID_PREFIX = /^[0-9a-f]{1,32}$/i;

/** GET /v1/workflows: filters (state, type, created range) and one search box: hex is an id
 * prefix (a whole id opens the workflow), anything else a workflow type. */
export async function renderWorkflows(main, { nav, query }) {
  const search = h("input", { name: "search", value: query.search || "", size: 30,
    placeholder: "id prefix or workflow type" });
  const status = h("select", { name: "status" }, h("option", { value: "" }, "any"),
    STATUSES.map((st) => h("option", { value: st, selected: query.status === st }, st)));
  const from = h("input", { type: "datetime-local", name: "created_from", step: 1,
    value: toLocalInput(query.created_from_ms) });
  const to = h("input", { type: "datetime-local", name: "created_to", step: 1,
    value: toLocalInput(query.created_to_ms) });
  const results = h("div", { class: "results" });
  const form = h("form", { class: "filters", onsubmit: (event) => {
    event.preventDefault();
    const text = search.value.trim();
    if (/^[0-9a-f]{32}$/i.test(text)) return nav("workflow", text.toLowerCase());
    nav("workflows", "", { search: text, status: status.value,
      created_from_ms: fromLocalInput(from.value), created_to_ms: fromLocalInput(to.value) });
  } }, field("Search", search), field("State", status), field("Created from", from),
  field("Created to", to), h("div", { class: "actions" }, h("button", { type: "submit" }, "Apply")));
  mount(main, h("h1", {}, "Workflows"), form, results);
  const text = (query.search || "").trim();
  const params = { limit: LIST_PAGE, status: query.status,
    created_from_ms: query.created_from_ms, created_to_ms: query.created_to_ms };
  if (ID_PREFIX.test(text)) params.id_prefix = text.toLowerCase();
  else if (text) params.task_type = text;
  const rows = [];
  const more = h("button", { type: "button", class: "secondary more" }, "More");
  const draw = () => mount(results, rows.length
    ? table(["Workflow", "Type", "State", "Steps", "Created", "Last step", "Finished"], rows,
      { class: "workflows" })
    : h("p", { class: "muted empty" }, "No workflow matches. A workflow shows here once it " +
      "has recorded a step."), params.cursor ? more : null);
  const load = async () => {
    const reply = await api("GET", "/v1/workflows", { query: params });
    for (const wf of reply.workflows) {
      rows.push(h("tr", { "data-workflow-id": wf.task_id },
        h("td", {}, h("a", { href: `#/workflow/${encodeURIComponent(wf.task_id)}`,
          class: "mono" }, wf.task_id)),
        h("td", {}, wf.task_type),
        h("td", {}, badge(wf.status)),
        h("td", { class: "num" }, `${wf.steps_committed}/${wf.steps}`),
        h("td", {}, fmtTime(wf.created_ms)),
        h("td", {}, fmtTime(wf.last_step_ms)),
        h("td", {}, fmtTime(wf.finished_ms))));
    }
    params.cursor = reply.next_cursor;
    draw();
  };
  more.addEventListener("click", () => load().catch((err) => mount(results,
    h("p", { class: "error" }, err.message))));
  await load();
}

/** Send an event to the workflow (POST /v1/workflows/{id}/events); the name is the one it
 * waits for, when it waits. */
function eventForm(wf, { flash, redraw }) {
  const waiting = wf.waiting_for_event;
  const name = h("input", { name: "event-name", required: true, size: 24,
    value: waiting ? waiting.name : "", placeholder: "event name" });
  const payload = h("textarea", { name: "event-payload", rows: 3, cols: 40,
    placeholder: "JSON payload (empty: null)" });
  const form = h("form", { class: "send-event", onsubmit: async (event) => {
    event.preventDefault();
    let body;
    try {
      body = { name: name.value.trim(), payload: payload.value.trim()
        ? JSON.parse(payload.value) : null };
    } catch (err) {
      return flash(`The payload is not JSON: ${err.message}`, "error");
    }
    try {
      const reply = await api("POST", `/v1/workflows/${encodeURIComponent(wf.task_id)}/events`,
        { body });
      flash(`Event ${reply.name} sent: the workflow is ${reply.status}.`, "ok");
      await redraw();
    } catch (err) {
      flash(err.message, "error");
    }
  } }, field("Event", name), field("Payload", payload),
  h("div", { class: "actions" }, h("button", { type: "submit" }, "Send event")));
  return h("section", { class: "card events" }, h("h2", {}, "Send an event"),
    waiting ? h("p", { class: "waiting-event" }, "Waiting for event ",
      h("strong", { class: "mono" }, waiting.name),
      waiting.deadline_ms ? ` until ${fmtTime(waiting.deadline_ms)}` : " (no timeout)")
      : h("p", { class: "muted" }, "It waits for no event now: one sent is kept for its next " +
        "wait of that name."),
    form);
}

export async function renderWorkflow(main, { arg, live, flash, events }) {
  if (!(await hasPath("/v1/workflows/"))) {
    mount(main, h("h1", {}, "Workflow"),
      h("p", { class: "notice missing-endpoint" }, "This node has no workflow endpoint " +
        "(GET /v1/workflows/{id}), so workflow graphs cannot be shown. The workflow's root task " +
        "is still visible: ", taskLink(arg)));
    return;
  }
  let shown = "";
  let watched = new Set([arg]); // the workflow and its listed children: their events repaint
  const draw = async () => {
    const path = `/v1/workflows/${encodeURIComponent(arg)}`;
    const [reply, values] = await Promise.all([api("GET", path), stepValues(arg)]);
    const wf = reply.workflow;
    watched = new Set([wf.task_id, ...reply.parallel.flatMap((p) => p.children.map((c) =>
      c.task_id))]);
    // Repaint only on a change, so open <details> stay open between refreshes.
    const key = JSON.stringify([reply, [...values]]);
    if (key === shown) return wf;
    shown = key;
    mount(main,
      h("div", { class: "title-row" },
        h("h1", {}, "Workflow ", h("span", { class: "mono", id: "workflow-id" }, wf.task_id)),
        badge(wf.status)),
      h("dl", { class: "facts" },
        h("dt", {}, "Task"), h("dd", {}, taskLink(wf.task_id)),
        h("dt", {}, "Task type"), h("dd", {}, wf.task_type),
        h("dt", {}, "Queue"), h("dd", {}, wf.queue),
        h("dt", {}, "Created"), h("dd", {}, fmtTime(wf.created_ms)),
        h("dt", {}, "Finished"), h("dd", {}, fmtTime(wf.finished_ms)),
        h("dt", {}, "Attempt"), h("dd", {}, wf.attempt),
        h("dt", {}, "App version"),
        h("dd", {}, wf.app_version ? `${wf.app_version} (resume ${wf.resume})` : "—"),
        wf.waiting_for ? [h("dt", {}, "Waiting for"),
          h("dd", { id: "waiting-for" }, wf.waiting_for)] : null,
        wf.compensating ? [h("dt", {}, "Canceled"), h("dd", {}, "compensations: see the " +
          "@undo: steps")] : null),
      h("section", { class: "card timing" }, h("h2", {}, "Timing"),
        waterfall(wf, reply.steps, reply.parallel) || h("p", { class: "muted" },
          "No step times yet (they come from the query snapshot).")),
      h("section", { class: "card" }, h("h2", {}, "Steps"), graph(reply.steps, reply.parallel),
        stepsTable(reply.steps, values),
        TERMINAL.has(wf.status) ? h("p", { class: "muted dropped" }, "The step memos of a " +
          "finished task are dropped (they only serve a task that can still run); parallel " +
          "steps stay with their children.") : null),
      reply.parallel.map(parallelCard),
      TERMINAL.has(wf.status) ? null : eventForm(wf, { flash, redraw: draw }));
    return wf;
  };
  const wf = await draw();
  if (!TERMINAL.has(wf.status)) {
    // Status changes of the workflow and its children come from the events stream; step
    // commits are no task events, so the poll stays for those.
    const refresh = async () => {
      const now = await draw().catch(() => null);
      if (now && TERMINAL.has(now.status)) {
        stopPoll();
        stopEvents();
      }
    };
    const stopPoll = live(refresh, REFRESH_MS);
    const stopEvents = events({}, {
      onOpen: () => null,
      onEvent: (event) => (watched.has(event.task_id) ? refresh() : null),
    });
  }
}
