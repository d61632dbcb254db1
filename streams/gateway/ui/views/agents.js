// Agents (GET /v1/agents): the agents polling this node for the tenant, their app and version,
// queues, slots used (their tasks LEASED) beside used + asked by their last poll, how long ago
// they last polled, and the tasks they run.

import { api } from "../api.js";
import { fmtDuration, fmtTime, h, mount, table, taskLink } from "../dom.js";

const REFRESH_MS = 3000;

function slots(agent) {
  if (agent.slots_used === null) return "—";
  if (agent.slots_asked === null) return `${agent.slots_used} used`;
  const total = agent.slots_used + agent.slots_asked;
  return h("span", { title: `${agent.slots_asked} free slot(s) asked by its last poll` },
    `${agent.slots_used} / ${total}`);
}

function running(agent, now) {
  if (agent.running === null) return h("span", { class: "muted" }, "needs the snapshot");
  if (!agent.running.length) return h("span", { class: "muted" }, "idle");
  return h("ul", { class: "running" }, agent.running.map((t) => h("li",
    { "data-task-id": t.task_id }, taskLink(t.task_id), ` ${t.task_type} · ${t.queue} · attempt ${t.attempt} · for `,
    fmtDuration(t.leased_ms === null ? null : Math.max(0, now - t.leased_ms)))));
}

function row(agent, now) {
  return h("tr", { "data-agent-id": agent.agent_id },
    h("td", { class: "mono" }, agent.agent_id),
    h("td", {}, h("span", { class: `badge ${agent.connected ? "s-succeeded" : "s-expired"} state` },
      agent.connected ? "connected" : "gone")),
    h("td", {}, agent.app, agent.version ? h("span", { class: "muted version" },
      ` v${agent.version}`) : null),
    h("td", {}, agent.queues.join(", ") || "—"),
    h("td", { class: "num slots" }, slots(agent)),
    h("td", { class: "last-poll", title: fmtTime(agent.last_poll_ms) },
      agent.last_poll_age_ms === null ? "not here"
        : `${fmtDuration(agent.last_poll_age_ms)} ago`),
    h("td", {}, running(agent, now)));
}

export async function renderAgents(main, { live }) {
  const list = h("div", { class: "results" });
  mount(main, h("h1", {}, "Agents"),
    h("p", { class: "muted" }, "The agents polling this node, from their polls; their running " +
      `tasks from the query snapshot. Refreshed every ${REFRESH_MS / 1000} s.`),
    list);
  const draw = async () => {
    const reply = await api("GET", "/v1/agents");
    mount(list, reply.agents.length
      ? table(["Agent", "State", "App", "Queues", "Slots used / all", "Last poll", "Running"],
        reply.agents.map((a) => row(a, reply.now_ms)), { class: "agents" })
      : h("p", { class: "muted empty" }, "No agent has polled this node yet."));
  };
  await draw();
  live(() => draw().catch(() => {}), REFRESH_MS);
}
