// How a message looks: its text (Markdown, each character coloured by the token that
// made it), the reply's tokens one by one, its speculation figures and per-pass chart.
// Every node is built with createElement and textContent: no markup from the model.

import { renderMarkdown, plainText } from "./markdown.js";

const SVG = "http://www.w3.org/2000/svg";
const KIND_NAMES = { d: "drafted, accepted", t: "the target's own token" };

export function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function button(label, action, extra) {
  const b = el("button", "small", label);
  b.type = "button";
  b.dataset.action = action;
  if (extra) b.setAttribute("aria-label", extra);
  return b;
}

// Where each token ends in the reply's text (UTF-16 offsets, as JavaScript counts), or
// null when the tokens do not spell the start of the text (a chat template's parser
// took reasoning or tool calls out of it): then the text is shown uncoloured.
function tokenEnds(reply) {
  const ends = new Array(reply.tokens.length);
  let at = 0;
  for (let i = 0; i < reply.tokens.length; i++) {
    at += reply.tokens[i].length;
    ends[i] = at;
  }
  return reply.content.startsWith(reply.tokens.join("")) ? ends : null;
}

// paint() for renderMarkdown: the text split at token boundaries, one span per piece.
function painter(ends, kinds) {
  return (parent, src, start, end) => {
    let lo = 0;
    let hi = ends.length;
    while (lo < hi) {  // the first token that ends after start
      const mid = (lo + hi) >> 1;
      if (ends[mid] > start) hi = mid; else lo = mid + 1;
    }
    let at = start;
    for (let i = lo; at < end; i++) {
      if (i >= ends.length) {  // text whose token has not arrived yet
        plainText(parent, src, at, end);
        return;
      }
      const stop = Math.min(end, ends[i]);
      if (stop > at) parent.append(el("span", "tok " + kinds[i], src.slice(at, stop)));
      at = stop;
    }
  };
}

export function messageNode(msg, index) {
  const art = el("article", "msg " + msg.role);
  art.dataset.index = String(index);
  art.append(el("h2", "role", msg.role === "user" ? "You" : "Reply"));
  if (msg.role === "assistant") {
    const reasoning = el("details", "reasoning");
    reasoning.hidden = true;
    reasoning.append(el("summary", "", "Reasoning"), el("div", "reasoning-text"));
    art.append(reasoning, el("div", "content md"), el("div", "token-view"), el("div", "spec"));
    art.querySelector(".token-view").hidden = true;
    const actions = el("div", "actions");
    actions.append(button("Copy", "copy", "Copy the reply"), button("Tokens", "tokens", "Show the reply's tokens"),
      button("Regenerate", "regenerate", "Regenerate the reply"));
    actions.querySelector("[data-action=tokens]").setAttribute("aria-pressed", "false");
    art.append(actions);
  } else {
    art.append(el("div", "content md"));
    const actions = el("div", "actions");
    actions.append(button("Copy", "copy", "Copy the message"));
    art.append(actions);
  }
  return art;
}

// Chat messages are Markdown; a text completion's prompt and continuation are raw text.
function render(text, raw, paint) {
  if (!raw) return renderMarkdown(text, paint);
  const pre = el("pre", "raw");
  paint(pre, text, 0, text.length);
  return pre;
}

export function showUser(art, msg) {
  art.querySelector(".content").replaceChildren(render(msg.content, msg.mode === "text", plainText));
}

// The reply as it stands; streaming: still arriving. baseline: the target-alone tok/s, or null.
export function showReply(art, reply, streaming, baseline) {
  const ends = tokenEnds(reply);
  const paint = ends ? painter(ends, reply.kinds) : plainText;
  const raw = reply.request && reply.request.mode === "text";
  art.querySelector(".content").replaceChildren(render(reply.content, raw, paint));
  art.classList.toggle("uncoloured", !ends && reply.tokens.length > 0);
  const reasoning = art.querySelector(".reasoning");
  reasoning.hidden = !reply.reasoning;
  reasoning.querySelector(".reasoning-text").textContent = reply.reasoning;
  const view = art.querySelector(".token-view");
  if (!view.hidden) showTokens(view, reply);
  showSpec(art.querySelector(".spec"), reply, streaming, baseline);
  art.setAttribute("aria-busy", streaming ? "true" : "false");
  art.dataset.done = streaming ? "false" : "true";
}

