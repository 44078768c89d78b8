// Config: the llms.json in force, every secret hidden by the gateway (/admin/config), and the
// latest admin actions with who did them (/admin/audit).
import {card, el, table, when} from "./dom.js";

export async function render(main, {api}) {
  const [config, audit] = await Promise.all([api("/admin/config"),
                                             api("/admin/audit?limit=50")]);
  main.append(
    card("Config in force",
         el("p", {class: "dim"}, `${config.source || "(built without a file)"}` +
            (config.last_reload_error ? ` — last reload failed: ${config.last_reload_error}` : "")),
         el("pre", {class: "body", id: "config"}, JSON.stringify(config.config, null, 2))),
    card("Admin actions", table([
      ["time", (r) => when(r.time)], ["who", (r) => r.actor], ["action", (r) => r.action],
      ["target", (r) => r.target],
    ], audit.data, (r) => ({dataset: {action: r.action}}))));
}
