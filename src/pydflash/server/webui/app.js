// The chat page: conversations (kept in this browser's localStorage), settings, the
// API key (sessionStorage: this tab only), and one streamed reply at a time.

import { ApiError, Reply, getProps, stream } from "./chat.js";
import { el, messageNode, showReply, showTokens, showUser } from "./view.js";

const STORE = "pydflash.webui.conversations";
const SETTINGS = "pydflash.webui.settings";
const BASELINE = "pydflash.webui.baseline";
const KEY = "pydflash.webui.key";

const $ = (id) => document.getElementById(id);
const state = { convs: [], active: null, props: null, key: sessionStorage.getItem(KEY) || "", busy: null };

function read(store, name, fallback) {
  try {
    const v = JSON.parse(store.getItem(name));
    return v === null ? fallback : v;
  } catch (e) {
    return fallback;
  }
}

function save() {
  try {
    localStorage.setItem(STORE, JSON.stringify({ active: state.active, convs: state.convs }));
  } catch (e) {
    say("Could not save the conversations: " + e.message);
  }
}

function say(text) {
  $("status").textContent = text;
}

function conv() {
  return state.convs.find((c) => c.id === state.active);
}

function newConv() {
  const id = Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
  const c = { id, title: "New conversation", created: Date.now(), messages: [] };
  state.convs.unshift(c);
  state.active = id;
  return c;
}

// -- settings ---------------------------------------------------------------------

const FIELDS = { mode: "set-mode", system: "set-system", temperature: "set-temperature", top_p: "set-top-p",
  seed: "set-seed", max_tokens: "set-max-tokens", draft: "set-draft", custom: "set-custom" };

function settings() {
  const s = {};
  for (const [name, id] of Object.entries(FIELDS)) s[name] = $(id).value;
  return s;
}

function customFields() {
  const text = $("set-custom").value.trim();
  if (!text) return {};
  const obj = JSON.parse(text);  // a SyntaxError names what is wrong
  if (typeof obj !== "object" || obj === null || Array.isArray(obj)) throw new SyntaxError("not a JSON object");
  return obj;
}

function checkCustom() {
  try {
    customFields();
    $("set-custom-error").textContent = "";
    return true;
  } catch (e) {
    $("set-custom-error").textContent = "Extra request fields: " + e.message;
    return false;
  }
}

function fillSettings(props) {
  const params = (props.default_generation_settings || {}).params || {};
  const saved = read(localStorage, SETTINGS, {});
  const nMax = params["speculative.n_max"] || 0;
  const draft = $("set-draft");
  draft.replaceChildren();
  const opt = (value, label) => draft.append(Object.assign(el("option", "", label), { value }));
  opt("auto", "Automatic (the policy chooses each pass)");
  opt("0", "0: the target alone (measures its speed)");
  for (let k = 1; k <= nMax; k++) opt(String(k), String(k));
  const defaults = { mode: "auto", system: "", temperature: String(params.temperature ?? 0.8),
    top_p: String(params.top_p ?? 0.95), seed: "-1", max_tokens: "256", draft: "auto", custom: "" };
  for (const [name, id] of Object.entries(FIELDS)) $(id).value = saved[name] ?? defaults[name];
  if (!$("set-draft").value) $("set-draft").value = "auto";
  checkCustom();
}

function mode() {
  const m = $("set-mode").value;
  if (m !== "auto") return m;
  return state.props && state.props.chat_template ? "chat" : "text";
}

// -- the model card and the API key -------------------------------------------------

function fileName(path) {
  return path ? String(path).split(/[\\/]/).pop() : "none";
}

function showCard(props) {
  const pair = props.pair || {};
  const gen = props.default_generation_settings || {};
  const field = (name, text) => { document.querySelector(`#model-card [data-field=${name}]`).textContent = text; };
  field("target", fileName(props.model_path));
  field("drafter", props.draft_model_path
    ? fileName(props.draft_model_path) + (pair.drafter ? " (" + pair.drafter + ")" : "") : "none");
  field("n_ctx", String(gen.n_ctx ?? "–") + " tokens");
  field("n_parallel", String(props.total_slots ?? "–"));
  field("rollback", pair.rollback || "–");
  const hint = mode() === "text" ? "Text (the model has no chat template: it continues your text)" : "Message";
  $("composer-input").placeholder = hint + " · Enter sends, Shift+Enter: a new line, Esc stops";
}

async function connect() {
  try {
    state.props = await getProps(state.key);
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      askKey(state.key ? "That API key was refused; try another." : "This server needs an API key.");
    } else {
      say("Could not reach the server: " + e.message);
    }
    return;
  }
  $("key-form").hidden = true;
  fillSettings(state.props);
  showCard(state.props);
  say("");
}

