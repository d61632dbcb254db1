// The tasks list (every filter of GET /v1/tasks, keyset pages) and the dead-letter view
// (FAILED tasks, bulk retry). Filters live in the URL, so a filtered view can be shared. The
// list's first page updates itself from the events stream.

import { api } from "../api.js";
import {
  badge, field, fmtTime, fromLocalInput, h, mount, STATUSES, table, taskLink, toLocalInput,
} from "../dom.js";

const TEXT_FILTERS = [
  ["queue", "Queue"],
  ["task_type", "Task type"],
  ["error_class", "Error class"],
  ["error_text", "Error message contains"],
];
const RANGE_FILTERS = [
  ["created_from_ms", "Created from"],
  ["created_to_ms", "Created to"],
  ["finished_from_ms", "Finished from"],
  ["finished_to_ms", "Finished to"],
];
// The payload search box: `payload.<field>=<value>` pairs, space-separated; a value with
// spaces is quoted as JSON (`payload.name="Acme Corp"`), as the server reads values as JSON.
const PAYLOAD_PREFIX = "payload.";
const PAYLOAD_PAIR = /^payload\.([^=\s]+)=("(?:[^"\\]|\\.)*"|\S*)$/;
const PAYLOAD_TOKEN = /(?:[^\s"]+|"(?:[^"\\]|\\.)*")+/g;
const PAGE_SIZE = 50;
const LIVE_DEBOUNCE_MS = 500;

// Cursors of the pages before the current one, per filter: "Previous page" pops one.
const history = new Map();

function filterForm(query, { withStatus, onApply }) {
  const status = h("select", { name: "status" },
    h("option", { value: "" }, "any"),
    STATUSES.map((name) => h("option", { value: name, selected: query.status === name }, name)));
  const texts = TEXT_FILTERS.map(([name, label]) =>
    field(label, h("input", { name, value: query[name] || "", size: 14 })));
  const payload = h("input", { name: "payload", size: 28, value: payloadText(query),
    placeholder: "payload.customer=acme", oninput: () => payload.setCustomValidity(""),
    title: "Tasks whose payload has these top-level fields: payload.<field>=<value>, " +
      "space-separated. Values compare as JSON (3, true, null; quote \"3\" for the string). " +
      "Hidden, encoded and blob-stored payloads are not searchable." });
  const ranges = RANGE_FILTERS.map(([name, label]) =>
    field(label, h("input", { name, type: "datetime-local", step: 1,
      value: toLocalInput(query[name]) })));
  const form = h("form", { class: "filters", onsubmit: (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const next = {};
    for (const [name] of [...TEXT_FILTERS, ["status"]]) next[name] = (data.get(name) || "").trim();
    for (const [name] of RANGE_FILTERS) next[name] = fromLocalInput(data.get(name));
    const pairs = parsePayload(data.get("payload") || "");
    if (pairs === null) {
      payload.setCustomValidity("Write payload.<field>=<value>, space-separated.");
      payload.reportValidity();
      return;
    }
    onApply({ ...next, ...pairs });
  } },
    withStatus ? field("State", status) : null,
    texts,
    field("Payload", payload),
    ranges,
    h("div", { class: "actions" },
      h("button", { type: "submit" }, "Apply"),
      h("button", { type: "button", class: "secondary", onclick: () => onApply({}) }, "Clear")),
  );
  return form;
}

/** The payload search box's text as `payload.<field>` query entries; null when malformed. */
function parsePayload(text) {
  const pairs = {};
  for (const token of text.match(PAYLOAD_TOKEN) || []) {
    const match = PAYLOAD_PAIR.exec(token);
    if (!match) return null;
    pairs[PAYLOAD_PREFIX + match[1]] = match[2];
  }
  return pairs;
}

/** The URL's payload search, as the box shows it. */
function payloadText(query) {
  return Object.entries(query).filter(([name, value]) => name.startsWith(PAYLOAD_PREFIX) && value)
    .map(([name, value]) => `${name}=${value}`).join(" ");
}

function errorCell(error) {
  if (!error) return "";
  const text = [error.class, error.message].filter(Boolean).join(": ");
  return h("span", { class: "error-text", title: text }, text);
}

function row(task, selectable) {
  const box = selectable
    ? h("td", {}, h("input", { type: "checkbox", class: "pick", "data-task-id": task.task_id,
      "aria-label": `select ${task.task_id}` }))
    : null;
  return h("tr", { "data-task-id": task.task_id },
    box,
    h("td", {}, taskLink(task.task_id)),
    h("td", {}, task.task_type),
    h("td", {}, task.queue),
    h("td", {}, badge(task.status)),
    h("td", { class: "num" }, task.attempt),
    h("td", {}, fmtTime(task.created_ms)),
    h("td", {}, fmtTime(task.finished_ms)),
    h("td", {}, errorCell(task.error)),
  );
}

async function page(target, query, { nav, view, selectable, fixed }) {
  const filterKey = JSON.stringify({ ...query, cursor: undefined });
  const stack = history.get(filterKey) || [];
  const params = { ...query, ...fixed, limit: PAGE_SIZE, count: query.cursor ? "" : "true" };
  const reply = await api("GET", "/v1/tasks", { query: params });
  const headers = ["Task", "Type", "Queue", "State", "Attempt", "Created", "Finished", "Error"];
  const rows = reply.tasks.map((task) => row(task, selectable));
  const pager = h("div", { class: "pager" },
    reply.count !== undefined && reply.count !== null
      ? h("span", { class: "muted count" },
          `${reply.count_exact === false ? "about " : ""}${reply.count} matching`) : null,
    h("button", { type: "button", class: "secondary", disabled: !query.cursor, onclick: () => {
      const previous = stack.pop();
      history.set(filterKey, stack);
      nav(view, "", { ...query, cursor: previous || "" });
    } }, "Previous page"),
    h("button", { type: "button", class: "secondary", disabled: !reply.next_cursor, onclick: () => {
      history.set(filterKey, [...stack, query.cursor || ""]);
      nav(view, "", { ...query, cursor: reply.next_cursor });
    } }, "Next page"),
  );
  const body = rows.length
    ? table(selectable ? ["", ...headers] : headers, rows, { class: "tasks" })
    : h("p", { class: "muted empty" }, "No tasks match.");
  mount(target, body, pager);
  return reply;
}

/** "Cancel all matching": a second click confirms; the server runs it as an operation. */
function bulkCancel(query, { nav, flash, progress }) {
  const filter = filterOf(query);
  const filtered = Object.keys(filter).length > 0;
  const searched = payloadText(query) !== "";
  let armed = false;
  const button = h("button", { type: "button", class: "danger", id: "cancel-matching",
    disabled: !filtered || searched, title: bulkTitle(filtered, searched), onclick: async () => {
      if (!armed) {
        armed = true;
        button.textContent = "Confirm: cancel every unfinished match";
        return;
      }
      button.disabled = true;
      try {
        const reply = await api("POST", "/v1/tasks:cancel",
          { body: { filter, reason: "canceled from the dashboard" } });
        const op = await follow(reply, progress);
        flash(`Bulk cancel ${op.state}: ${op.changed} task(s) canceled.`,
          op.state === "failed" ? "error" : "ok");
        nav("tasks", "", { ...query, cursor: "" });
      } catch (err) {
        flash(err.message, "error");
        button.disabled = false;
      }
    } }, "Cancel all matching…");
  return button;
}

export async function renderTasks(main, { query, nav, flash, events }) {
  const results = h("div", { class: "results" });
  const progress = h("div", { class: "progress", role: "status" });
  mount(main,
    h("h1", {}, "Tasks"),
    filterForm(query, { withStatus: true, onApply: (next) => nav("tasks", "", next) }),
    h("div", { class: "bulk" },
      h("span", { class: "muted" }, "Newest first, from the query snapshot (it trails the " +
        "processors by the projection lag)."),
      h("span", { class: "spacer" }),
      progress,
      bulkCancel(query, { nav, flash, progress })),
    results);
  const show = () => page(results, query, { nav, view: "tasks", selectable: false, fixed: {} });
  await show();
  if (!query.cursor) live(events, show, query);
}

/** The first page follows the events stream: an event of a task its queue and type filters
 * may show re-reads it, at most once per `LIVE_DEBOUNCE_MS` (later pages stay put). */
function live(events, show, query) {
  let pending = null;
  const soon = () => {
    pending = pending || setTimeout(() => {
      pending = null;
      show().catch(() => null);
    }, LIVE_DEBOUNCE_MS);
  };
  events({ queue: query.queue, task_type: query.task_type }, { onOpen: soon, onEvent: soon });
}

/** Why a bulk operation's button is off: a payload search would not narrow it. */
function bulkTitle(filtered, searched) {
  if (searched) return "bulk operations do not take a payload search; clear it first";
  return filtered ? "" : "set a filter first";
}

/** The URL's filters as the JSON filter of the bulk operations. */
function filterOf(query) {
  const filter = {};
  if (query.status) filter.status = query.status;
  for (const [name] of TEXT_FILTERS) if (query[name]) filter[name] = query[name];
  for (const [name] of RANGE_FILTERS) if (query[name]) filter[name] = Number(query[name]);
  return filter;
}

/** Follows a bulk operation (GET /v1/operations/{id}) until it is no longer running. */
async function follow(operation, progress) {
  let op = operation;
  for (;;) {
    const matched = op.matched === null || op.matched === undefined ? "?" : op.matched;
    mount(progress, h("span", { class: `op op-${op.state}` },
      `Bulk ${op.kind} ${op.state}: ${op.done} of ${matched} done, ${op.changed} changed`,
      op.error ? ` (${op.error})` : ""));
    if (op.state !== "running") return op;
    await new Promise((resolve) => setTimeout(resolve, 500));
    op = await api("GET", `/v1/operations/${encodeURIComponent(op.operation_id)}`);
  }
}

export async function renderDeadLetters(main, { query, nav, flash }) {
  const results = h("div", { class: "results" });
  const progress = h("div", { class: "progress", role: "status" });
  const again = () => nav("dead", "", { ...query, cursor: "" });
  const retrySelected = h("button", { type: "button", id: "retry-selected", onclick: async () => {
    const ids = [...results.querySelectorAll("input.pick:checked")].map((b) => b.dataset.taskId);
    if (!ids.length) return flash("Select tasks first.", "warn");
    try {
      const reply = await api("POST", "/v1/tasks:retry", { body: { task_ids: ids } });
      flash(`Retried ${reply.retried.length} task(s) as new tasks.`, "ok");
      again();
    } catch (err) {
      flash(err.message, "error");
    }
  } }, "Retry selected");
  const searched = payloadText(query) !== "";
  const retryAll = h("button", { type: "button", class: "secondary", id: "retry-matching",
    disabled: searched, title: searched ? bulkTitle(true, true) : "", onclick: async () => {
      try {
        // The server runs a filter retry as a background operation (202) and reports progress.
        const filter = { ...filterOf(query), status: "FAILED" };
        const reply = await api("POST", "/v1/tasks:retry", { body: { filter } });
        if (reply.retried) {
          flash(`Retried ${reply.retried.length} task(s) as new tasks.`, "ok");
        } else {
          const op = await follow(reply, progress);
          flash(`Bulk retry ${op.state}: ${op.changed} task(s) retried.`,
            op.state === "failed" ? "error" : "ok");
        }
        again();
      } catch (err) {
        flash(err.message, "error");
      }
    } }, "Retry all matching");
  const selectAll = h("button", { type: "button", class: "secondary", onclick: () => {
    for (const box of results.querySelectorAll("input.pick")) box.checked = true;
  } }, "Select page");
  mount(main,
    h("h1", {}, "Dead letters"),
    h("p", { class: "muted" }, "FAILED tasks keep their payload, last error and stack. A " +
      "retry enqueues each as a new task; the failed one stays as it is."),
    filterForm(query, { withStatus: false, onApply: (next) => nav("dead", "", next) }),
    h("div", { class: "bulk" }, selectAll, retrySelected, retryAll, progress),
    results);
  await page(results, query, { nav, view: "dead", selectable: true, fixed: { status: "FAILED" } });
}
