// The JSON API with the user's key. The key lives in localStorage (this origin only) and is
// sent as "Authorization: Bearer <key>"; a 401 forgets it and asks again.

const KEY_ITEM = "conveyor.apiKey";

export class ApiError extends Error {
  constructor(status, code, message, field) {
    super(message);
    this.status = status;
    this.code = code;
    this.field = field;
  }
}

export function getKey() {
  return localStorage.getItem(KEY_ITEM);
}

export function setKey(key) {
  localStorage.setItem(KEY_ITEM, key);
}

export function forgetKey() {
  localStorage.removeItem(KEY_ITEM);
}

/** A key given in the address as "#key=<key>" (the link `conveyor dev` prints): kept like a
 * typed one, then taken out of the address bar and this history entry. A fragment is never
 * sent to the server, so it is in no request and no server log. Whether there was one. */
export function takeKeyFromUrl() {
  const match = /^#key=([^&]+)/.exec(location.hash);
  if (!match) return false;
  const key = decodeURIComponent(match[1]).trim();
  history.replaceState(null, "", `${location.pathname}${location.search}#/tasks`);
  if (!key) return false;
  setKey(key);
  return true;
}

function url(path, query) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query || {})) {
    if (value !== null && value !== undefined && value !== "") params.set(name, String(value));
  }
  const text = params.toString();
  return text ? `${path}?${text}` : path;
}

export async function api(method, path, { query, body } = {}) {
  const headers = { Authorization: `Bearer ${getKey() || ""}` };
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let reply;
  try {
    reply = await fetch(url(path, query), init);
  } catch (err) {
    throw new ApiError(0, "network", `cannot reach the gateway: ${err.message}`);
  }
  const data = await reply.json().catch(() => null);
  if (reply.ok) return data;
  const error = (data && data.error) || {};
  if (reply.status === 401) {
    forgetKey();
    window.dispatchEvent(new CustomEvent("conveyor:unauthorized", { detail: error.message }));
  }
  throw new ApiError(
    reply.status,
    error.code || "http",
    error.message || `${method} ${path}: HTTP ${reply.status}`,
    error.field,
  );
}

const RECONNECT_MS = 1000;

/** The tenant's events (GET /v1/events as Server-Sent Events), read with fetch so the key goes
 * in the Authorization header like on every call: an EventSource cannot send a header, and a
 * key in the URL would land in access logs and the browser's history. `onOpen()` runs each
 * time a connection opens (a view reads what it shows then: nothing between its first read and
 * the stream's start is missed); `onEvent(event)` for each event. A dropped connection resumes
 * after the last event seen (`after=<its id>`), a second later. Returns `stop()`. */
export function streamEvents(query, { onOpen, onEvent }) {
  const control = new AbortController();
  let after = "";
  const frame = (text) => {
    let data = null;
    for (const line of text.split("\n")) {
      if (line.startsWith("id: ")) after = line.slice(4);
      else if (line.startsWith("data: ")) data = line.slice(6);
    }
    if (data !== null) onEvent(JSON.parse(data));
  };
  const connect = async () => {
    const reply = await fetch(url("/v1/events", { ...query, after }), {
      headers: { Authorization: `Bearer ${getKey() || ""}`, Accept: "text/event-stream" },
      signal: control.signal,
    });
    if (!reply.ok || !reply.body) return reply.status !== 401; // 401: the next call asks
    onOpen();
    const reader = reply.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return true;
      buffer += value;
      for (let end = buffer.indexOf("\n\n"); end >= 0; end = buffer.indexOf("\n\n")) {
        frame(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
      }
    }
  };
  (async () => {
    while (!control.signal.aborted) {
      const again = await connect().catch(() => true);
      if (!again || control.signal.aborted) return;
      await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS));
    }
  })();
  return () => control.abort();
}

let openapi = null;

/** Whether the node's OpenAPI document lists a path (feature detection, e.g. workflows). */
export async function hasPath(prefix) {
  if (openapi === null) {
    try {
      const reply = await fetch("/openapi.json");
      if (!reply.ok) return false;
      openapi = await reply.json();
    } catch {
      return false; // asked again next time
    }
  }
  return Object.keys(openapi.paths || {}).some((path) => path.startsWith(prefix));
}