function askKey(message) {
  $("key-message").textContent = message;
  $("key-form").hidden = false;
  $("key-input").focus();
}

// -- rendering ---------------------------------------------------------------------

function baseline() {
  const b = read(localStorage, BASELINE, null);
  return b && state.props && b.model === state.props.model_alias ? b.tps : null;
}

function renderList() {
  const list = $("chat-list");
  list.replaceChildren();
  for (const c of state.convs) {
    const li = el("li");
    const open = el("button", "conv", c.title);
    open.type = "button";
    open.dataset.id = c.id;
    if (c.id === state.active) open.setAttribute("aria-current", "true");
    const del = el("button", "small delete", "Delete");
    del.type = "button";
    del.dataset.delete = c.id;
    del.setAttribute("aria-label", "Delete conversation: " + c.title);
    li.append(open, del);
    list.append(li);
  }
}

function renderConv() {
  const box = $("messages");
  box.replaceChildren();
  const c = conv();
  if (!c) return;
  c.messages.forEach((m, i) => {
    const art = messageNode(m, i);
    box.append(art);
    if (m.role === "user") showUser(art, m);
    else showReply(art, Reply.from(m), false, baseline());
  });
}

function render() {
  renderList();
  renderConv();
}

// -- one reply ---------------------------------------------------------------------

function requestBody(c, s) {
  const body = { stream: true, timings_per_token: true, max_tokens: parseInt(s.max_tokens, 10) || 256 };
  const temperature = parseFloat(s.temperature);
  const topP = parseFloat(s.top_p);
  const seed = parseInt(s.seed, 10);
  if (!Number.isNaN(temperature)) body.temperature = temperature;
  if (!Number.isNaN(topP)) body.top_p = topP;
  if (seed >= 0) body.seed = seed;
  if (s.draft !== "auto") body.draft_max = parseInt(s.draft, 10);
  const history = c.messages.map((m) => ({ role: m.role, content: m.content }));
  if (mode() === "chat") {
    body.messages = s.system ? [{ role: "system", content: s.system }, ...history] : history;
  } else {
    body.prompt = s.system + history.map((m) => m.content).join("");
  }
  return Object.assign(body, customFields());
}

async function reply() {
  const c = conv();
  const s = settings();
  let body;
  try {
    body = requestBody(c, s);
  } catch (e) {
    say("Extra request fields: " + e.message);
    return;
  }
  const r = new Reply({ draft_max: body.draft_max ?? null, mode: mode() });
  c.messages.push(r);
  const art = messageNode(r, c.messages.length - 1);
  $("messages").append(art);
  const busy = new AbortController();
  state.busy = busy;
  setBusy(true);
  const t0 = performance.now();
  let frame = 0;
  const draw = () => { frame = 0; showReply(art, r, true, baseline()); };
  try {
    const path = mode() === "chat" ? "/v1/chat/completions" : "/v1/completions";
    for await (const chunk of stream(path, body, state.key, busy.signal)) {
      const before = r.content.length;
      r.add(chunk);
      if (r.ttftMs === null && r.content.length > before) {
        r.ttftMs = performance.now() - t0;
        draw();  // the first token at once; then at most one drawing per frame
      } else if (!frame) {
        frame = requestAnimationFrame(draw);
      }
    }
    say("Reply finished: " + r.tokens.length + " tokens" + (r.stats().tau ? ", tau " + r.stats().tau.toFixed(2) : ""));
  } catch (e) {
    if (busy.signal.aborted) {
      r.finish = r.finish || "stopped";
      say("Stopped.");
    } else if (e instanceof ApiError && e.status === 401) {
      c.messages.pop();
      art.remove();
      askKey("This server needs an API key.");
    } else {
      r.error = e.message;
      say("Error: " + e.message);
    }
  } finally {
    if (frame) cancelAnimationFrame(frame);
    state.busy = null;
    setBusy(false);
  }
  if (r.final && r.request.draft_max === 0 && r.stats().tps > 0 && state.props) {
    localStorage.setItem(BASELINE, JSON.stringify({ model: state.props.model_alias, tps: r.stats().tps, at: Date.now() }));
  }
  if (c.messages.includes(r)) {
    showReply(art, r, false, baseline());
    if (r.error) art.querySelector(".content").append(el("p", "error", "Error: " + r.error));
  }
  save();
}

function setBusy(on) {
  $("send").disabled = on;
  $("stop").disabled = !on;
}