// The reply's tokens, one span each, coloured by kind; hover or focus says its pass.
export function showTokens(view, reply) {
  const frag = document.createDocumentFragment();
  let pass = 1;
  for (let i = 0; i < reply.tokens.length; i++) {
    const kind = reply.kinds[i];
    const span = el("span", "tok " + kind + (reply.tokens[i] ? "" : " empty"), reply.tokens[i]);
    span.title = "pass " + pass + ": " + KIND_NAMES[kind];
    frag.append(span);
    if (kind === "t") pass += 1;
  }
  view.replaceChildren(frag);
}

function fixed(x, digits) {
  return x === null || x === undefined ? "–" : x.toFixed(digits);
}

function stat(dl, name, label, value, text) {
  const div = el("div");
  div.dataset.stat = name;
  const dd = el("dd", "", text);
  if (value !== null && value !== undefined) dd.dataset.value = String(value);
  div.append(el("dt", "", label), dd);
  dl.append(div);
}

function showSpec(box, reply, streaming, baseline) {
  const s = reply.stats();
  const dl = el("dl", "spec-stats");
  stat(dl, "tau", "tau (tokens per target pass)", s.tau, fixed(s.tau, 2));
  stat(dl, "acceptance", "drafts accepted", s.acceptance,
    s.acceptance === null ? "no drafts" : fixed(100 * s.acceptance, 0) + "% of " + s.drafted);
  let speed = s.tps ? fixed(s.tps, 1) + " tok/s" : "–";
  if (s.tps && baseline) speed += " · " + fixed(s.tps / baseline, 2) + "× target alone (" + fixed(baseline, 1) + ")";
  else if (s.tps && !streaming) speed += " · target alone: not measured yet (one reply with draft length 0 measures it)";
  stat(dl, "speed", "speed", s.tps, speed);
  const pinned = reply.request && reply.request.draft_max !== undefined && reply.request.draft_max !== null;
  const chosen = s.draftMaxLast === null ? "–"
    : s.draftMaxLast + " now, " + fixed(s.draftMaxMean, 1) + " mean over drafting passes" + (pinned ? " (pinned)" : " (the policy's)");
  stat(dl, "draft", "draft length", s.draftMaxLast, chosen);
  stat(dl, "tokens", "tokens / passes", s.tokens, s.tokens + " / " + s.passes);
  box.replaceChildren(dl, chart(reply.passes));
}

// Tokens kept per target pass: drafted and accepted (below), the target's own (top),
// and the drafted tokens it rejected (outline above).
function chart(passes) {
  const wrap = el("div", "chart");
  if (!passes.length) return wrap;
  const w = 8;
  const top = Math.max(2, ...passes.map((p) => p.n_drafted + 1));
  const h = 56;
  const unit = h / top;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("width", String(passes.length * w));
  svg.setAttribute("height", String(h));
  svg.setAttribute("viewBox", "0 0 " + passes.length * w + " " + h);
  svg.setAttribute("role", "img");
  const kept = passes.map((p) => p.n_accepted + 1);
  svg.setAttribute("aria-label", "Tokens kept per target pass, " + passes.length + " passes: " +
    Math.min(...kept) + " to " + Math.max(...kept));
  passes.forEach((p, i) => {
    const x = i * w + 0.5;
    const bar = (cls, from, n) => {
      if (n <= 0) return;
      const r = document.createElementNS(SVG, "rect");
      r.setAttribute("class", cls);
      r.setAttribute("x", String(x));
      r.setAttribute("width", String(w - 1));
      r.setAttribute("y", String(h - (from + n) * unit));
      r.setAttribute("height", String(n * unit));
      svg.append(r);
    };
    bar("d", 0, p.n_accepted);
    bar("t", p.n_accepted, 1);
    bar("rej", p.n_accepted + 1, p.n_drafted - p.n_accepted);
  });
  wrap.append(el("span", "chart-label", "tokens kept per target pass"), svg);
  return wrap;
}
