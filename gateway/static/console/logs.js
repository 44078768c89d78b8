// Logs: search the request log (/admin/logs) and open one request (/admin/logs/{id}) with its
// attempts as a timeline and its bodies as text. A gateway that logs nothing (no `logs` section
// in llms.json, or one older than the request log) is said to, instead of failing.
import {card, el, table, when} from "./dom.js";

const FILTERS = [["q", "text in bodies"], ["key", "key id"], ["team", "team"],
                 ["alias", "alias"], ["model", "model"], ["provider", "provider"],
                 ["status", "HTTP status"], ["since", "since (ISO 8601)"],
                 ["until", "until (ISO 8601)"]];
const PAYLOAD = {
  disabled: "Bodies were not captured: capture is off for this request (logs.capture).",
  not_captured: "Capture was on, but this request's bodies were not kept (a private key).",
  stored: "Bodies stored, shown below as text.",
};

function unavailable(error) {
  return error.status === 404 && /^No route/.test(error.message);
}

function missing() {
  return el("p", {class: "notice", id: "logs-missing"},
            "The request log is not available on this gateway: /admin/logs answered 404 " +
            "(a gateway older than the request log, or one built without it).");
}

function empty() {
  return el("p", {class: "notice", id: "logs-empty"},
            "No request logged yet. The gateway logs requests when llms.json has a `logs` " +
            "section (docs/request-logs.md).");
}

export async function render(main, context) {
  const [id] = context.route;
  if (id) return detail(main, context, decodeURIComponent(id));
  const inputs = Object.fromEntries(FILTERS.map(([name, label]) =>
    [name, el("input", {name, placeholder: label, "aria-label": label})]));
  const results = el("div", {id: "log-results"});
  const more = el("button", {type: "button", class: "quiet", hidden: true}, "Older requests");
  const jump = el("input", {id: "request-id", placeholder: "x-request-id",
                            "aria-label": "request id"});
  let cursor = null;
  let shown = [];
  async function search(append) {
    const query = new URLSearchParams();
    for (const [name, input] of Object.entries(inputs)) {
      if (input.value.trim()) query.set(name, input.value.trim());
    }
    const filtered = [...query.keys()].length > 0;
    query.set("limit", "50");
    if (append && cursor) query.set("cursor", cursor);
    let page;
    try {
      page = await context.api(`/admin/logs?${query}`);
    } catch (error) {
      if (unavailable(error)) { results.replaceChildren(missing()); return; }
      throw error;
    }
    cursor = page.next_cursor || null;
    more.hidden = !cursor;
    shown = append ? [...shown, ...page.data] : page.data;
    results.replaceChildren(shown.length || filtered ? listed(shown) : empty());
  }
  main.append(
    card("Find a request",
         el("form", {class: "inline", id: "jump", onsubmit: (event) => {
           event.preventDefault();
           if (jump.value.trim()) location.hash = `logs/${encodeURIComponent(jump.value.trim())}`;
         }}, jump, el("button", {type: "submit"}, "Open"))),
    card("Search the request log",
         el("form", {class: "filters", id: "log-search", onsubmit: (event) => {
           event.preventDefault();
           search(false).catch(context.showError);
         }}, Object.values(inputs), el("button", {type: "submit"}, "Search")),
         results, more));
  more.addEventListener("click", () => search(true).catch(context.showError));
  await search(false);
}

function listed(rows) {
  return table([
    ["time", (r) => when(r.time)],
    ["request", (r) => el("a", {href: `#logs/${encodeURIComponent(r.request_id)}`},
                          r.request_id)],
    ["key", (r) => r.key || "–"],
    ["team", (r) => r.team || "–"],
    ["alias", (r) => r.alias || r.requested || "–"],
    ["provider", (r) => r.provider || "–"],
    ["tries", (r) => String(r.attempts.length)],
    ["status", (r) => String(r.status)],
    ["tokens", (r) => tokens(r)],
    ["ms", (r) => milliseconds(r.duration_ms)],
    ["cost", (r) => cost(r.cost)],
  ], rows, (r) => ({class: "row", dataset: {requestId: r.request_id}}));
}

