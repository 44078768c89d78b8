// Keys and teams: list, create (a key's secret shown once, here, and nowhere after), change a
// budget or the aliases allowed, revoke. A viewer reads; a team admin runs their teams' keys.
import {card, dollars, el, field, table, when} from "./dom.js";

const PERIODS = ["day", "week", "month", "total"];

function budget(b) {
  return b ? `${dollars(b.usd)} / ${b.period}` : "none";
}

function list(text) {
  const items = text.split(",").map((s) => s.trim()).filter(Boolean);
  return items.length ? items : null;
}

function numberOrNull(text) {
  return text.trim() ? Number(text) : null;
}

function periodSelect(name) {
  return el("select", {name, "aria-label": "budget period"},
            PERIODS.map((p) => el("option", {value: p, selected: p === "month"}, p)));
}

export async function render(main, context) {
  const {api, session} = context;
  const writer = session.role !== "viewer";
  const teamAdmin = session.role === "team_admin";
  const [keys, teams] = await Promise.all([api("/admin/keys"), api("/admin/teams")]);
  const secret = el("div", {id: "secret", class: "secret", hidden: true});
  main.append(secret);
  if (!writer) {
    main.append(el("p", {class: "notice", id: "read-only"},
                   "You are a viewer: you read everything and change nothing."));
  }
  main.append(card("Keys", table([
    ["name", (k) => k.name],
    ["id", (k) => el("code", {}, k.id)],
    ["key", (k) => k.key_hint],
    ["team", (k) => k.team || "–"],
    ["models", (k) => k.models ? k.models.join(", ") : "any"],
    ["budget", (k) => budget(k.budget)],
    ["rpm / tpm", (k) => `${k.rpm ?? "–"} / ${k.tpm ?? "–"}`],
    ["created", (k) => `${when(k.created_at)} by ${k.created_by || "–"}`],
    ["", (k) => k.revoked_at ? el("span", {class: "dim"}, `revoked ${when(k.revoked_at)}`) :
      writer ? keyActions(k, context) : ""],
  ], keys.data, (k) => ({class: k.revoked_at ? "revoked" : "", dataset: {key: k.id}}))));
  if (writer) main.append(newKey(context, teams.data, secret, teamAdmin));
  main.append(card("Teams", table([
    ["name", (t) => t.name],
    ["models", (t) => t.models ? t.models.join(", ") : "any"],
    ["budget", (t) => budget(t.budget)],
    ["rpm / tpm", (t) => `${t.rpm ?? "–"} / ${t.tpm ?? "–"}`],
    ["", (t) => writer && !teamAdmin ? teamActions(t, context) : ""],
  ], teams.data, (t) => ({dataset: {team: t.name}}))));
  if (writer && !teamAdmin) main.append(newTeam(context));
}

async function change(context, path, method, body) {
  try {
    const done = await context.api(path, {method, body});
    // The same page, drawn again from the gateway's answer.
    window.dispatchEvent(new HashChangeEvent("hashchange"));
    return done;
  } catch (error) {
    context.showError(error);
    return null;
  }
}

function keyActions(k, context) {
  return el("span", {class: "actions"},
    el("button", {type: "button", class: "small", dataset: {edit: k.id}, onclick: () => {
      const models = prompt("Aliases this key may use (comma-separated; empty: any)",
                            (k.models || []).join(", "));
      if (models === null) return;
      const usd = prompt("Budget in dollars (empty: none)", k.budget ? k.budget.usd : "");
      if (usd === null) return;
      const body = {models: list(models),
                    budget: usd.trim() ? {usd: Number(usd), period: k.budget ? k.budget.period : "month"} : null};
      change(context, `/admin/keys/${k.id}`, "PATCH", body);
    }}, "edit"),
    el("button", {type: "button", class: "small danger", dataset: {revoke: k.id}, onclick: () => {
      if (confirm(`Revoke ${k.name}? It is refused from its next request.`)) {
        change(context, `/admin/keys/${k.id}`, "DELETE");
      }
    }}, "revoke"));
}

function teamActions(t, context) {
  return el("span", {class: "actions"},
    el("button", {type: "button", class: "small", onclick: () => {
      const models = prompt("Aliases this team's keys may use (comma-separated; empty: any)",
                            (t.models || []).join(", "));
      if (models === null) return;
      const usd = prompt("Budget in dollars (empty: none)", t.budget ? t.budget.usd : "");
      if (usd === null) return;
      change(context, `/admin/teams/${encodeURIComponent(t.name)}`, "PATCH", {
        models: list(models),
        budget: usd.trim() ? {usd: Number(usd), period: t.budget ? t.budget.period : "month"} : null});
    }}, "edit"),
    el("button", {type: "button", class: "small danger", onclick: () => {
      if (confirm(`Delete the team ${t.name}?`)) {
        change(context, `/admin/teams/${encodeURIComponent(t.name)}`, "DELETE");
      }
    }}, "delete"));
}

function newKey(context, teams, secret, teamAdmin) {
  const form = el("form", {class: "filters", id: "new-key"},
    field("name", el("input", {name: "name", required: true})),
    field("team", el("select", {name: "team"},
      teamAdmin ? null : el("option", {value: ""}, "no team"),
      teams.map((t) => el("option", {value: t.name}, t.name)))),
    field("models (comma-separated; empty: any)", el("input", {name: "models"})),
    field("budget $", el("input", {name: "usd", type: "number", min: "0", step: "any"})),
    field("per", periodSelect("period")),
    field("rpm", el("input", {name: "rpm", type: "number", min: "1"})),
    field("tpm", el("input", {name: "tpm", type: "number", min: "1"})),
    el("button", {type: "submit"}, "Create key"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const f = form.elements;
    const body = {name: f.name.value.trim(), team: f.team.value || null,
                  models: list(f.models.value), rpm: numberOrNull(f.rpm.value),
                  tpm: numberOrNull(f.tpm.value),
                  budget: f.usd.value.trim() ? {usd: Number(f.usd.value), period: f.period.value} : null};
    try {
      const made = await context.api("/admin/keys", {method: "POST", body});
      form.reset();
      const main = document.getElementById("main");
      main.replaceChildren();
      await render(main, context);
      const shown = document.getElementById("secret");
      shown.hidden = false;
      shown.replaceChildren(
        el("b", {}, `The key ${made.name}: copy it now, it is not shown again.`),
        el("code", {id: "new-secret"}, made.key),
        ...(made.warnings ? [el("p", {class: "dim"}, made.warnings.join("; "))] : []));
    } catch (error) {
      context.showError(error);
    }
  });
  return card("New key", form);
}

function newTeam(context) {
  const form = el("form", {class: "filters", id: "new-team"},
    field("name", el("input", {name: "name", required: true})),
    field("models (comma-separated; empty: any)", el("input", {name: "models"})),
    field("budget $", el("input", {name: "usd", type: "number", min: "0", step: "any"})),
    field("per", periodSelect("period")),
    el("button", {type: "submit"}, "Create team"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const f = form.elements;
    await change(context, "/admin/teams", "POST", {
      name: f.name.value.trim(), models: list(f.models.value),
      budget: f.usd.value.trim() ? {usd: Number(f.usd.value), period: f.period.value} : null});
  });
  return card("New team", form);
}
