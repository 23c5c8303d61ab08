// A small Markdown renderer that builds DOM nodes and never parses model output as HTML:
// every character of the text reaches the page through a text node (textContent), links
// only keep http(s) and mailto targets. Each piece of text keeps its place in the source,
// so the caller can colour it by the token that made it (paint).

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$/;
const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const ITEM = /^( {0,3})([-*+]|\d{1,9}[.)])[ \t]+/;
const QUOTE = /^ {0,3}> ?/;
const SAFE_URL = /^(https?:\/\/|mailto:)/i;

function el(tag, cls) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  return node;
}

// The source split in lines, each with the offset of its first character.
function lines(src) {
  const out = [];
  let at = 0;
  for (const text of src.split("\n")) {
    out.push({ text, at });
    at += text.length + 1;
  }
  return out;
}

// Render src into a DocumentFragment. paint(parent, src, start, end) appends the text
// src[start, end) to parent (plain text nodes, or coloured spans).
export function renderMarkdown(src, paint = plainText) {
  const frag = document.createDocumentFragment();
  const ls = lines(src);
  const ctx = { src, paint };
  let i = 0;
  while (i < ls.length) {
    i = block(frag, ls, i, ctx);
  }
  return frag;
}

export function plainText(parent, src, start, end) {
  if (end > start) parent.append(document.createTextNode(src.slice(start, end)));
}

function block(parent, ls, i, ctx) {
  const line = ls[i].text;
  if (!line.trim()) return i + 1;
  let m;
  if ((m = FENCE.exec(line))) return fence(parent, ls, i, m, ctx);
  if ((m = HEADING.exec(line))) {
    const h = el("h" + Math.min(m[1].length + 2, 6), "md-h");
    const start = ls[i].at + line.indexOf(m[2], m[1].length);
    inline(h, start, start + m[2].length, ctx);
    parent.append(h);
    return i + 1;
  }
  if (RULE.test(line)) {
    parent.append(el("hr"));
    return i + 1;
  }
  if (QUOTE.test(line)) return quote(parent, ls, i, ctx);
  if (ITEM.test(line)) return list(parent, ls, i, ctx);
  return paragraph(parent, ls, i, ctx);
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
}

function fence(parent, ls, i, m, ctx) {
  const mark = m[1];
  const pre = el("pre", "md-code");
  if (m[2]) {
    pre.dataset.lang = m[2];
    const cap = el("span", "md-lang");
    cap.textContent = m[2];
    pre.append(cap);
  }
  const code = el("code");
  pre.append(code);
  parent.append(pre);
  const closing = new RegExp("^ {0,3}\\" + mark[0] + "{" + mark.length + ",}[ \\t]*$");
  let j = i + 1;
  while (j < ls.length && !closing.test(ls[j].text)) j++;
  // an open fence (a reply still streaming) runs to the end
  const start = i + 1 < ls.length ? ls[i + 1].at : ctx.src.length;
  const end = j < ls.length ? ls[j].at - 1 : ctx.src.length;
  if (end > start) ctx.paint(code, ctx.src, start, end);
  return j + 1;
}

function quote(parent, ls, i, ctx) {
  const q = el("blockquote");
  let first = true;
  while (i < ls.length && QUOTE.test(ls[i].text)) {
    const skip = QUOTE.exec(ls[i].text)[0].length;
    if (!first) q.append(el("br"));
    inline(q, ls[i].at + skip, ls[i].at + ls[i].text.length, ctx);
    first = false;
    i++;
  }
  parent.append(q);
  return i;
}

function list(parent, ls, i, ctx) {
  const ordered = /\d/.test(ITEM.exec(ls[i].text)[2]);
  const node = el(ordered ? "ol" : "ul");
  if (ordered) node.start = parseInt(ITEM.exec(ls[i].text)[2], 10) || 1;
  let li = null;
  while (i < ls.length) {
    const text = ls[i].text;
    const m = ITEM.exec(text);
    if (m && /\d/.test(m[2]) === ordered) {
      li = el("li");
      node.append(li);
      inline(li, ls[i].at + m[0].length, ls[i].at + text.length, ctx);
    } else if (li && text.trim() && /^\s/.test(text) && !startsBlock(text)) {
      li.append(el("br"));  // a continuation line of the item
      const lead = text.length - text.trimStart().length;
      inline(li, ls[i].at + lead, ls[i].at + text.length, ctx);
    } else {
      break;
    }
    i++;
  }
  parent.append(node);
  return i;
}

function paragraph(parent, ls, i, ctx) {
  const p = el("p");
  let first = true;
  while (i < ls.length && ls[i].text.trim() && (first || !startsBlock(ls[i].text))) {
    if (!first) p.append(el("br"));
    inline(p, ls[i].at, ls[i].at + ls[i].text.length, ctx);
    first = false;
    i++;
  }
  parent.append(p);
  return i;
}

// Inline spans of src[start, end): `code`, **strong**, *em*, _em_, ~~del~~, [text](url).
const PAIRS = [["**", "strong"], ["__", "strong"], ["~~", "del"], ["*", "em"], ["_", "em"]];

function inline(parent, start, end, ctx) {
  const src = ctx.src;
  let text = start;  // the start of the plain text not yet appended
  let k = start;
  while (k < end) {
    const made = span(parent, k, end, ctx, text);
    if (made > 0) {
      text = k = made;
    } else {
      k++;
    }
  }
  ctx.paint(parent, src, text, end);
}

// A span that begins at k: appends the plain text [text, k), then the element, and
// returns the offset after it; 0 when none begins at k.
function span(parent, k, end, ctx, text) {
  const src = ctx.src;
  const c = src[k];
  if (!"`[*_~".includes(c)) return 0;
  if (c === "`") {
    const run = /^`+/.exec(src.slice(k, end))[0];
    const close = src.indexOf(run, k + run.length);
    if (close < 0 || close + run.length > end) return 0;
    ctx.paint(parent, src, text, k);
    const code = el("code");
    ctx.paint(code, src, k + run.length, close);
    parent.append(code);
    return close + run.length;
  }
  if (c === "[") return link(parent, k, end, ctx, text);
  for (const [mark, tag] of PAIRS) {
    if (!src.startsWith(mark, k) || /\s/.test(src[k + mark.length] || " ")) continue;
    if (mark[0] === "_" && k > 0 && /\w/.test(src[k - 1])) continue;  // snake_case is not emphasis
    const close = src.indexOf(mark, k + mark.length + 1);
    if (close < 0 || close + mark.length > end || /\s/.test(src[close - 1])) continue;
    if (mark[0] === "_" && /\w/.test(src[close + mark.length] || " ")) continue;
    ctx.paint(parent, src, text, k);
    const node = el(tag);
    inline(node, k + mark.length, close, ctx);
    parent.append(node);
    return close + mark.length;
  }
  return 0;
}

function link(parent, k, end, ctx, text) {
  const src = ctx.src;
  const mid = src.indexOf("](", k);
  if (mid < 0 || mid >= end) return 0;
  const close = src.indexOf(")", mid + 2);
  if (close < 0 || close >= end || src.slice(k + 1, mid).includes("\n")) return 0;
  const url = src.slice(mid + 2, close).trim();
  if (!SAFE_URL.test(url) || /\s/.test(url)) return 0;
  ctx.paint(parent, src, text, k);
  const a = el("a");
  a.href = url;  // an attribute, set as a string: no markup is parsed
  a.rel = "noopener noreferrer nofollow";
  a.target = "_blank";
  inline(a, k + 1, mid, ctx);
  parent.append(a);
  return close + 1;
}