const tokens = (r) => r.prompt_tokens === null && r.completion_tokens === null ? "–" :
  `${r.prompt_tokens ?? 0} → ${r.completion_tokens ?? 0}`;
const milliseconds = (value) => value === null ? "–" : `${Math.round(value * 10) / 10}`;
// To the millionth of a dollar, as `x-llms-cost` says it.
const cost = (value) => value === null ? "–" : `$${Number(value).toFixed(6)}`;

async function detail(main, {api}, id) {
  main.append(el("p", {}, el("a", {href: "#logs"}, "← all requests")));
  let row;
  try {
    row = await api(`/admin/logs/${encodeURIComponent(id)}`);
  } catch (error) {
    if (unavailable(error)) { main.append(missing()); return; }
    if (error.status === 404) {
      main.append(el("p", {class: "notice", id: "log-missing"}, `No request ${id} in the log.`));
      return;
    }
    throw error;
  }
  main.append(
    card(`Request ${row.request_id}`, facts(row)),
    card("Attempts", timeline(row.attempts)),
    card("Bodies", el("p", {id: "payload", dataset: {payload: row.payload}},
                      PAYLOAD[row.payload] || `payload: ${row.payload}`),
         bodies(row)));
}

// Every field of the row but its bodies and attempts (shown below), each as a person reads it.
const OWN_CARD = new Set(["request_id", "attempts", "request_body", "response_body"]);

function facts(row) {
  const shown = {
    ...row,
    guardrails: row.guardrails.length ? row.guardrails.join(", ") : "none",
    hedge: row.hedge ? `${row.hedge.winner} won (the ${row.hedge.won_by} try)` : "no",
  };
  return el("dl", {class: "facts", id: "log-facts"},
    Object.entries(shown).filter(([name]) => !OWN_CARD.has(name)).flatMap(([name, value]) =>
      [el("dt", {}, name), el("dd", {dataset: {field: name}}, fact(name, value))]));
}

function fact(name, value) {
  if (value === null || value === undefined) return "–";
  if (name === "cost") return cost(value);
  if (name.endsWith("_ms")) return `${milliseconds(value)} ms`;
  if (name === "time") return when(value);
  return String(value);
}

// The tries in the order they were made, each a step on one track: the request log keeps
// their order and outcome (the request's own duration is among its facts).
function timeline(attempts) {
  if (!attempts.length) {
    return el("p", {class: "dim", id: "attempts-none"},
              "No try of its own: refused before any provider, or answered from the cache " +
              "or a replay.");
  }
  return el("ol", {class: "timeline", id: "attempts"}, attempts.map((a, i) =>
    el("li", {dataset: {outcome: a.outcome}},
      el("span", {class: "what"}, `${i + 1}. ${a.provider}`,
         a.hedge ? el("span", {class: "dim"}, " (hedge)") : null),
      el("span", {class: "track"}, bar(i / attempts.length, 1 / attempts.length, a.outcome)),
      el("span", {class: "outcome"}, said(a)))));
}

function said(a) {
  if (a.outcome === "failed") {
    return ["failed", a.status, a.reason].filter((part) => part !== null && part !== undefined)
      .join(" · ");
  }
  if (a.outcome === "lost") return "lost the hedge race";
  return a.outcome;
}

// Placed through the style object (the console's policy forbids style attributes).
function bar(start, share, outcome) {
  const kind = {answered: "good", resumed: "good", lost: "lost"}[outcome] || "bad";
  const span = el("span", {class: `span ${kind}`});
  span.style.marginLeft = `${start * 100}%`;
  span.style.width = `${share * 100}%`;
  return span;
}

function bodies(row) {
  return [["request", row.request_body], ["response", row.response_body]]
    .filter(([, body]) => body !== null && body !== undefined)
    .map(([name, body]) => el("div", {},
      el("h3", {}, name),
      // textContent: a body is shown as the text it is, whatever markup it holds.
      el("pre", {class: "body", dataset: {body: name}}, readable(body))));
}

// A JSON body laid out to be read; a stream's text, or a body cut at max_body_bytes, as kept.
function readable(body) {
  try {
    return JSON.stringify(JSON.parse(body), null, 2);
  } catch (error) {
    return body;
  }
}