async function send() {
  const input = $("composer-input");
  const text = input.value;
  if (state.busy || !text.trim() || !checkCustom()) return;
  if (!state.props) {
    await connect();
    if (!state.props) return;
  }
  const c = conv() || newConv();
  c.messages.push({ role: "user", content: text, mode: mode() });
  if (c.title === "New conversation") c.title = text.trim().slice(0, 48);
  input.value = "";
  save();
  renderList();
  const art = messageNode(c.messages[c.messages.length - 1], c.messages.length - 1);
  $("messages").append(art);
  showUser(art, c.messages[c.messages.length - 1]);
  await reply();
}

// A new reply in place of the one at index (and of what followed it).
async function regenerate(index) {
  const c = conv();
  if (state.busy || !c) return;
  c.messages = c.messages.slice(0, index);
  renderConv();
  await reply();
}

async function copy(text) {
  try {
    await navigator.clipboard.writeText(text);
  } catch (e) {  // no clipboard API (an insecure origin): select and copy
    const area = Object.assign(el("textarea"), { value: text });
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  say("Copied.");
}

// -- events -------------------------------------------------------------------------

function onMessageAction(e) {
  const b = e.target.closest("button[data-action]");
  if (!b) return;
  const art = b.closest("article");
  const msg = conv().messages[parseInt(art.dataset.index, 10)];
  if (b.dataset.action === "copy") copy(msg.content);
  if (b.dataset.action === "regenerate") regenerate(parseInt(art.dataset.index, 10));
  if (b.dataset.action === "tokens") {
    const view = art.querySelector(".token-view");
    view.hidden = !view.hidden;
    b.setAttribute("aria-pressed", String(!view.hidden));
    if (!view.hidden) showTokens(view, Reply.from(msg));
  }
}

function toggle(buttonId, panelId) {
  const panel = $(panelId);
  panel.hidden = !panel.hidden;
  $(buttonId).setAttribute("aria-expanded", String(!panel.hidden));
  if (!panel.hidden) panel.querySelector("select, input, textarea").focus();
}

function closeSidebar() {
  if (!$("sidebar").classList.contains("shown")) return;
  $("sidebar").classList.remove("shown");
  $("toggle-sidebar").setAttribute("aria-expanded", "false");
  $("toggle-sidebar").focus();
}

function wire() {
  $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("composer-input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Escape") return;
    if (state.busy) state.busy.abort();
    else if ($("sidebar").classList.contains("shown")) closeSidebar();
    else if (!$("settings").hidden) toggle("toggle-settings", "settings");
  });
  $("stop").addEventListener("click", () => state.busy && state.busy.abort());
  $("new-chat").addEventListener("click", () => {
    if (state.busy) {
      say("A reply is arriving: stop it first (Esc).");
      return;
    }
    newConv();
    save();
    render();
    $("composer-input").focus();
  });
  $("chat-list").addEventListener("click", (e) => {
    const b = e.target.closest("button");
    if (!b) return;
    if (state.busy) {
      say("A reply is arriving: stop it first (Esc).");
      return;
    }
    if (b.dataset.id) {
      state.active = b.dataset.id;
      closeSidebar();  // phone width: back to the chat
    }
    if (b.dataset.delete) {
      state.convs = state.convs.filter((c) => c.id !== b.dataset.delete);
      if (state.active === b.dataset.delete) state.active = state.convs.length ? state.convs[0].id : null;
    }
    save();
    render();
  });
  $("messages").addEventListener("click", onMessageAction);
  $("toggle-settings").addEventListener("click", () => toggle("toggle-settings", "settings"));
  $("close-settings").addEventListener("click", () => {
    toggle("toggle-settings", "settings");
    $("toggle-settings").focus();
  });
  $("close-sidebar").addEventListener("click", closeSidebar);
  $("toggle-sidebar").addEventListener("click", () => {
    const shown = $("sidebar").classList.toggle("shown");
    $("toggle-sidebar").setAttribute("aria-expanded", String(shown));
  });
  $("settings").addEventListener("input", () => {
    if (checkCustom()) localStorage.setItem(SETTINGS, JSON.stringify(settings()));
    if (state.props) showCard(state.props);
  });
  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    state.key = $("key-input").value.trim();
    sessionStorage.setItem(KEY, state.key);
    connect();
  });
  $("forget-key").addEventListener("click", () => {
    state.key = "";
    sessionStorage.removeItem(KEY);
    say("The API key is forgotten.");
  });
}

function start() {
  const stored = read(localStorage, STORE, {});
  state.convs = Array.isArray(stored.convs) ? stored.convs : [];
  state.active = stored.active || (state.convs[0] && state.convs[0].id) || null;
  if (!conv()) newConv();
  wire();
  render();
  connect();
}

start();
