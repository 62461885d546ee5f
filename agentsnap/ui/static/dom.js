// DOM helpers and formatting shared by every view.

/** An element; `attrs` are properties or attributes, children are nodes or text. */
export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  if (attrs) {
    for (const [key, value] of Object.entries(attrs)) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = String(value);
      else if (key === "dataset") Object.assign(node.dataset, value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else if (key === "value" || key === "checked" || key === "disabled" || key === "selected")
        node[key] = value;
      else node.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** Append children (nodes or text; null, undefined and false are skipped) to `node`. */
export function put(node, ...children) {
  return append(node, children);
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

export function link(href, text, cls) {
  return el("a", { href, class: cls, text });
}

export const enc = encodeURIComponent;

export function shortId(id) {
  return id ? String(id).slice(0, 8) : "-";
}

export function fmtTime(us) {
  if (us === null || us === undefined) return "-";
  const d = new Date(us / 1000);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return (
    `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.` +
    `${pad(d.getMilliseconds(), 3)}`
  );
}

export function fmtSpan(us) {
  const a = Math.abs(us);
  if (a >= 60e6) return `${(us / 60e6).toPrecision(3)} min`;
  if (a >= 1e6) return `${(us / 1e6).toPrecision(3)} s`;
  if (a >= 1e3) return `${(us / 1e3).toPrecision(3)} ms`;
  return `${Math.round(us)} µs`;
}

// A value as JSON, so that a string shows its quotes: "" is seen, not an empty cell.
export function excerptJson(value, limit = 160) {
  return excerpt(JSON.stringify(value) ?? "undefined", limit);
}

export function excerpt(value, limit = 160) {
  let text;
  try {
    text = typeof value === "string" ? value : JSON.stringify(value);
  } catch {
    text = String(value);
  }
  if (text === undefined) text = "undefined";
  return text.length <= limit ? text : text.slice(0, limit - 1) + "…";
}

export function setStatus(text, isError) {
  const node = document.getElementById("status");
  if (!node) return;
  node.textContent = text || "";
  node.classList.toggle("error", Boolean(isError));
}
