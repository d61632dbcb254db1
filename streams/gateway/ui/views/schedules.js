// Cron schedules of the tenant (GET /v1/schedules), with pause and resume.

import { api } from "../api.js";
import { fmtTime, h, mount, table, taskLink } from "../dom.js";

function toggle(sc, { flash, reload }) {
  const verb = sc.paused ? "resume" : "pause";
  return h("button", { type: "button", class: "secondary toggle", onclick: async () => {
    try {
      await api("POST", `/v1/schedules/${encodeURIComponent(sc.schedule_id)}/${verb}`);
      flash(`Schedule ${sc.schedule_id} ${sc.paused ? "resumed" : "paused"}.`, "ok");
      await reload();
    } catch (err) {
      flash(err.message, "error");
    }
  } }, sc.paused ? "Resume" : "Pause");
}

export async function renderSchedules(main, { flash }) {
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
      h("td", {}, sc.paused === undefined ? null : toggle(sc, { flash, reload }))));
    mount(main, h("h1", {}, "Schedules"),
      rows.length
        ? table(["Schedule", "Cron", "Zone", "Task", "Queue", "Overlap", "Catch-up", "Next fire",
          "Last fire", "Last task", "Fired", "Skipped", ""], rows, { class: "schedules" })
        : h("p", { class: "muted empty" }, "No schedules. Add one with ",
          h("code", {}, "conveyor schedule add"), " or POST /v1/schedules."));
  };
  await reload();
}
