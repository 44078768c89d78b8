// Spend: dollars per day as a chart, and per key, team, model and alias as tables with bars,
// over the last 7, 30 or 90 days (/admin/spend; a team admin's: their teams' only).
import {chart, dayOf, number} from "./chart.js";
import {card, count, dollars, el, table} from "./dom.js";
import {lastDays} from "./overview.js";

const DAY = 86400;
const GROUPS = [["key", "By key"], ["team", "By team"], ["model", "By model"],
                ["alias", "By alias"]];

export async function render(main, {api, route}) {
  const span = [7, 30, 90].includes(Number(route[0])) ? Number(route[0]) : 30;
  const days = lastDays(span);
  const start = new Date(days[0] * 1000).toISOString().slice(0, 10);
  main.append(el("p", {class: "range"}, "Last ",
    [7, 30, 90].map((n) => el("a", {href: `#spend/${n}`, class: n === span ? "here" : ""},
                              `${n} days`)).flatMap((a) => [a, " "])));
  const [byDay, ...groups] = await Promise.all(
    ["day", ...GROUPS.map(([g]) => g)].map((g) =>
      api(`/admin/spend?group_by=${g}&start=${start}`)));
  const costs = new Map(byDay.data.map((r) => [r.group, r.cost]));
  const perDay = el("svg", {class: "chart", id: "chart-spend-days", role: "img",
                            "aria-label": "spend per day"});
  main.append(el("section", {class: "charts"},
    el("section", {class: "card wide"}, el("h2", {}, `Spend per day`), perDay,
       el("p", {class: "dim", id: "spend-sum"},
          `${dollars(byDay.data.reduce((s, r) => s + r.cost, 0))} over ` +
          `${count(byDay.data.reduce((s, r) => s + r.requests, 0))} requests`))));
  chart(perDay, days, [days.map((t) => costs.get(new Date(t * 1000).toISOString().slice(0, 10)) || 0)],
        (v) => `$${number(v)}`, 0.0001, {step: DAY, label: dayOf, every: Math.ceil(span / 6)});
  const section = el("section", {class: "charts split"});
  main.append(section);
  GROUPS.forEach(([group, title], i) => {
    const rows = groups[i].data.slice().sort((a, b) => b.cost - a.cost);
    const most = Math.max(1e-12, ...rows.map((r) => r.cost));
    section.append(card(title, table([
      [group, (r) => r.group ?? "(none)"],
      ["share", (r) => share(r.cost / most)],
      ["requests", (r) => count(r.requests)],
      ["refused", (r) => count(r.refused)],
      ["tokens in / out", (r) => `${count(r.prompt_tokens)} / ${count(r.completion_tokens)}`],
      ["cost", (r) => dollars(r.cost)],
    ], rows, (r) => ({dataset: {group: r.group ?? ""}}))));
    section.lastChild.id = `spend-by-${group}`;
  });
}

// A bar as wide as this row's share of the largest (set through the style object: the
// console's policy forbids style attributes).
function share(fraction) {
  const bar = el("span", {class: "share"});
  bar.style.width = `${Math.max(2, fraction * 100)}%`;
  return el("span", {class: "track"}, bar);
}
