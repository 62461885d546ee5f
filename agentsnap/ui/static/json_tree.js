// JSON as a collapsible tree.

import { el } from "./dom.js";

function typeName(value) {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  return typeof value;
}

/**
 * A collapsible tree of `value`. `marks` maps a path (keys joined by "\u0000") to a class
 * name ("added", "removed", "changed") that highlights that node.
 */
export function jsonTree(value, options = {}) {
  const open = options.open ?? 2;
  const marks = options.marks || new Map();
  const root = el("div", { class: "json" });
  root.appendChild(jsonNode(null, value, [], 0, open, marks));
  return root;
}

function jsonNode(key, value, path, depth, open, marks) {
  const mark = marks.get(path.join("\u0000"));
  const kind = typeName(value);
  const label = key === null ? null : el("span", { class: "key", text: key });
  if (kind === "object" || kind === "array") {
    const entries = kind === "array" ? value.map((v, i) => [i, v]) : Object.entries(value);
    const size = kind === "array" ? `[${entries.length}]` : `{${entries.length}}`;
    const details = el("details", { class: `node ${mark || ""}`.trim() });
    if (depth < open || mark || hasMarkBelow(path, marks)) details.open = true;
    details.appendChild(
      el("summary", null, label, label ? ": " : null, el("span", { class: "size", text: size })),
    );
    const list = el("div", { class: "children" });
    for (const [k, v] of entries) {
      list.appendChild(jsonNode(String(k), v, [...path, String(k)], depth + 1, open, marks));
    }
    if (!entries.length) list.appendChild(el("span", { class: "muted", text: "empty" }));
    details.appendChild(list);
    return details;
  }
  const text = kind === "string" ? JSON.stringify(value) : String(value);
  return el(
    "div",
    { class: `leaf ${mark || ""}`.trim() },
    label,
    label ? ": " : null,
    el("span", { class: `v-${kind}`, text }),
  );
}

function hasMarkBelow(path, marks) {
  const prefix = path.join("\u0000");
  for (const key of marks.keys()) {
    if (key.length > prefix.length && (prefix === "" || key.startsWith(prefix + "\u0000")))
      return true;
  }
  return false;
}
