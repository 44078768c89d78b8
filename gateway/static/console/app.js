// The console: who is signed in, the pages, and the one way every page reaches the gateway
// (the admin API, with the session's cookie and, for a change, its CSRF token).
import * as overview from "./overview.js";
import * as logs from "./logs.js";
import * as keys from "./keys.js";
import * as spend from "./spend.js";
import * as providers from "./providers.js";
import * as config from "./config.js";

const PAGES = {overview, logs, keys, spend, providers, config};
const TEAM_PAGES = new Set(["overview", "logs", "keys", "spend"]);
const $ = (id) => document.getElementById(id);
let session = null;
let leaving = [];  // what the page shown set up (timers) and must stop when another is shown

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

// A call to the gateway: JSON in and out; an answer that is not 2xx is an ApiError carrying
// the envelope's message, so a refused change says why.
export async function api(path, {method = "GET", body} = {}) {
  const headers = {};
  if (body !== undefined) headers["content-type"] = "application/json";
  if (method !== "GET" && session && session.csrf) headers["x-csrf-token"] = session.csrf;
  const answer = await fetch(path, {method, headers, credentials: "same-origin",
                                    cache: "no-store",
                                    body: body === undefined ? undefined : JSON.stringify(body)});
  let data = null;
  try { data = await answer.json(); } catch (error) { data = null; }
  if (answer.status === 401 && session) { signedOut("Your session ended: sign in again."); }
  if (!answer.ok) {
    const said = data && data.error && data.error.message;
    throw new ApiError(answer.status, said || `The gateway answered ${answer.status}`);
  }
  return data;
}

export function showError(error) {
  $("error").hidden = !error;
  $("error").textContent = error ? String(error.message || error) : "";
}

function signedOut(said) {
  session = null;
  render();
  $("login-said").textContent = said || "";
}

async function boot() {
  const answer = await fetch("/ui/session", {credentials: "same-origin", cache: "no-store"});
  const found = await answer.json();
  session = found.signed_in ? found : null;
  $("sso").hidden = !found.sso;
  $("key-form").hidden = !found.key_login;
  $("no-way").hidden = found.sso || found.key_login;
  render();
}

function allowed(page) {
  return page in PAGES && (session.role !== "team_admin" || TEAM_PAGES.has(page));
}

async function render() {
  for (const stop of leaving) stop();
  leaving = [];
  showError(null);
  const main = $("main");
  main.replaceChildren();
  $("login").hidden = Boolean(session);
  $("nav").hidden = $("logout").hidden = !session || session.via === "local";
  document.body.dataset.role = session ? session.role : "";
  if (!session) {
    $("who").textContent = "";
    document.body.dataset.page = "login";
    return;
  }
  $("nav").hidden = false;
  const teams = session.teams.length ? ` of ${session.teams.join(", ")}` : "";
  $("who").textContent = `${session.actor} · ${session.role.replace("_", " ")}${teams}`;
  for (const link of $("nav").querySelectorAll("a")) {
    link.hidden = !allowed(link.dataset.page);
  }
  let page = location.hash.slice(1).split("/")[0] || "overview";
  if (!allowed(page)) page = "overview";
  for (const link of $("nav").querySelectorAll("a")) {
    link.classList.toggle("here", link.dataset.page === page);
  }
  document.body.dataset.page = page;
  document.body.dataset.ready = "";
  const context = {api, session, showError, route: location.hash.slice(1).split("/").slice(1),
                   onLeave: (stop) => leaving.push(stop)};
  try {
    await PAGES[page].render(main, context);
  } catch (error) {
    showError(error);
  }
  document.body.dataset.ready = "true";
}

$("key-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const key = $("key").value.trim();
  $("key").value = "";
  if (!key) return;
  const answer = await fetch("/ui/login/key", {
    method: "POST", credentials: "same-origin", headers: {"content-type": "application/json"},
    body: JSON.stringify({key})});
  const said = await answer.json().catch(() => ({}));
  if (!answer.ok) {
    $("login-said").textContent = (said.error && said.error.message) ||
      `The gateway answered ${answer.status}`;
    document.body.dataset.page = "login-refused";
    return;
  }
  session = said;
  $("login-said").textContent = "";
  render();
});

$("logout").addEventListener("click", async () => {
  try { await api("/ui/logout", {method: "POST"}); } catch (error) { /* signed out anyway */ }
  signedOut("Signed out.");
});

window.addEventListener("hashchange", () => { if (session) render(); });
boot().catch((error) => showError(error));
