// The page's side of the server's API: /props, and a streamed completion read as
// server-sent events; each chunk folded into the reply it belongs to (Reply).

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function headers(key, json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

async function failure(res) {
  let message = res.status + " " + res.statusText;
  try {
    const body = await res.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch (e) {
    // not JSON: the status line says it
  }
  return new ApiError(res.status, message);
}

export async function getProps(key) {
  const res = await fetch("/props", { headers: headers(key, false) });
  if (!res.ok) throw await failure(res);
  return res.json();
}

// The chunks of one streamed request, as objects; an error event is thrown.
export async function* stream(path, body, key, signal) {
  const res = await fetch(path, { method: "POST", headers: headers(key, true), body: JSON.stringify(body), signal });
  if (!res.ok) throw await failure(res);
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        const obj = JSON.parse(data);
        if (obj.error) throw new ApiError(obj.error.code || 500, obj.error.message || "error");
        yield obj;
      }
    }
  }
}

// One assistant reply as the stream builds it: its text, and per token how it was made
// (the chunks' "speculative": tokens, kinds, passes), the server's timings at the end.
export class Reply {
  constructor(request) {
    this.role = "assistant";
    this.content = "";
    this.reasoning = "";
    this.tokens = [];
    this.kinds = "";
    this.passes = [];
    this.timings = null;
    this.usage = null;
    this.finish = null;
    this.final = false;  // the last chunk (its speculative has the totals) arrived
    this.request = request;  // what it was asked with: draft_max, mode
    this.ttftMs = null;
  }

  add(chunk) {
    const choice = chunk.choices && chunk.choices[0];
    if (choice) {
      const delta = choice.delta || {};
      this.content += (delta.content ?? choice.text) || "";
      this.reasoning += delta.reasoning_content || "";
      if (choice.finish_reason) this.finish = choice.finish_reason;
    }
    const spec = chunk.speculative;
    if (spec && spec.tokens) {
      for (const t of spec.tokens) this.tokens.push(t);
      this.kinds += spec.kinds;
      for (const p of spec.passes) this.passes.push(p);
    }
    if (spec && spec.accepted_lengths) this.final = true;
    if (chunk.timings) this.timings = chunk.timings;
    if (chunk.usage) this.usage = chunk.usage;
  }

  // Figures of the reply from what the stream said of each token and pass.
  stats() {
    const n = this.tokens.length;
    const passes = this.passes.length;
    let drafted = 0;
    let accepted = 0;
    let drafting = 0;
    let draftMaxSum = 0;
    for (const p of this.passes) {
      drafted += p.n_drafted;
      accepted += p.n_accepted;
      if (p.draft_max > 0) {
        drafting += 1;
        draftMaxSum += p.draft_max;
      }
    }
    const last = this.passes.length ? this.passes[this.passes.length - 1].draft_max : null;
    return {
      tokens: n,
      passes,
      tau: passes ? n / passes : null,
      acceptance: drafted ? accepted / drafted : null,
      drafted,
      accepted,
      draftMaxMean: drafting ? draftMaxSum / drafting : 0,
      draftMaxLast: last,
      tps: this.timings ? this.timings.predicted_per_second : null,
    };
  }

  toJSON() {
    const { role, content, reasoning, tokens, kinds, passes, timings, usage, finish, final, request, ttftMs, error } = this;
    return { role, content, reasoning, tokens, kinds, passes, timings, usage, finish, final, request, ttftMs, error };
  }

  static from(obj) {
    return Object.assign(new Reply(obj.request || {}), obj);
  }
}
