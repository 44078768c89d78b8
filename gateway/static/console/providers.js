// Providers: in the order they are tried, their health, circuits and traffic; an admin turns
// one off or on (/admin/providers/{name}/disable|enable), audited in their name.
import {card, dollars, el} from "./dom.js";

export async function render(main, context) {
  const {api, session} = context;
  const {providers} = await api("/admin/providers");
  const list = el("ol", {class: "providers", id: "providers"});
  providers.forEach((p, index) => {
    const open = p.circuits.filter((c) => c.state !== "closed")
      .map((c) => `${c.model}: ${c.state.replace("_", " ")}`);
    if (p.cooling_down_for) open.push(`cooling down ${p.cooling_down_for}s`);
    const t = p.traffic || {};
    const action = p.enabled ? "disable" : "enable";
    list.append(el("li", {class: "card provider", dataset: {name: p.name, health: p.health}},
      el("div", {class: "top"},
         el("span", {class: "dim"}, `${index + 1}.`), el("b", {}, p.name),
         el("span", {class: "dim"}, p.type),
         el("span", {class: `badge ${p.health}`}, p.health.replace("_", " ")),
         p.reason ? el("span", {class: "dim"}, p.reason) : null,
         session.role === "admin" ? el("button", {
           type: "button", class: "small", dataset: {toggle: action},
           onclick: async () => {
             try {
               await api(`/admin/providers/${encodeURIComponent(p.name)}/${action}`,
                         {method: "POST"});
               window.dispatchEvent(new HashChangeEvent("hashchange"));
             } catch (error) { context.showError(error); }
           }}, action) : null),
      el("div", {class: "dim"}, p.models.map((m) => m.alias).join(", ") +
         (open.length ? ` — ${open.join("; ")}` : "")),
      el("div", {class: "dim"},
         `answered ${t.answered ?? 0} · failed ${t.failed ?? 0} · TTFT p50 ` +
         `${t.ttft_p50_ms ?? "–"} ms · cost ${dollars(t.cost_usd)}`)));
  });
  main.append(card("Providers, in the order they are tried", list));
}
