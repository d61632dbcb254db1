// Encoded payloads (conveyor.codecs): a client or agent with a codec sends the node envelopes
// it cannot read, {"$codec": "conveyor/v1", "encoding": [...], "data": "..."}. The page shows
// one as "encoded (conveyor/v1, zlib+aes-gcm)" unless the user set a codec endpoint they run
// (conveyor codec-server), which it then asks to decode it. The endpoint and its optional
// token live in localStorage (this origin only); the token goes to that endpoint only. The
// page's policy lets it fetch only from this origin and this machine's loopback, so the
// endpoint must be on 127.0.0.1 or localhost.

import { h, jsonBlock, mount } from "./dom.js";

const ENDPOINT_ITEM = "conveyor.codecEndpoint";
const TOKEN_ITEM = "conveyor.codecToken";
const LOOPBACK = new Set(["127.0.0.1", "localhost"]);

export function codecEndpoint() {
  return localStorage.getItem(ENDPOINT_ITEM) || "";
}

export function isEncoded(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value) &&
    typeof value.$codec === "string";
}

export function describeEncoded(value) {
  const names = Array.isArray(value.encoding) ? value.encoding.join("+") : "?";
  return `encoded (${value.$codec}, ${names})`;
}

/** Why `text` cannot be the codec endpoint, or null (an http URL on the loopback). */
function endpointProblem(text) {
  let url;
  try {
    url = new URL(text);
  } catch {
    return `${text} is not a URL: give one like http://127.0.0.1:7410`;
  }
  if (url.protocol !== "http:") return "the endpoint is an http:// URL on this machine";
  if (!LOOPBACK.has(url.hostname)) {
    return "this page may only call a codec endpoint on this machine (127.0.0.1 or " +
      "localhost): run conveyor codec-server here, or forward its port";
  }
  return null;
}

async function decode(values) {
  const headers = { "Content-Type": "application/json" };
  const token = localStorage.getItem(TOKEN_ITEM);
  if (token) headers.Authorization = `Bearer ${token}`;
  const endpoint = codecEndpoint().replace(/\/+$/, "");
  let reply;
  try {
    reply = await fetch(`${endpoint}/decode`, {
      method: "POST", headers, body: JSON.stringify({ payloads: values }),
      credentials: "omit", referrerPolicy: "no-referrer",
    });
  } catch (err) {
    throw new Error(`${endpoint} did not answer (${err.message}): is conveyor codec-server ` +
      "running, with this page's origin in --allow-origin?");
  }
  const body = await reply.json().catch(() => null);
  if (!reply.ok) {
    throw new Error(body?.error?.message || `${endpoint} answered ${reply.status}`);
  }
  return body.payloads;
}

/** The envelopes in `value`, however deep (a parallel step's results are each encoded). */
function envelopes(value, found = []) {
  if (isEncoded(value)) found.push(value);
  else if (Array.isArray(value)) value.forEach((item) => envelopes(item, found));
  else if (value !== null && typeof value === "object") {
    Object.values(value).forEach((item) => envelopes(item, found));
  }
  return found;
}

/** `value` with each envelope replaced by what `swap` gives for it. */
function replaced(value, swap) {
  if (isEncoded(value)) return swap(value);
  if (Array.isArray(value)) return value.map((item) => replaced(item, swap));
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, replaced(v, swap)]));
  }
  return value;
}

export function hasEncoded(value) {
  return envelopes(value).length > 0;
}

/** A payload, result, checkpoint or step value: its JSON. Envelopes in it show as
 * "encoded (...)", or as what the codec endpoint decodes them to when one is set. */
export function valueBlock(value) {
  const sealed = envelopes(value);
  if (!sealed.length) return jsonBlock(value);
  const label = [...new Set(sealed.map(describeEncoded))].join(", ");
  const shown = isEncoded(value) ? null : jsonBlock(replaced(value, describeEncoded));
  const box = h("div", { class: "encoded-value" }, h("p", { class: "notice encoded" }, label),
    shown);
  if (!codecEndpoint()) return box;
  box.append(h("p", { class: "muted" }, `decoding at ${codecEndpoint()}…`));
  decode(sealed).then(
    (plain) => {
      const by = new Map(sealed.map((envelope, i) => [envelope, plain[i]]));
      const note = `decoded by ${codecEndpoint()} (stored ${label})`;
      mount(box, h("p", { class: "notice decoded" }, note),
        jsonBlock(replaced(value, (envelope) => by.get(envelope))));
    },
    (err) => mount(box, h("p", { class: "notice encoded" }, label), shown,
      h("p", { class: "error codec-error" }, err.message)),
  );
  return box;
}

/** The codec endpoint setting; `changed()` repaints what it decodes. */
export function codecSettings(changed) {
  const url = h("input", { id: "codec-endpoint", type: "url", value: codecEndpoint(),
    placeholder: "http://127.0.0.1:7410", "aria-label": "codec endpoint URL" });
  const token = h("input", { id: "codec-token", type: "password", autocomplete: "off",
    placeholder: "token (if the endpoint wants one)", "aria-label": "codec endpoint token" });
  const note = h("p", { class: "muted codec-note" });
  const save = (event) => {
    event.preventDefault();
    const text = url.value.trim();
    const problem = text ? endpointProblem(text) : null;
    if (problem) {
      mount(note, h("span", { class: "error" }, problem));
      return;
    }
    if (text) localStorage.setItem(ENDPOINT_ITEM, text);
    else localStorage.removeItem(ENDPOINT_ITEM);
    if (token.value) localStorage.setItem(TOKEN_ITEM, token.value);
    if (!text) localStorage.removeItem(TOKEN_ITEM);
    token.value = "";
    mount(note, text ? `Encoded values are decoded at ${text}.` : "No codec endpoint set.");
    changed();
  };
  mount(note, codecEndpoint()
    ? `Encoded values are decoded at ${codecEndpoint()}.`
    : "Encoded values are shown encoded: set the URL of your conveyor codec-server to see them.");
  return h("section", { class: "card codec-settings" }, h("h2", {}, "Codec endpoint"),
    h("form", { class: "codec-form", onsubmit: save }, url, token,
      h("button", { type: "submit", id: "codec-save" }, "Save")),
    note);
}
