// The dashboard shell: asks for the API key once, then routes "#/<view>/<arg>?<query>" to a
// view. A view is `async (main, {arg, query, nav, flash, live, events}) => void`; it renders into
// `main` and may register refreshers with `live(fn, ms)` and event streams with
// `events(filter, {onOpen, onEvent})` (api.js streamEvents), both stopped on the next
// navigation, or by calling the function they return.

import {
  api, ApiError, forgetKey, getKey, setKey, streamEvents, takeKeyFromUrl,
} from "./api.js";
import { field, h, mount } from "./dom.js";
import { renderAgents } from "./views/agents.js";
import { renderQueues } from "./views/queues.js";
import { renderSchedules } from "./views/schedules.js";
import { renderTask } from "./views/task.js";
import { renderDeadLetters, renderTasks } from "./views/tasks.js";
import { renderWorkflow, renderWorkflows } from "./views/workflow.js";

const VIEWS = {
  tasks: renderTasks,
  dead: renderDeadLetters,
  task: renderTask,
  queues: renderQueues,
  agents: renderAgents,
  schedules: renderSchedules,
  workflows: renderWorkflows,
  workflow: renderWorkflow,
};

const main = document.getElementById("main");
let timers = [];
let streams = []; // stops of the view's event streams (`events`), called on navigation
let generation = 0;

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, search = ""] = raw.split("?", 2);
  const [view, ...rest] = path.split("/");
  return {
    view: VIEWS[view] ? view : "tasks",
    arg: rest.length ? decodeURIComponent(rest.join("/")) : "",
    query: Object.fromEntries(new URLSearchParams(search)),
  };
}

/** Go to a view; `query` entries that are empty are left out of the URL. */
export function nav(view, arg = "", query = {}) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query)) {
    if (value !== null && value !== undefined && value !== "") params.set(name, String(value));
  }
  const search = params.toString();
  const hash = `#/${view}${arg ? `/${encodeURIComponent(arg)}` : ""}${search ? `?${search}` : ""}`;
  if (location.hash === hash) route();
  else location.hash = hash;
}

export function flash(message, kind = "info", link = null) {
  const box = document.getElementById("flash");
  mount(box, h("div", { class: `flash ${kind}` }, message, link ? [" ", link] : null,
    h("button", { type: "button", class: "link", onclick: () => mount(box) }, "dismiss")));
}

function stopTimers() {
  for (const id of timers) clearInterval(id);
  timers = [];
  for (const stop of streams) stop();
  streams = [];
}

async function route() {
  stopTimers();
  const mine = ++generation;
  if (!getKey()) return renderLogin();
  const { view, arg, query } = parseHash();
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.view === view ||
      (view === "task" && link.dataset.view === "tasks") ||
      (view === "workflow" && link.dataset.view === "workflows"));
  }
  document.getElementById("forget-key").hidden = false;
  const live = (fn, ms) => {
    if (mine !== generation) return () => {};
    const id = setInterval(() => mine === generation && fn(), ms);
    timers.push(id);
    return () => clearInterval(id);
  };
  const events = (filter, handlers) => {
    if (mine !== generation) return () => {};
    const stop = streamEvents(filter, handlers);
    streams.push(stop);
    return stop;
  };
  const target = h("div", { class: "view", "data-view": view });
  mount(main, target);
  try {
    await VIEWS[view](target, { arg, query, nav, flash, live, events });
  } catch (err) {
    if (mine !== generation) return;
    if (err instanceof ApiError && err.status === 401) return renderLogin(err.message);
    mount(target, h("p", { class: "error" }, err.message || String(err)));
  }
}

function renderLogin(problem) {
  stopTimers();
  document.getElementById("forget-key").hidden = true;
  mount(document.getElementById("tenant"));
  const input = h("input", {
    type: "password", name: "api-key", autocomplete: "off", required: true, size: 48,
    placeholder: "cvk_…",
  });
  const form = h("form", { class: "login card", onsubmit: async (event) => {
    event.preventDefault();
    setKey(input.value.trim());
    if (await showTenant()) route();
  } },
    h("h1", {}, "Conveyor dashboard"),
    h("p", {}, "Paste an API key. ", h("code", {}, "conveyor dev"),
      " prints a link that opens this page signed in; keys live in the node's keys.json. It " +
      "is kept in this browser's local storage until you choose “Change API key”."),
    problem ? h("p", { class: "error" }, problem) : null,
    field("API key", input),
    h("button", { type: "submit" }, "Open dashboard"),
  );
  mount(main, form);
  input.focus();
}

async function showTenant() {
  try {
    const usage = await api("GET", "/v1/tenants/me/usage");
    mount(document.getElementById("tenant"), `tenant ${usage.tenant}`);
    return true;
  } catch (err) {
    renderLogin(err.message);
    return false;
  }
}

window.addEventListener("conveyor:unauthorized", (event) => renderLogin(event.detail));
window.addEventListener("hashchange", () => {
  // A "#key=..." link opened in a tab already on the dashboard changes only the hash.
  if (takeKeyFromUrl()) showTenant().then((ok) => ok && route());
  else route();
});
document.getElementById("forget-key").addEventListener("click", () => {
  forgetKey();
  renderLogin();
});

takeKeyFromUrl(); // before the first route: "#key=..." is no view
if (getKey()) {
  showTenant().then((ok) => ok && route());
} else {
  renderLogin();
}
