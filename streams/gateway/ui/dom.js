// DOM building without HTML parsing: every string becomes a text node or an attribute value,
// so data from the API can never turn into markup. Nothing in the dashboard assigns HTML text
// (tests/unit/test_dashboard.py bans the APIs that would).

const SVG_NS = "http://www.w3.org/2000/svg";

function build(el, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else if (name === "class") {
      el.setAttribute("class", Array.isArray(value) ? value.filter(Boolean).join(" ") : value);
    } else if (name === "value" && "value" in el) {
      el.value = String(value);
    } else if (name === "checked" || name === "selected" || name === "disabled") {
      el[name] = Boolean(value);
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** h("a", {href: "#/x", class: "btn"}, "text", otherNode) */
export function h(tag, attrs = {}, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** The same for SVG elements (charts). */
export function s(tag, attrs = {}, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

export function mount(parent, ...children) {
  parent.replaceChildren();
  append(parent, children);
}

export function fmtTime(ms) {
  if (ms === null || ms === undefined) return "—";
  const d = new Date(ms);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return (
    `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`
  );
}

export function fmtDuration(ms) {
  if (ms === null || ms === undefined) return "—";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s`;
  if (ms < 3_600_000) return `${Math.floor(ms / 60_000)} m ${Math.round((ms % 60_000) / 1000)} s`;
  return `${Math.floor(ms / 3_600_000)} h ${Math.round((ms % 3_600_000) / 60_000)} m`;
}

/** <input type="datetime-local"> value (local time) <-> epoch ms. */
export function toLocalInput(ms) {
  if (!ms) return "";
  const d = new Date(Number(ms) - new Date(Number(ms)).getTimezoneOffset() * 60_000);
  return d.toISOString().slice(0, 19);
}

export function fromLocalInput(text) {
  if (!text) return null;
  const ms = new Date(text).getTime();
  return Number.isFinite(ms) ? ms : null;
}

export const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELED", "EXPIRED"]);
export const STATUSES = [
  "ENQUEUED", "LEASED", "RETRY_WAIT", "SLEEPING", "WAITING", "SUCCEEDED", "FAILED", "CANCELED",
  "EXPIRED",
];

export function badge(status) {
  const name = status || "UNKNOWN";
  return h("span", { class: `badge s-${name.toLowerCase()}` }, name);
}

export function taskLink(taskId) {
  return h("a", { href: `#/task/${encodeURIComponent(taskId)}`, class: "mono" }, taskId);
}

/** A JSON value, pretty-printed as text; the server's "$hidden" marker as a notice. */
export function jsonBlock(value) {
  if (value && typeof value === "object" && Object.keys(value).length === 1 && "$hidden" in value) {
    return h("p", { class: "notice hidden-payload" }, `Hidden: ${value.$hidden}`);
  }
  if (value === null || value === undefined) return h("p", { class: "muted" }, "none");
  return h("pre", { class: "json" }, JSON.stringify(value, null, 2));
}

export function table(headers, rows, attrs = {}) {
  return h(
    "table",
    attrs,
    h("thead", {}, h("tr", {}, headers.map((title) => h("th", {}, title)))),
    h("tbody", {}, rows),
  );
}

export function field(label, control) {
  return h("label", { class: "field" }, h("span", {}, label), control);
}
