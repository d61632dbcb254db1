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
