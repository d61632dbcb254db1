// Workflow detail: its steps in order as a small graph with per-step state, and its child
// tasks. Needs GET /v1/workflows/{id}; on a node without it the view says so.
//
// Read tolerantly (field names as the endpoint documents them, with fallbacks):
//   {"workflow_id"|"task_id", "status", "task_type", "created_ms", "finished_ms",
//    "steps": [{"identity"|"name", "position", "state"|"status"|"committed", "claims",
//               "value"|"result", "error"}],
//    "children": [{"task_id", "task_type", "status", "step"?}]}

import { api, hasPath } from "../api.js";
import {
  badge, field, fmtTime, h, jsonBlock, mount, s, table, taskLink, TERMINAL,
} from "../dom.js";

const NODE_W = 220;
const NODE_H = 30;
const GAP = 16;

function stepName(step) {
  return step.identity || step.name || step.step_id || `step ${step.position}`;
}

function stepState(step) {
  if (step.state || step.status) return String(step.state || step.status).toUpperCase();
  if (step.committed !== undefined) return step.committed ? "COMMITTED" : "PENDING";
  return "UNKNOWN";
}

/** Steps top to bottom, each child task of a step fanned out to its right. */
function graph(steps, children) {
  const rows = steps.length + (children.length && !children.some((c) => c.step) ? 1 : 0);
  if (!rows) return null;
  const byStep = new Map();
  for (const child of children) {
    const key = child.step || "";
    byStep.set(key, [...(byStep.get(key) || []), child]);
  }
  const nodes = [];
  const edges = [];
  let y = 4;
  const box = (x, top, label, state, title, href) => {
    const g = s("g", { class: `node st-${state.toLowerCase()}` },
      s("rect", { x, y: top, width: NODE_W, height: NODE_H, rx: 5 }),
      s("text", { x: x + 8, y: top + 19 }, label.length > 26 ? `${label.slice(0, 25)}…` : label),
      s("title", {}, title));
    nodes.push(href ? s("a", { href }, g) : g);
  };
  steps.forEach((step, i) => {
    const state = stepState(step);
    if (i > 0) edges.push(s("line", { x1: 4 + NODE_W / 2, y1: y - GAP, x2: 4 + NODE_W / 2, y2: y }));
    box(4, y, stepName(step), state, `${stepName(step)}: ${state}`);
    (byStep.get(stepName(step)) || []).forEach((child, j) => {
      const cx = 4 + (NODE_W + 40) * (j + 1);
      edges.push(s("line", { x1: cx - 40, y1: y + NODE_H / 2, x2: cx, y2: y + NODE_H / 2 }));
      box(cx, y, child.task_type || child.task_id, child.status || "UNKNOWN",
        `${child.task_id}: ${child.status}`, `#/task/${encodeURIComponent(child.task_id)}`);
    });
    y += NODE_H + GAP;
  });
  const loose = byStep.get("") || [];
  loose.forEach((child, j) => {
    const cx = 4 + (NODE_W + 12) * j;
    box(cx, y, child.task_type || child.task_id, child.status || "UNKNOWN",
      `${child.task_id}: ${child.status}`, `#/task/${encodeURIComponent(child.task_id)}`);
  });
  if (loose.length) y += NODE_H + GAP;
  const widest = Math.max(1, ...[...byStep.values()].map((list) => list.length + 1));
  const width = 8 + (NODE_W + 40) * widest;
  return s("svg", { class: "graph", viewBox: `0 0 ${width} ${y}`, width, height: y,
    role: "img", "aria-label": "workflow steps" }, edges, nodes);
}

function stepsTable(steps) {
  if (!steps.length) return h("p", { class: "muted" }, "No steps recorded yet.");
  const rows = steps.map((step) => h("tr", { "data-step": stepName(step) },
    h("td", { class: "num" }, step.position ?? "—"),
    h("td", { class: "mono" }, stepName(step)),
    h("td", {}, badge(stepState(step))),
    h("td", { class: "num" }, step.claims ?? "—"),
    h("td", {}, step.error ? `${step.error.class || "Error"}: ${step.error.message || ""}` : ""),
    h("td", {}, h("details", {}, h("summary", {}, "value"),
      jsonBlock(step.value !== undefined ? step.value : step.result)))));
  return table(["#", "Step", "State", "Claims", "Error", "Value"], rows, { class: "steps" });
}

function childrenTable(children) {
  if (!children.length) return null;
  const rows = children.map((child) => h("tr", {},
    h("td", {}, taskLink(child.task_id)),
    h("td", {}, child.task_type || "—"),
    h("td", {}, child.step || "—"),
    h("td", {}, badge(child.status))));
  return h("section", { class: "card" }, h("h2", {}, "Child tasks"),
    table(["Task", "Type", "Step", "State"], rows, { class: "children" }));
}

export async function renderWorkflowLookup(main, { nav, arg }) {
  const input = h("input", { name: "workflow-id", value: arg, size: 36, required: true,
    placeholder: "workflow (task) id" });
  mount(main, h("h1", {}, "Workflows"),
    h("form", { class: "filters", onsubmit: (event) => {
      event.preventDefault();
      nav("workflow", input.value.trim());
    } }, field("Workflow id", input), h("div", { class: "actions" },
      h("button", { type: "submit" }, "Open"))),
    h("p", { class: "muted" }, "A workflow's id is the id of its root task; a task's page links " +
      "to its workflow."));
}

export async function renderWorkflow(main, { arg, live }) {
  if (!(await hasPath("/v1/workflows/"))) {
    mount(main, h("h1", {}, "Workflow"),
      h("p", { class: "notice missing-endpoint" }, "This node has no workflow endpoint " +
        "(GET /v1/workflows/{id}), so workflow graphs cannot be shown. The workflow's root task " +
        "is still visible: ", taskLink(arg)));
    return;
  }
  const draw = async () => {
    const wf = await api("GET", `/v1/workflows/${encodeURIComponent(arg)}`);
    const steps = [...(wf.steps || [])].sort((a, b) =>
      (a.position ?? 1e9) - (b.position ?? 1e9) || stepName(a).localeCompare(stepName(b)));
    const children = wf.children || [];
    const id = wf.workflow_id || wf.task_id || arg;
    mount(main,
      h("div", { class: "title-row" }, h("h1", {}, "Workflow ", h("span", { class: "mono" }, id)),
        badge(wf.status)),
      h("dl", { class: "facts" },
        h("dt", {}, "Root task"), h("dd", {}, taskLink(wf.task_id || id)),
        h("dt", {}, "Task type"), h("dd", {}, wf.task_type || "—"),
        h("dt", {}, "Created"), h("dd", {}, fmtTime(wf.created_ms)),
        h("dt", {}, "Finished"), h("dd", {}, fmtTime(wf.finished_ms))),
      h("section", { class: "card" }, h("h2", {}, "Steps"), graph(steps, children),
        stepsTable(steps)),
      childrenTable(children));
    return wf;
  };
  const wf = await draw();
  if (!TERMINAL.has(wf.status)) {
    const stop = live(async () => {
      const now = await draw().catch(() => null);
      if (now && TERMINAL.has(now.status)) stop();
    }, 3000);
  }
}
