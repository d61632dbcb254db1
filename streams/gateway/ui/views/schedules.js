// Cron schedules of the tenant (GET /v1/schedules).

import { api } from "../api.js";
import { fmtTime, h, mount, table, taskLink } from "../dom.js";

export async function renderSchedules(main) {
  const reply = await api("GET", "/v1/schedules");
  const rows = reply.schedules.map((sc) => h("tr", { "data-schedule-id": sc.schedule_id },
    h("td", { class: "mono" }, sc.schedule_id),
    h("td", { class: "mono" }, sc.cron),
    h("td", {}, sc.timezone),
    h("td", {}, `${sc.task.task_type} (${sc.task.app})`),
    h("td", {}, sc.task.queue),
    h("td", {}, sc.overlap),
    h("td", {}, sc.catch_up),
    h("td", {}, fmtTime(sc.next_fire_ms)),
    h("td", {}, fmtTime(sc.last_fire_ms)),
    h("td", {}, sc.last_task_id ? taskLink(sc.last_task_id) : "—"),
    h("td", { class: "num" }, sc.fired),
    h("td", { class: "num" }, sc.skipped)));
  mount(main, h("h1", {}, "Schedules"),
    rows.length
      ? table(["Schedule", "Cron", "Zone", "Task", "Queue", "Overlap", "Catch-up", "Next fire",
        "Last fire", "Last task", "Fired", "Skipped"], rows, { class: "schedules" })
      : h("p", { class: "muted empty" }, "No schedules. Add one with ",
        h("code", {}, "conveyor schedule add"), " or POST /v1/schedules."));
}
