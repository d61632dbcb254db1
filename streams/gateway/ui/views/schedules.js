// Cron schedules of the tenant (GET /v1/schedules): create one, pause, resume, run now and
// delete, with each schedule's next and last firing.

import { api } from "../api.js";
import { field, fmtTime, h, mount, table, taskLink } from "../dom.js";

function button(label, cls, action) {
  return h("button", { type: "button", class: cls, onclick: action }, label);
}

function controls(sc, { flash, reload }) {
  const path = `/v1/schedules/${encodeURIComponent(sc.schedule_id)}`;
  const act = (method, suffix, body, message) => async () => {
    try {
      const reply = await api(method, `${path}${suffix}`, body ? { body } : {});
      flash(message(reply), "ok", reply.task_id ? taskLink(reply.task_id) : null);
      await reload();
    } catch (err) {
      flash(err.message, "error");
    }
  };
  const verb = sc.paused ? "resume" : "pause";
  // One key per click: a resent run request answers the task of the first.
  const run = () => act("POST", "/run", { idempotency_key: crypto.randomUUID() },
    () => `Schedule ${sc.schedule_id} ran now:`)();
  return h("div", { class: "actions" },
    button(sc.paused ? "Resume" : "Pause", "secondary toggle", act("POST", `/${verb}`, null,
      () => `Schedule ${sc.schedule_id} ${sc.paused ? "resumed" : "paused"}.`)),
    button("Run now", "secondary run-now", run),
    button("Delete", "danger delete", async () => {
      if (!window.confirm(`Delete schedule ${sc.schedule_id}?`)) return;
      await act("DELETE", "", null, () => `Schedule ${sc.schedule_id} deleted.`)();
    }));
}

function createForm({ flash, reload }) {
  const input = (name, attrs = {}) => h("input", { name, ...attrs });
  const id = input("schedule_id", { required: true, size: 16, placeholder: "nightly-report" });
  const cron = input("cron", { required: true, size: 14, placeholder: "*/5 * * * *" });
  const zone = input("timezone", { size: 14, value: "UTC" });
  const app = input("app", { required: true, size: 14 });
  const type = input("task_type", { required: true, size: 14 });
  const payload = h("textarea", { name: "payload", rows: 2, cols: 30, placeholder: "JSON" });
  const overlap = h("select", { name: "overlap" },
    ["allow", "skip", "cancel_previous"].map((v) => h("option", { value: v }, v)));
  return h("details", { class: "card create-schedule" }, h("summary", {}, "New schedule"),
    h("form", { class: "filters", onsubmit: async (event) => {
      event.preventDefault();
      let value = null;
      try {
        value = payload.value.trim() ? JSON.parse(payload.value) : null;
      } catch (err) {
        return flash(`The payload is not JSON: ${err.message}`, "error");
      }
      const body = { schedule_id: id.value.trim(), cron: cron.value.trim(),
        timezone: zone.value.trim() || "UTC", overlap: overlap.value,
        task: { app: app.value.trim(), task_type: type.value.trim(), payload: value } };
      try {
        const reply = await api("POST", "/v1/schedules", { body });
        flash(`Schedule ${reply.schedule_id} saved; next firing ${fmtTime(reply.next_fire_ms)}.`,
          "ok");
        await reload();
      } catch (err) {
        flash(err.message, "error");
      }
    } }, field("Id", id), field("Cron", cron), field("Zone", zone), field("App", app),
    field("Task type", type), field("Overlap", overlap), field("Payload", payload),
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Save"))));
}

export async function renderSchedules(main, { flash }) {
  const list = h("div", { class: "results" });
  const reload = async () => {
    const reply = await api("GET", "/v1/schedules");
    const rows = reply.schedules.map((sc) => h("tr", { "data-schedule-id": sc.schedule_id },
      h("td", { class: "mono" }, sc.schedule_id),
      h("td", { class: "mono" }, sc.cron),
      h("td", {}, sc.timezone),
      h("td", {}, `${sc.task.task_type} (${sc.task.app})`),
      h("td", {}, sc.task.queue),
      h("td", {}, sc.overlap),
      h("td", {}, sc.catch_up),
      h("td", { class: "state" }, sc.paused ? h("span", { class: "badge s-paused" }, "PAUSED")
        : fmtTime(sc.next_fire_ms)),
      h("td", {}, fmtTime(sc.last_fire_ms)),
      h("td", {}, sc.last_task_id ? taskLink(sc.last_task_id) : "—"),
      h("td", { class: "num" }, sc.fired),
      h("td", { class: "num" }, sc.skipped),
      h("td", {}, sc.paused === undefined ? null : controls(sc, { flash, reload }))));
    mount(list, rows.length
      ? table(["Schedule", "Cron", "Zone", "Task", "Queue", "Overlap", "Catch-up", "Next fire",
        "Last fire", "Last task", "Fired", "Skipped", ""], rows, { class: "schedules" })
      : h("p", { class: "muted empty" }, "No schedules. Add one above, with ",
        h("code", {}, "conveyor schedule add"), " or POST /v1/schedules."));
  };
  mount(main, h("h1", {}, "Schedules"), createForm({ flash, reload }), list);
  await reload();
}
