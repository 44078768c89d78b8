// Overview: requests, errors, latency (the last five minutes, from /status.json) and spend per
// day (the last 30 days, from /admin/spend), as charts; refreshed while shown. A team admin,
// who may not read the gateway's traffic, sees their teams' requests, errors and latency per
// hour over the last day, from the request log (/admin/logs), and their spend.
import {chart, clockTime, dayOf, number} from "./chart.js";
import {card, count, dollars, el} from "./dom.js";

const DAY = 86400, HOUR = 3600;
const MOST_ROWS = 1000;  // one page of the request log: the newest requests of the day

function svg(id, label) {
  return el("svg", {class: "chart", id, role: "img", "aria-label": label});
}

function tile(label, id) {
  return el("div", {class: "card tile"}, el("span", {class: "dim"}, label), el("b", {id}, "–"));
}

export async function render(main, {api, session, onLeave}) {
  const team = session.role === "team_admin";
  main.append(
    team ? el("p", {class: "dim", id: "team-traffic"}, `Requests and spend of ` +
                                   `${session.teams.join(", ")}.`) :
      el("section", {class: "tiles"}, tile("requests/s", "rps"), tile("error rate", "errors"),
         tile("p50 latency", "p50"), tile("p99 latency", "p99"), tile("in flight", "inflight"),
         tile("spend today", "today"), tile("spend this month", "month")),
    el("section", {class: "charts"},
       team ? null : card("Requests/s, last 5 minutes", svg("chart-rps", "requests per second")),
       team ? null : card("Error rate, last 5 minutes", svg("chart-errors", "error rate")),
       team ? null : el("section", {class: "card wide"},
         el("h2", {}, "Latency p50 / ", el("span", {class: "second"}, "p99")),
         svg("chart-latency", "latency p50 and p99")),
       team ? el("section", {class: "card"},
         el("h2", {}, "Requests / ", el("span", {class: "second"}, "errors"), " per hour"),
         svg("chart-team-requests", "requests and errors per hour")) : null,
       team ? card("Latency p50 per hour", svg("chart-team-latency", "latency per hour")) : null,
       el("section", {class: "card wide"}, el("h2", {}, "Spend per day, last 30 days"),
          svg("chart-spend", "spend per day"), el("p", {class: "dim", id: "spend-total"}))));
  await spendChart(api);
  if (team) {
    await teamTraffic(api, session.teams);
    return;
  }
  try {
    await traffic(api);
  } catch (error) {
    // This machine is the admin (no admin key set) but /status.json wants a client key.
    main.prepend(el("p", {class: "notice"}, `Traffic cannot be read: ${error.message}`));
    return;
  }
  const timer = setInterval(() => traffic(api).catch(() => {}), 5000);
  onLeave(() => clearInterval(timer));
}

async function traffic(api) {
  const status = await api("/status.json");
  const s = status.summary;
  const set = (id, text) => { const node = document.getElementById(id); if (node) node.textContent = text; };
  set("rps", String(s.rps));
  set("errors", `${Math.round(s.error_rate * 1000) / 10}%`);
  set("p50", s.p50_ms === null ? "–" : `${s.p50_ms} ms`);
  set("p99", s.p99_ms === null ? "–" : `${s.p99_ms} ms`);
  set("inflight", String(status.inflight));
  if (status.spend && status.spend.available) {
    set("today", `${dollars(status.spend.today.cost)} · ${count(status.spend.today.requests)}`);
    set("month", `${dollars(status.spend.month.cost)} · ${count(status.spend.month.requests)}`);
  }
  const rps = document.getElementById("chart-rps");
  if (!rps) return;
  const times = status.series.map((r) => r.t);
  chart(rps, times, [status.series.map((r) => r.rps)], (v) => `${number(v)}/s`, 1);
  chart(document.getElementById("chart-errors"), times,
        [status.series.map((r) => r.error_rate)], (v) => `${number(v * 100)}%`, 0.01);
  chart(document.getElementById("chart-latency"), times,
        [status.series.map((r) => r.p50_ms), status.series.map((r) => r.p99_ms)],
        (v) => `${number(v)} ms`, 10);
}

export function lastDays(days) {
  const today = Math.floor(Date.now() / 1000 / DAY) * DAY;
  return Array.from({length: days}, (_, i) => today - (days - 1 - i) * DAY);
}

async function spendChart(api) {
  const days = lastDays(30);
  const start = new Date(days[0] * 1000).toISOString().slice(0, 10);
  const report = await api(`/admin/spend?group_by=day&start=${start}`);
  const byDay = new Map(report.data.map((row) => [row.group, row.cost]));
  const costs = days.map((t) => byDay.get(new Date(t * 1000).toISOString().slice(0, 10)) || 0);
  chart(document.getElementById("chart-spend"), days, [costs], (v) => `$${number(v)}`, 0.0001,
        {step: DAY, label: dayOf, every: 5});
  const total = report.data.reduce((sum, row) => sum + row.cost, 0);
  const requests = report.data.reduce((sum, row) => sum + row.requests, 0);
  document.getElementById("spend-total").textContent =
    `${dollars(total)} over ${count(requests)} requests in 30 days`;
}

// The last 24 hours of the request log (a team admin's reads hold their teams' rows only), per
// hour: requests, errors (status 400 and above), the median duration.
async function teamTraffic(api, teams) {
  const first = Math.floor(Date.now() / 1000 / HOUR) * HOUR - 23 * HOUR;
  const since = new Date(first * 1000).toISOString();
  const page = await api(`/admin/logs?limit=${MOST_ROWS}&since=${since}`);
  const hours = Array.from({length: 24}, (_, i) => first + i * HOUR);
  const rows = hours.map(() => []);
  for (const row of page.data) {
    const at = Math.floor((Date.parse(row.time) / 1000 - first) / HOUR);
    if (at >= 0 && at < 24) rows[at].push(row);
  }
  const requests = rows.map((hour) => hour.length);
  const errors = rows.map((hour) => hour.filter((row) => row.status >= 400).length);
  const median = rows.map((hour) => {
    const sorted = hour.map((row) => row.duration_ms).sort((a, b) => a - b);
    return sorted.length ? sorted[Math.floor((sorted.length - 1) / 2)] : null;
  });
  const axis = {step: HOUR, label: clockTime, every: 6};
  const drawn = document.getElementById("chart-team-requests");
  drawn.dataset.requests = String(requests.reduce((sum, n) => sum + n, 0));
  chart(drawn, hours, [requests, errors], (v) => number(v), 1, axis);
  chart(document.getElementById("chart-team-latency"), hours, [median],
        (v) => `${number(v)} ms`, 10, axis);
  document.getElementById("team-traffic").textContent = `Requests and spend of ` +
    `${teams.join(", ")}` + (page.next_cursor ? `: the newest ${MOST_ROWS} requests of the day.` :
      page.data.length ? "." : ": no request in the request log for the last day (it logs " +
                               "requests when llms.json has a `logs` section).");
}
