// Logs: search the request log (/admin/logs) and open one request (/admin/logs/{id}) with its
// attempts as a timeline and its bodies as text. On a gateway without the request log the
// page says so instead of failing.
import {card, dollars, el, field, table, when} from "./dom.js";

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

const pick = (row, ...names) => names.map((n) => row[n]).find((v) => v !== undefined && v !== null);

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
  async function search(append) {
    const query = new URLSearchParams();
    for (const [name, input] of Object.entries(inputs)) {
      if (input.value.trim()) query.set(name, input.value.trim());
    }
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
    const rows = append ? [...results.querySelectorAll("tbody tr.row")] : [];
    results.replaceChildren(listed(page.data, rows.length));
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
    ["time", (r) => when(pick(r, "time", "created_at"))],
    ["request", (r) => el("a", {href: `#logs/${encodeURIComponent(r.request_id)}`},
                          r.request_id)],
    ["key", (r) => pick(r, "key", "key_id") || "–"],
    ["team", (r) => r.team || "–"],
    ["alias", (r) => pick(r, "alias", "model") || "–"],
    ["provider", (r) => r.provider || "–"],
    ["status", (r) => String(pick(r, "status") ?? "–")],
    ["ms", (r) => String(pick(r, "duration_ms", "latency_ms") ?? "–")],
    ["cost", (r) => dollars(r.cost)],
  ], rows, (r) => ({class: "row", dataset: {requestId: r.request_id}}));
}

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
  const facts = Object.entries(row).filter(([, v]) => v === null || typeof v !== "object");
  main.append(
    card(`Request ${row.request_id}`,
         el("dl", {class: "facts", id: "log-facts"}, facts.map(([name, value]) =>
           [el("dt", {}, name), el("dd", {dataset: {field: name}}, String(value ?? "–"))]))),
    card("Attempts", timeline(row.attempts || [])),
    card("Bodies", el("p", {id: "payload", dataset: {payload: row.payload || ""}},
                      PAYLOAD[row.payload] || `payload: ${row.payload ?? "unknown"}`),
         bodies(row)));
}

// Each attempt a bar on one time axis: where it started and how long it ran, its outcome.
function timeline(attempts) {
  if (!attempts.length) return el("p", {class: "dim"}, "No attempt reached a provider.");
  let offset = 0;
  const spans = attempts.map((a) => {
    const start = pick(a, "start_ms", "started_ms", "offset_ms") ?? offset;
    const length = pick(a, "duration_ms", "ms") ?? 0;
    offset = start + length;
    return {a, start, length};
  });
  const total = Math.max(1, ...spans.map((s) => s.start + s.length));
  return el("ol", {class: "timeline", id: "attempts"}, spans.map(({a, start, length}, i) => {
    const outcome = String(pick(a, "outcome", "status", "result") ?? "–");
    return el("li", {dataset: {outcome}},
      el("span", {class: "what"}, `${i + 1}. ${pick(a, "provider") || "–"}`,
         el("span", {class: "dim"}, ` ${pick(a, "model") || ""}`)),
      el("span", {class: "track"}, bar(start / total, length / total, outcome)),
      el("span", {class: "outcome"}, `${outcome} · ${length} ms`,
         pick(a, "error", "error_code") ? ` · ${pick(a, "error", "error_code")}` : ""));
  }));
}

// Placed through the style object (the console's policy forbids style attributes).
function bar(start, share, outcome) {
  const span = el("span", {class: `span ${/^(ok|success|answered|2)/.test(outcome) ? "good" : "bad"}`});
  span.style.marginLeft = `${start * 100}%`;
  span.style.width = `${Math.max(1, share * 100)}%`;
  return span;
}

function bodies(row) {
  const kept = row.bodies || {};
  const shown = [["request", pick(row, "request_body") ?? kept.request ?? row.request],
                 ["response", pick(row, "response_body") ?? kept.response ?? row.response]]
    .filter(([, body]) => body !== undefined && body !== null);
  return shown.map(([name, body]) => el("div", {},
    el("h3", {}, name),
    // textContent: a body is shown as the text it is, whatever markup it holds.
    el("pre", {class: "body", dataset: {body: name}},
       typeof body === "string" ? body : JSON.stringify(body, null, 2))));
}
