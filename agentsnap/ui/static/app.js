// agentsnap inspector: a single page over the inspector's JSON API, and the drawing code of
// the space-time view that `agentsnap timeline RUN -o run.html` embeds with a run's data.
//
// Plain ES module, no build step. Every piece of text that comes from a run (agent names,
// run names, payloads, reasons) is inserted with textContent, createTextNode or canvas
// fillText: never as HTML.

"use strict";

// --- DOM helpers ----------------------------------------------------------------------------

/** An element; `attrs` are properties or attributes, children are nodes or text. */
function el(tag, attrs, ...children) {
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
function put(node, ...children) {
  return append(node, children);
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

function link(href, text, cls) {
  return el("a", { href, class: cls, text });
}

const enc = encodeURIComponent;

function shortId(id) {
  return id ? String(id).slice(0, 8) : "-";
}

function fmtTime(us) {
  if (us === null || us === undefined) return "-";
  const d = new Date(us / 1000);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return (
    `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.` +
    `${pad(d.getMilliseconds(), 3)}`
  );
}

function fmtSpan(us) {
  const a = Math.abs(us);
  if (a >= 60e6) return `${(us / 60e6).toPrecision(3)} min`;
  if (a >= 1e6) return `${(us / 1e6).toPrecision(3)} s`;
  if (a >= 1e3) return `${(us / 1e3).toPrecision(3)} ms`;
  return `${Math.round(us)} µs`;
}

// A value as JSON, so that a string shows its quotes: "" is seen, not an empty cell.
function excerptJson(value, limit = 160) {
  return excerpt(JSON.stringify(value) ?? "undefined", limit);
}

function excerpt(value, limit = 160) {
  let text;
  try {
    text = typeof value === "string" ? value : JSON.stringify(value);
  } catch {
    text = String(value);
  }
  if (text === undefined) text = "undefined";
  return text.length <= limit ? text : text.slice(0, limit - 1) + "…";
}

function setStatus(text, isError) {
  const node = document.getElementById("status");
  if (!node) return;
  node.textContent = text || "";
  node.classList.toggle("error", Boolean(isError));
}

// --- The API --------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error) || `the server answered ${status}`);
    this.status = status;
    this.body = body || {};
  }
}

async function api(path, options = {}) {
  const init = { signal: options.signal, method: options.method || "GET", headers: {} };
  // Every write carries the server's token (see actions): another site's page cannot.
  if (init.method !== "GET" && actionToken()) init.headers["x-agentsnap-token"] = actionToken();
  if (options.body !== undefined) {
    init.body = JSON.stringify(options.body);
    init.headers["content-type"] = "application/json";
  }
  const response = await fetch(path, init);
  let body = null;
  const text = await response.text();
  if (text) {
    try {
      body = JSON.parse(text);
    } catch {
      body = { error: text.slice(0, 300) };
    }
  }
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

function query(params) {
  const parts = [];
  for (const [key, value] of Object.entries(params)) {
    if (value === undefined || value === null || value === "") continue;
    parts.push(`${enc(key)}=${enc(value)}`);
  }
  return parts.length ? `?${parts.join("&")}` : "";
}

function runPath(runId) {
  return `/api/runs/${enc(runId)}`;
}

// --- JSON as a collapsible tree -------------------------------------------------------------

function typeName(value) {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  return typeof value;
}

/**
 * A collapsible tree of `value`. `marks` maps a path (keys joined by "\u0000") to a class
 * name ("added", "removed", "changed") that highlights that node.
 */
function jsonTree(value, options = {}) {
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

// --- A JSON-schema validator for what pydantic emits ---------------------------------------

/** Problems of `value` against `schema`: [{path, message}], empty when it validates. */
function validateSchema(schema, value) {
  const problems = [];
  checkSchema(schema, value, "$", schema, problems, 0);
  return problems;
}

function resolveRef(ref, root) {
  if (!ref.startsWith("#/")) return undefined;
  let node = root;
  for (const part of ref.slice(2).split("/")) {
    const key = part.replace(/~1/g, "/").replace(/~0/g, "~");
    if (node === null || typeof node !== "object" || !(key in node)) return undefined;
    node = node[key];
  }
  return node;
}

function jsonType(value) {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  if (typeof value === "number") return Number.isInteger(value) ? "integer" : "number";
  return typeof value;
}

function deepEqual(a, b) {
  return JSON.stringify(canonical(a)) === JSON.stringify(canonical(b));
}

function canonical(value) {
  if (Array.isArray(value)) return value.map(canonical);
  if (value && typeof value === "object") {
    const out = {};
    for (const key of Object.keys(value).sort()) out[key] = canonical(value[key]);
    return out;
  }
  return value;
}

function childPath(path, key) {
  return typeof key === "number"
    ? `${path}[${key}]`
    : /^[A-Za-z_][A-Za-z0-9_]*$/.test(key)
      ? `${path}.${key}`
      : `${path}[${JSON.stringify(key)}]`;
}

function checkSchema(schema, value, path, root, problems, depth) {
  if (schema === true || schema === undefined || schema === null) return;
  if (schema === false) {
    problems.push({ path, message: "no value is allowed here" });
    return;
  }
  if (depth > 64) return;
  if (schema.$ref) {
    const target = resolveRef(schema.$ref, root);
    if (target === undefined) problems.push({ path, message: `unknown $ref ${schema.$ref}` });
    else checkSchema(target, value, path, root, problems, depth + 1);
  }
  for (const sub of schema.allOf || []) checkSchema(sub, value, path, root, problems, depth + 1);
  for (const [word, need] of [["anyOf", "any"], ["oneOf", "one"]]) {
    const options = schema[word];
    if (!options) continue;
    const results = options.map((sub) => {
      const found = [];
      checkSchema(sub, value, path, root, found, depth + 1);
      return found;
    });
    const passing = results.filter((r) => r.length === 0).length;
    if (need === "any" && passing === 0) {
      const best = results.reduce((a, b) => (b.length < a.length ? b : a));
      problems.push(...(options.length === 1 ? best : [{ path, message: describeOptions(options, root, best) }]));
    } else if (need === "one" && passing !== 1) {
      problems.push({ path, message: `must match exactly one of ${options.length} schemas (matches ${passing})` });
    }
  }
  if ("const" in schema && !deepEqual(schema.const, value))
    problems.push({ path, message: `must be ${JSON.stringify(schema.const)}` });
  if (schema.enum && !schema.enum.some((option) => deepEqual(option, value)))
    problems.push({ path, message: `must be one of ${schema.enum.map((v) => JSON.stringify(v)).join(", ")}` });
  const actual = jsonType(value);
  if (schema.type) {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type];
    const ok = types.some((t) => t === actual || (t === "number" && actual === "integer"));
    if (!ok) {
      problems.push({ path, message: `must be ${types.join(" or ")}, not ${actual}` });
      return;
    }
  }
  if (actual === "object") {
    const properties = schema.properties || {};
    for (const name of schema.required || []) {
      if (!(name in value)) problems.push({ path, message: `${JSON.stringify(name)} is required` });
    }
    for (const [name, item] of Object.entries(value)) {
      if (name in properties) {
        checkSchema(properties[name], item, childPath(path, name), root, problems, depth + 1);
      } else if (schema.additionalProperties === false) {
        problems.push({ path: childPath(path, name), message: "is not an allowed field" });
      } else if (schema.additionalProperties && typeof schema.additionalProperties === "object") {
        checkSchema(schema.additionalProperties, item, childPath(path, name), root, problems, depth + 1);
      }
    }
  } else if (actual === "array") {
    const prefix = schema.prefixItems || [];
    value.forEach((item, i) => {
      const sub = i < prefix.length ? prefix[i] : schema.items;
      if (sub !== undefined) checkSchema(sub, item, childPath(path, i), root, problems, depth + 1);
    });
    if (schema.minItems !== undefined && value.length < schema.minItems)
      problems.push({ path, message: `must have at least ${schema.minItems} item(s)` });
    if (schema.maxItems !== undefined && value.length > schema.maxItems)
      problems.push({ path, message: `must have at most ${schema.maxItems} item(s)` });
  } else if (actual === "string") {
    const length = [...value].length;
    if (schema.minLength !== undefined && length < schema.minLength)
      problems.push({ path, message: `must be at least ${schema.minLength} character(s) long` });
    if (schema.maxLength !== undefined && length > schema.maxLength)
      problems.push({ path, message: `must be at most ${schema.maxLength} character(s) long` });
    if (schema.pattern !== undefined) {
      let re = null;
      try {
        re = new RegExp(schema.pattern, "u");
      } catch {
        re = null;
      }
      if (re && !re.test(value)) problems.push({ path, message: `must match ${schema.pattern}` });
    }
  } else if (actual === "number" || actual === "integer") {
    if (schema.minimum !== undefined && value < schema.minimum)
      problems.push({ path, message: `must be at least ${schema.minimum}` });
    if (schema.maximum !== undefined && value > schema.maximum)
      problems.push({ path, message: `must be at most ${schema.maximum}` });
    if (schema.exclusiveMinimum !== undefined && value <= schema.exclusiveMinimum)
      problems.push({ path, message: `must be more than ${schema.exclusiveMinimum}` });
    if (schema.exclusiveMaximum !== undefined && value >= schema.exclusiveMaximum)
      problems.push({ path, message: `must be less than ${schema.exclusiveMaximum}` });
    if (schema.multipleOf && Math.abs(value / schema.multipleOf - Math.round(value / schema.multipleOf)) > 1e-9)
      problems.push({ path, message: `must be a multiple of ${schema.multipleOf}` });
  }
}

function describeOptions(options, root, best) {
  const names = options.map((option) => {
    const target = option.$ref ? resolveRef(option.$ref, root) : option;
    return (target && (target.title || target.type)) || "schema";
  });
  const hint = best.length ? ` (closest: ${best[0].path} ${best[0].message})` : "";
  return `must be one of: ${names.join(", ")}${hint}`;
}

// --- Data for the space-time view ------------------------------------------------------------

const EXACT_LIMIT = 5000;
const DENSITY_BINS = 240;

/** Window data from the server: debounced by the view, stale requests aborted, tiles cached. */
class ServerSource {
  constructor(runId) {
    this.runId = runId;
    this.cache = new Map();
  }

  async window(axis, from, to, signal) {
    const key = `${axis}|${from}|${to}`;
    if (this.cache.has(key)) {
      const hit = this.cache.get(key);
      this.cache.delete(key);
      this.cache.set(key, hit);
      return hit;
    }
    const base = runPath(this.runId);
    const range = { axis, from: Math.floor(from), to: Math.ceil(to) };
    const [messages, events] = await Promise.all([
      api(`${base}/messages${query({ ...range, limit: EXACT_LIMIT })}`, { signal }),
      api(`${base}/events${query(range)}`, { signal }),
    ]);
    const data = { axis, from, to, messages, events };
    this.cache.set(key, data);
    while (this.cache.size > 48) this.cache.delete(this.cache.keys().next().value);
    return data;
  }

  async message(src, dst, seq) {
    return api(`${runPath(this.runId)}/messages/${enc(src)}/${enc(dst)}/${enc(seq)}`);
  }
}

/**
 * Window data from a run embedded in the page (the static export). The same answers as the
 * server: exact messages when few enough touch the window, else per-channel counts per bin.
 */
class EmbeddedSource {
  constructor(data) {
    this.data = data;
    const names = data.names;
    const rows = data.messages.rows;
    const excerpts = data.messages.payloads || [];
    this.messages = rows.map((r, i) => ({
      src: names[r[0]],
      dst: names[r[1]],
      seq: r[2],
      kind: data.messages.kinds[r[3]],
      epoch: r[4],
      sent_us: r[5],
      delivered_us: r[6],
      sent_lc: r[7],
      delivered_lc: r[8],
      discarded: Boolean(r[9]),
      payload_excerpt: excerpts[i],
    }));
  }

  async window(axis, from, to) {
    const lamport = axis === "lamport";
    const touching = [];
    for (const m of this.messages) {
      const start = lamport ? m.sent_lc : m.sent_us;
      const endRaw = lamport ? m.delivered_lc : m.delivered_us;
      const end = endRaw === null || endRaw === undefined ? start : endRaw;
      if (end >= from && start <= to) touching.push(m);
    }
    let messages;
    if (touching.length <= EXACT_LIMIT) {
      messages = { mode: "exact", messages: touching };
    } else {
      const channels = new Map();
      const width = (to - from) / DENSITY_BINS || 1;
      for (const m of touching) {
        const start = lamport ? m.sent_lc : m.sent_us;
        if (start < from || start > to) continue;
        const key = `${m.src}\u0000${m.dst}`;
        let channel = channels.get(key);
        if (!channel) {
          channel = { src: m.src, dst: m.dst, counts: new Array(DENSITY_BINS).fill(0) };
          channels.set(key, channel);
        }
        channel.counts[Math.min(DENSITY_BINS - 1, Math.floor((start - from) / width))] += 1;
      }
      messages = { mode: "density", from, to, bins: DENSITY_BINS, channels: [...channels.values()] };
    }
    const at = (event) => (lamport ? event.lc : event.at_us);
    const events = {
      rollbacks: this.data.events.rollbacks.filter((e) => at(e) >= from && at(e) <= to),
      tool_calls: this.data.events.tool_calls.filter((e) => at(e) >= from && at(e) <= to),
    };
    return { axis, from, to, messages, events };
  }

  async message(src, dst, seq) {
    const found = this.messages.find((m) => m.src === src && m.dst === dst && m.seq === Number(seq));
    return found ? { ...found, payload: found.payload_excerpt } : null;
  }
}

// --- The space-time view --------------------------------------------------------------------

const LANE = 30;
const TOP = 58; // room for the cuts' labels (two rows) and the rollbacks' (one row)
const CUT_LABEL_ROWS = [TOP - 30, TOP - 43]; // baselines, tried in this order
const ROLLBACK_LABEL_ROW = TOP - 17;

/**
 * Where labels go on a row of the canvas without overlapping: each placed label keeps its
 * horizontal span; a label that fits on no row is left out (the hit area and the tooltip
 * still tell what is there).
 */
class LabelRows {
  constructor(ctx, width, rows) {
    this.ctx = ctx;
    this.width = width;
    this.rows = rows.map((y) => ({ y, spans: [] }));
  }

  /** Place ``text`` near ``x`` (centred, or after it for ``"left"``); its baseline, or null. */
  place(text, x, align = "center") {
    const w = this.ctx.measureText(text).width + 6;
    let from = align === "left" ? x + 3 : x - w / 2;
    // Kept whole inside the canvas: a label near the right edge goes to the left of x.
    if (from + w > this.width) from = align === "left" ? x - 3 - w : this.width - w;
    if (from < 0) from = 0;
    for (const row of this.rows) {
      if (row.spans.some(([a, b]) => from < b && a < from + w)) continue;
      row.spans.push([from, from + w]);
      this.ctx.textAlign = "left";
      this.ctx.fillText(text, from + 3, row.y);
      return row.y;
    }
    return null;
  }
}
const BOTTOM = 30; // room for the time axis
const PAD = 16;
const STATUS_COLOURS = {
  succeeded: "#2a8a3e",
  ok: "#2a8a3e",
  done: "#2a8a3e",
  completed: "#2a8a3e",
  replayed: "#5a9",
  failed: "#c33",
  error: "#c33",
  unknown: "#e08a00",
  in_progress: "#888",
  retryable: "#c80",
  abandoned: "#999",
  compensating: "#a6a",
  cancelled: "#999",
  interrupted: "#c80",
};

function niceStep(rough) {
  const power = 10 ** Math.floor(Math.log10(rough));
  for (const m of [1, 2, 5, 10]) if (m * power >= rough) return m * power;
  return 10 * power;
}

function groupOf(name) {
  const match = /^(.+?)[._:/-]/.exec(name);
  return match ? match[1] : null;
}

/**
 * One lane per agent, messages as arrows from (sender, send time) to (receiver, delivery
 * time), cuts as polylines, rollbacks and tool calls as marks; zoom, pan, wall or Lamport axis.
 */
class SpaceTime {
  constructor(options) {
    this.run = options.run;
    this.source = options.source;
    this.snapshots = options.snapshots || [];
    this.onCut = options.onCut || (() => {});
    this.onAgent = options.onAgent || (() => {});
    this.onMessage = options.onMessage || (() => {});
    this.axis = "wall";
    this.sort = "name";
    this.grouped = false;
    this.collapsed = new Set();
    this.agents = [...(this.run.agents || [])];
    this.activity = new Map();
    this.data = null; // the window data drawn
    this.pending = null;
    this.timer = 0;
    this.frame = 0;
    this.hover = null;
    this.stats = { draws: 0, lastDrawMs: 0, firstDataDrawAt: null, fetches: 0 };
    this.frameWaiters = [];
    this.build();
    this.reset(false);
  }

  // The full extent of the run on the current axis.
  extent() {
    if (this.axis === "lamport") return [0, Math.max(1, this.run.lamport_max || 1)];
    const start = this.run.start_us ?? this.run.created_at_us ?? 0;
    const end = Math.max(this.run.end_us ?? start, start + 1000);
    return [start, end];
  }

  build() {
    const axisButtons = ["wall", "lamport"].map((axis) =>
      el("button", {
        type: "button",
        class: "axis-btn",
        dataset: { axis },
        text: axis === "wall" ? "Wall clock" : "Lamport",
        onclick: () => this.setAxis(axis),
      }),
    );
    this.axisButtons = axisButtons;
    this.sortSelect = el(
      "select",
      { "aria-label": "Sort lanes", onchange: () => { this.sort = this.sortSelect.value; this.layout(); } },
      el("option", { value: "name", text: "sort: name" }),
      el("option", { value: "activity", text: "sort: activity" }),
      el("option", { value: "name-desc", text: "sort: name, reversed" }),
    );
    this.groupBox = el("input", {
      type: "checkbox",
      onchange: () => { this.grouped = this.groupBox.checked; this.layout(); },
    });
    this.info = el("span", { class: "st-info" });
    const toolbar = el(
      "div",
      { class: "st-toolbar" },
      axisButtons,
      this.sortSelect,
      el("label", { class: "inline" }, this.groupBox, " group by name prefix"),
      el("button", { type: "button", text: "−", title: "Zoom out (-)", onclick: () => this.zoomBy(1.6) }),
      el("button", { type: "button", text: "+", title: "Zoom in (+)", onclick: () => this.zoomBy(1 / 1.6) }),
      el("button", { type: "button", text: "Reset", title: "Whole run (0)", onclick: () => this.reset() }),
      this.info,
    );
    this.labels = el("div", { class: "st-labels" });
    this.canvas = el("canvas", {
      class: "st-canvas",
      tabindex: "0",
      "aria-label": "Space-time diagram: wheel or +/- to zoom, drag or arrows to pan, 0 to reset",
    });
    this.tip = el("div", { class: "st-tip", hidden: true });
    this.plot = el("div", { class: "st-plot" }, this.canvas, this.tip);
    this.legend = el(
      "div",
      { class: "st-legend" },
      el("span", { class: "lg msg" }, "message"),
      el("span", { class: "lg discarded" }, "discarded by a rollback"),
      el("span", { class: "lg cut" }, "snapshot cut"),
      el("span", { class: "lg rollback" }, "rollback"),
      el("span", { class: "lg tool" }, "tool call (colour: status)"),
    );
    this.root = el(
      "div",
      { class: "spacetime" },
      toolbar,
      el("div", { class: "st-body" }, this.labels, this.plot),
      this.legend,
    );
    this.bindInput();
    if (typeof ResizeObserver !== "undefined") {
      this.resizer = new ResizeObserver(() => this.invalidate());
      this.resizer.observe(this.plot);
    }
    this.layout();
  }

  // --- lanes ---

  /** Show only these agents' lanes (``null``: every agent), as the topology asks. */
  focus(names) {
    this.only = names && names.length ? new Set(names) : null;
    this.root.dataset.focus = this.only ? [...this.only].sort().join(",") : "";
    this.layout();
  }

  rowsFor() {
    const agents = this.only ? this.agents.filter((name) => this.only.has(name)) : [...this.agents];
    const count = (name) => this.activity.get(name) || 0;
    if (this.sort === "activity") agents.sort((a, b) => count(b) - count(a) || (a < b ? -1 : 1));
    else agents.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    if (this.sort === "name-desc") agents.reverse();
    if (!this.grouped) return agents.map((name) => ({ kind: "agent", name, members: [name] }));
    const groups = new Map();
    for (const name of agents) {
      const prefix = groupOf(name);
      const key = prefix === null ? `\u0000${name}` : prefix;
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(name);
    }
    const rows = [];
    for (const [key, members] of groups) {
      if (key.startsWith("\u0000") || members.length < 2) {
        for (const name of members) rows.push({ kind: "agent", name, members: [name] });
      } else if (this.collapsed.has(key)) {
        rows.push({ kind: "group", name: key, members, collapsed: true });
      } else {
        rows.push({ kind: "group", name: key, members, collapsed: false, header: true });
        for (const name of members) rows.push({ kind: "agent", name, members: [name], inGroup: key });
      }
    }
    return rows;
  }

  layout() {
    this.rows = this.rowsFor();
    this.laneOf = new Map();
    this.rows.forEach((row, i) => {
      if (row.kind === "group" && !row.collapsed) return;
      for (const name of row.members) this.laneOf.set(name, i);
    });
    clear(this.labels);
    this.labels.style.paddingTop = `${TOP - LANE / 2}px`;
    for (const row of this.rows) {
      let node;
      if (row.kind === "group") {
        node = el(
          "button",
          {
            type: "button",
            class: "lane-label group",
            title: `${row.collapsed ? "Expand" : "Collapse"} ${row.members.length} agents`,
            dataset: { group: row.name },
            onclick: () => {
              if (this.collapsed.has(row.name)) this.collapsed.delete(row.name);
              else this.collapsed.add(row.name);
              this.layout();
            },
          },
          `${row.collapsed ? "▸" : "▾"} ${row.name}* (${row.members.length})`,
        );
      } else {
        node = el("button", {
          type: "button",
          class: `lane-label${row.inGroup ? " in-group" : ""}`,
          title: `${row.name}: history across snapshots`,
          dataset: { agent: row.name },
          text: row.name,
          onclick: () => this.onAgent(row.name),
        });
      }
      node.style.height = `${LANE}px`;
      this.labels.appendChild(node);
    }
    this.invalidate();
  }

  ensureAgents(names) {
    let added = false;
    for (const name of names) {
      if (!this.agents.includes(name)) {
        this.agents.push(name);
        added = true;
      }
    }
    if (added) this.layout();
  }

  laneY(name) {
    const index = this.laneOf.get(name);
    return index === undefined ? null : TOP + index * LANE;
  }

  // --- view ---

  get width() {
    return Math.max(200, this.plot.clientWidth || 800);
  }

  get height() {
    return TOP + Math.max(1, this.rows.length) * LANE + BOTTOM - LANE / 2;
  }

  x(t) {
    if (this.fold && this.axis === "wall") {
      // Long idle gaps folded (views/incidents.js): the axis is piecewise linear.
      const from = this.fold.u(this.view.from);
      return PAD + ((this.fold.u(t) - from) / (this.fold.u(this.view.to) - from)) * (this.width - 2 * PAD);
    }
    return PAD + ((t - this.view.from) / (this.view.to - this.view.from)) * (this.width - 2 * PAD);
  }

  t(x) {
    if (this.fold && this.axis === "wall") {
      const from = this.fold.u(this.view.from);
      return this.fold.t(from + ((x - PAD) / (this.width - 2 * PAD)) * (this.fold.u(this.view.to) - from));
    }
    return this.view.from + ((x - PAD) / (this.width - 2 * PAD)) * (this.view.to - this.view.from);
  }

  reset(fetchNow = true) {
    const [start, end] = this.extent();
    const margin = (end - start) * 0.02;
    this.view = { from: start - margin, to: end + margin };
    this.changed(fetchNow);
  }

  setAxis(axis) {
    if (axis === this.axis) return;
    // Keep roughly the same part of the run in view: map the window's ends proportionally.
    const [oldStart, oldEnd] = this.extent();
    const f0 = (this.view.from - oldStart) / (oldEnd - oldStart);
    const f1 = (this.view.to - oldStart) / (oldEnd - oldStart);
    this.axis = axis;
    const [start, end] = this.extent();
    this.view = { from: start + f0 * (end - start), to: start + f1 * (end - start) };
    this.data = null;
    this.changed(true);
  }

  minSpan() {
    return this.axis === "lamport" ? 4 : 20;
  }

  zoomBy(factor, anchorX) {
    const anchor = anchorX === undefined ? (this.view.from + this.view.to) / 2 : this.t(anchorX);
    const [start, end] = this.extent();
    const maxSpan = (end - start) * 4;
    let span = (this.view.to - this.view.from) * factor;
    span = Math.min(Math.max(span, this.minSpan()), maxSpan);
    const ratio = (anchor - this.view.from) / (this.view.to - this.view.from);
    this.view = { from: anchor - ratio * span, to: anchor - ratio * span + span };
    this.changed(true);
  }

  panBy(fraction) {
    const shift = (this.view.to - this.view.from) * fraction;
    this.view = { from: this.view.from + shift, to: this.view.to + shift };
    this.changed(true);
  }

  changed(fetchNow) {
    this.canvas.dataset.axis = this.axis;
    this.canvas.dataset.from = String(Math.round(this.view.from));
    this.canvas.dataset.to = String(Math.round(this.view.to));
    for (const button of this.axisButtons)
      button.classList.toggle("active", button.dataset.axis === this.axis);
    this.invalidate();
    if (fetchNow) this.scheduleFetch();
  }

  // --- data ---

  // The window to ask for: the view widened to whole tiles of a power-of-two size, so that
  // small pans and zooms hit the cache and exact data keeps serving a smaller view.
  tile() {
    const span = this.view.to - this.view.from;
    const size = 2 ** Math.floor(Math.log2(Math.max(span / 2, 1)));
    const from = (Math.floor(this.view.from / size) - 1) * size;
    const to = (Math.ceil(this.view.to / size) + 1) * size;
    return { from, to, size };
  }

  /**
   * Take a newer picture of the run (a live page redrawn): its extent, agents and cuts. A
   * view that showed the run's end keeps following it; one the user moved away stays put.
   */
  update(run, snapshots) {
    if (run === this.run) return;
    const [oldStart, oldEnd] = this.extent();
    const margin = (oldEnd - oldStart) * 0.02;
    const whole = this.view.from <= oldStart && this.view.to >= oldEnd;
    const following = this.view.to >= oldEnd - margin;
    this.run = run;
    this.snapshots = snapshots || [];
    this.ensureAgents(run.agents || []);
    if (this.source.cache) this.source.cache.clear();
    this.stale = true;
    if (whole) {
      this.reset(true);
      return;
    }
    if (following) {
      const [, end] = this.extent();
      const shift = end - oldEnd;
      this.view = { from: this.view.from + shift, to: this.view.to + shift };
    }
    this.changed(true);
  }

  needsFetch() {
    const data = this.data;
    if (this.stale) return true;
    if (!data || data.axis !== this.axis) return true;
    const covers = data.from <= this.view.from && data.to >= this.view.to;
    if (!covers) return true;
    if (data.messages.mode === "exact") return false;
    const span = this.view.to - this.view.from;
    return (data.to - data.from) / span > 6; // density bins too coarse for this zoom
  }

  scheduleFetch() {
    clearTimeout(this.timer);
    if (!this.needsFetch()) return;
    const delay = this.data ? 120 : 0;
    this.timer = setTimeout(() => this.fetchWindow(), delay);
  }

  async fetchWindow() {
    if (!this.needsFetch()) return;
    const { from, to } = this.tile();
    if (this.pending) this.pending.abort();
    const controller = new AbortController();
    this.pending = controller;
    this.canvas.dataset.loading = "true";
    this.stats.fetches += 1;
    try {
      const data = await this.source.window(this.axis, from, to, controller.signal);
      if (controller.signal.aborted) return;
      this.accept(data);
    } catch (error) {
      if (error && error.name === "AbortError") return;
      this.info.textContent = `could not load this window: ${error.message}`;
      this.info.classList.add("error");
    } finally {
      if (this.pending === controller) {
        this.pending = null;
        delete this.canvas.dataset.loading;
      }
    }
  }

  accept(data) {
    if (data.axis !== this.axis) return;
    this.data = data;
    this.stale = false;
    this.info.classList.remove("error");
    const names = new Set();
    this.activity = new Map();
    const bump = (name, n) => this.activity.set(name, (this.activity.get(name) || 0) + n);
    if (data.messages.mode === "exact") {
      for (const m of data.messages.messages) {
        names.add(m.src);
        names.add(m.dst);
        bump(m.src, 1);
        bump(m.dst, 1);
      }
    } else {
      for (const c of data.messages.channels) {
        names.add(c.src);
        names.add(c.dst);
        const total = c.counts.reduce((a, b) => a + b, 0);
        bump(c.src, total);
        bump(c.dst, total);
      }
    }
    for (const call of data.events.tool_calls || []) if (call.agent) names.add(call.agent);
    for (const r of data.events.rollbacks || []) if (r.agent) names.add(r.agent);
    this.ensureAgents(names);
    if (this.sort === "activity") this.layout();
    this.canvas.dataset.mode = data.messages.mode;
    this.invalidate();
    if (this.needsFetch()) this.scheduleFetch();
  }

  // --- drawing ---

  invalidate() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.draw();
    });
  }

  /** A promise resolved after the next frame is drawn (used by tests and the benchmark). */
  nextFrame() {
    return new Promise((resolve) => {
      this.frameWaiters.push(resolve);
      this.invalidate();
    });
  }

  draw() {
    const begun = performance.now();
    const width = this.width;
    const height = this.height;
    const ratio = window.devicePixelRatio || 1;
    const canvas = this.canvas;
    if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
      canvas.width = Math.round(width * ratio);
      canvas.height = Math.round(height * ratio);
      canvas.style.width = `${width}px`;
      canvas.style.height = `${height}px`;
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = "11px system-ui, sans-serif";
    this.hits = { messages: [], cuts: [], rollbacks: [], tools: [] };
    this.drawAxis(ctx, width, height);
    this.drawLanes(ctx, width);
    let drawn = 0;
    if (this.data && this.data.axis === this.axis) {
      drawn = this.data.messages.mode === "exact" ? this.drawExact(ctx) : this.drawDensity(ctx);
      this.drawEvents(ctx, height);
    }
    this.drawCuts(ctx, height);
    if (this.overlay) this.overlay(ctx, height);
    this.drawHover(ctx);
    canvas.dataset.drawn = String(drawn);
    this.updateInfo(drawn);
    this.stats.draws += 1;
    this.stats.lastDrawMs = performance.now() - begun;
    if (this.data && this.stats.firstDataDrawAt === null) {
      this.stats.firstDataDrawAt = performance.now();
      canvas.dataset.firstRender = String(Math.round(this.stats.firstDataDrawAt));
    }
    const waiters = this.frameWaiters;
    this.frameWaiters = [];
    for (const resolve of waiters) resolve();
  }

  updateInfo(drawn) {
    if (this.info.classList.contains("error")) return;
    const span = this.view.to - this.view.from;
    const shown = this.axis === "lamport" ? `${Math.round(span)} ticks` : fmtSpan(span);
    let what = "loading…";
    if (this.data && this.data.axis === this.axis) {
      what =
        this.data.messages.mode === "exact"
          ? `${drawn} message(s), exact`
          : `density of ${drawn} message(s) per channel (zoom in for arrows)`;
    }
    this.info.textContent = `${shown} in view · ${what}`;
  }

  drawAxis(ctx, width, height) {
    const span = this.view.to - this.view.from;
    const step = niceStep(span / Math.max(2, Math.floor(width / 110)));
    const [start] = this.extent();
    ctx.strokeStyle = "#eee";
    ctx.fillStyle = "#888";
    ctx.textAlign = "center";
    ctx.beginPath();
    const first = Math.ceil((this.view.from - start) / step);
    const last = Math.floor((this.view.to - start) / step);
    for (let i = first; i <= last && i - first < 200; i++) {
      const x = Math.round(this.x(start + i * step)) + 0.5;
      ctx.moveTo(x, TOP - 24);
      ctx.lineTo(x, height - BOTTOM + 4);
      const label = this.axis === "lamport" ? String(i * step) : `+${fmtSpan(i * step)}`;
      ctx.fillText(label, x, height - BOTTOM + 18);
    }
    ctx.stroke();
  }

  drawLanes(ctx, width) {
    ctx.strokeStyle = "#555";
    ctx.lineWidth = 1.2;
    ctx.beginPath();
    this.rows.forEach((row, i) => {
      if (row.kind === "group" && !row.collapsed) return;
      const y = TOP + i * LANE + 0.5;
      ctx.moveTo(0, y);
      ctx.lineTo(width, y);
    });
    ctx.stroke();
    ctx.lineWidth = 1;
  }

  drawExact(ctx) {
    const lamport = this.axis === "lamport";
    const width = this.width;
    const normal = new Path2D();
    const heads = new Path2D();
    const discarded = new Path2D();
    const stubs = new Path2D();
    let drawn = 0;
    const messages = this.data.messages.messages;
    const headLimit = messages.length <= 3000;
    for (const m of messages) {
      const y1 = this.laneY(m.src);
      const y2 = this.laneY(m.dst);
      if (y1 === null || y2 === null) continue;
      const sent = lamport ? m.sent_lc : m.sent_us;
      const deliveredRaw = lamport ? m.delivered_lc : m.delivered_us;
      const x1 = this.x(sent);
      const delivered = deliveredRaw !== null && deliveredRaw !== undefined;
      let x2;
      let yEnd;
      if (delivered) {
        x2 = this.x(deliveredRaw);
        yEnd = y2;
      } else {
        x2 = x1 + 40;
        yEnd = y1 + (y2 - y1) * 0.6;
      }
      if (Math.max(x1, x2) < -20 || Math.min(x1, x2) > width + 20) continue;
      drawn += 1;
      const path = m.discarded ? discarded : delivered ? normal : stubs;
      path.moveTo(x1, y1);
      path.lineTo(x2, yEnd);
      if (delivered && headLimit && y1 !== y2) {
        const angle = Math.atan2(yEnd - y1, x2 - x1);
        const target = m.discarded ? discarded : heads;
        target.moveTo(x2, yEnd);
        target.lineTo(x2 - 7 * Math.cos(angle - 0.4), yEnd - 7 * Math.sin(angle - 0.4));
        if (!m.discarded) {
          target.lineTo(x2 - 7 * Math.cos(angle + 0.4), yEnd - 7 * Math.sin(angle + 0.4));
          target.closePath();
        } else {
          target.moveTo(x2, yEnd);
          target.lineTo(x2 - 7 * Math.cos(angle + 0.4), yEnd - 7 * Math.sin(angle + 0.4));
        }
      }
      this.hits.messages.push([x1, y1, x2, yEnd, m]);
    }
    ctx.strokeStyle = "rgba(40, 90, 200, 0.75)";
    ctx.stroke(normal);
    ctx.fillStyle = "rgba(40, 90, 200, 0.9)";
    ctx.fill(heads);
    ctx.setLineDash([4, 3]);
    ctx.stroke(stubs);
    ctx.strokeStyle = "#999";
    ctx.stroke(discarded);
    ctx.setLineDash([]);
    return drawn;
  }

  drawDensity(ctx) {
    const density = this.data.messages;
    const bins = density.bins;
    const binWidth = (density.to - density.from) / bins;
    let max = 1;
    let total = 0;
    for (const c of density.channels) for (const n of c.counts) if (n > max) max = n;
    const levels = 8;
    const paths = Array.from({ length: levels }, () => new Path2D());
    const heat = Array.from({ length: levels }, () => new Path2D());
    for (const channel of density.channels) {
      const y1 = this.laneY(channel.src);
      const y2 = this.laneY(channel.dst);
      if (y1 === null || y2 === null) continue;
      channel.counts.forEach((count, i) => {
        if (!count) return;
        total += count;
        const a = this.x(density.from + i * binWidth);
        const b = Math.max(a + 1, this.x(density.from + (i + 1) * binWidth));
        if (b < 0 || a > this.width) return;
        const level = Math.min(levels - 1, Math.floor((Math.sqrt(count / max) * levels)));
        // A band from the sender's lane to the receiver's, as wide as the bin.
        const path = paths[level];
        path.moveTo(a, y1);
        path.lineTo(b, y1);
        path.lineTo(b, y2);
        path.lineTo(a, y2);
        path.closePath();
        heat[level].rect(a, y1 - 5, b - a, 10);
      });
    }
    for (let level = 0; level < levels; level++) {
      const alpha = 0.04 + (0.3 * (level + 1)) / levels;
      ctx.fillStyle = `rgba(40, 90, 200, ${alpha.toFixed(3)})`;
      ctx.fill(paths[level]);
      ctx.fillStyle = `rgba(20, 60, 160, ${(0.15 + (0.8 * (level + 1)) / levels).toFixed(3)})`;
      ctx.fill(heat[level]);
    }
    return total;
  }

  drawEvents(ctx, height) {
    const lamport = this.axis === "lamport";
    const events = this.data.events;
    // Rollbacks: a red line across the lanes and a red cross on the agent that asked.
    const lines = new Path2D();
    const crosses = new Path2D();
    ctx.fillStyle = "#c33";
    const rollbackLabels = new LabelRows(ctx, this.width, [ROLLBACK_LABEL_ROW]);
    this.rollbackLabelBoxes = rollbackLabels.rows;
    for (const r of events.rollbacks || []) {
      const x = this.x(lamport ? r.lc : r.at_us);
      if (x < -10 || x > this.width + 10) continue;
      lines.moveTo(x, TOP - 18);
      lines.lineTo(x, height - BOTTOM);
      const y = r.agent ? this.laneY(r.agent) : null;
      if (y !== null) {
        crosses.moveTo(x - 5, y - 5);
        crosses.lineTo(x + 5, y + 5);
        crosses.moveTo(x + 5, y - 5);
        crosses.lineTo(x - 5, y + 5);
      }
      rollbackLabels.place("↺ rollback", x, "left");
      this.hits.rollbacks.push([x, r]);
    }
    ctx.strokeStyle = "rgba(204, 51, 51, 0.8)";
    ctx.lineWidth = 2;
    ctx.stroke(lines);
    ctx.stroke(crosses);
    ctx.lineWidth = 1;
    // Tool calls: a small square on their agent's lane, coloured by status.
    const byColour = new Map();
    for (const call of events.tool_calls || []) {
      const y = call.agent ? this.laneY(call.agent) : null;
      if (y === null) continue;
      const x = this.x(lamport ? call.lc : call.at_us);
      if (x < -5 || x > this.width + 5) continue;
      const colour = STATUS_COLOURS[call.status] || "#7a5";
      if (!byColour.has(colour)) byColour.set(colour, new Path2D());
      byColour.get(colour).rect(x - 3.5, y - 11, 7, 7);
      this.hits.tools.push([x, y - 7.5, call]);
    }
    for (const [colour, path] of byColour) {
      ctx.fillStyle = colour;
      ctx.fill(path);
    }
  }

  cutPoints(snapshot) {
    const lamport = this.axis === "lamport";
    const points = [];
    for (const [agent, where] of Object.entries(snapshot.recorded || {})) {
      const y = this.laneY(agent);
      if (y === null) continue;
      points.push([this.x(lamport ? where.lc : where.at_us), y]);
    }
    points.sort((a, b) => a[1] - b[1]);
    if (!points.length) {
      const x = this.x(lamport ? 0 : snapshot.started_at_us);
      points.push([x, TOP], [x, this.height - BOTTOM]);
    }
    return points;
  }

  drawCuts(ctx, height) {
    ctx.textAlign = "center";
    ctx.font = "bold 11px system-ui, sans-serif";
    const labels = new LabelRows(ctx, this.width, CUT_LABEL_ROWS);
    this.labelsShown = 0;
    this.labelBoxes = labels.rows;
    for (const snapshot of this.snapshots) {
      const points = this.cutPoints(snapshot);
      const xs = points.map((p) => p[0]);
      if (Math.max(...xs) < -10 || Math.min(...xs) > this.width + 10) continue;
      const complete = snapshot.status === "complete";
      const selected = this.selectedCut === snapshot.id;
      ctx.strokeStyle = complete ? (selected ? "#b35a00" : "#e80") : "rgba(200, 120, 0, 0.45)";
      ctx.lineWidth = selected ? 3.5 : 2;
      ctx.setLineDash(complete ? [] : [5, 4]);
      ctx.beginPath();
      ctx.moveTo(points[0][0], TOP - 14);
      for (const [x, y] of points) ctx.lineTo(x, y);
      ctx.lineTo(points[points.length - 1][0], height - BOTTOM);
      ctx.stroke();
      ctx.setLineDash([]);
      ctx.fillStyle = complete ? "#e80" : "#fff";
      ctx.beginPath();
      for (const [x, y] of points) {
        ctx.moveTo(x + 3.5, y);
        ctx.arc(x, y, 3.5, 0, 2 * Math.PI);
      }
      ctx.fill();
      if (!complete) ctx.stroke();
      ctx.fillStyle = complete ? "#a50" : "#b88";
      const label = `S${snapshot.seq}${complete ? "" : ` (${snapshot.status})`}`;
      const y = labels.place(label, points[0][0]);
      if (y !== null) this.labelsShown += 1;
      this.hits.cuts.push([[[points[0][0], (y ?? TOP - 30) - 2], [points[0][0], TOP - 14], ...points], snapshot]);
    }
    ctx.lineWidth = 1;
    ctx.font = "11px system-ui, sans-serif";
  }

  drawHover(ctx) {
    const hover = this.hover;
    if (!hover || hover.kind !== "message") return;
    const [x1, y1, x2, y2] = hover.hit;
    ctx.strokeStyle = "#f50";
    ctx.lineWidth = 3;
    ctx.beginPath();
    ctx.moveTo(x1, y1);
    ctx.lineTo(x2, y2);
    ctx.stroke();
    ctx.lineWidth = 1;
  }

  // --- hit testing ---

  find(x, y) {
    const near = (px, py, ax, ay, bx, by) => {
      const dx = bx - ax;
      const dy = by - ay;
      const length = dx * dx + dy * dy;
      const u = length ? Math.max(0, Math.min(1, ((px - ax) * dx + (py - ay) * dy) / length)) : 0;
      const cx = ax + u * dx - px;
      const cy = ay + u * dy - py;
      return Math.sqrt(cx * cx + cy * cy);
    };
    if (!this.hits) return null;
    for (const [px, py, call] of this.hits.tools) {
      if (Math.abs(px - x) <= 5 && Math.abs(py - y) <= 5) return { kind: "tool", item: call };
    }
    let best = null;
    for (const [points, snapshot] of this.hits.cuts) {
      for (let i = 1; i < points.length; i++) {
        const d = near(x, y, ...points[i - 1], ...points[i]);
        if (d <= 5 && (!best || d < best.d)) best = { kind: "cut", item: snapshot, d };
      }
    }
    if (best) return best;
    for (const hit of this.hits.messages) {
      const d = near(x, y, hit[0], hit[1], hit[2], hit[3]);
      if (d <= 4 && (!best || d < best.d)) best = { kind: "message", item: hit[4], hit, d };
    }
    if (best) return best;
    for (const [px, r] of this.hits.rollbacks) {
      if (Math.abs(px - x) <= 4) return { kind: "rollback", item: r };
    }
    return null;
  }

  /** Where, in page coordinates, the cut of snapshot `seq` crosses `agent`'s lane. */
  cutPoint(seq, agent) {
    const snapshot = this.snapshots.find((s) => s.seq === seq);
    if (!snapshot) return null;
    const rect = this.canvas.getBoundingClientRect();
    const points = this.cutPoints(snapshot);
    let point = points[0];
    if (agent !== undefined) {
      const y = this.laneY(agent);
      point = points.find((p) => p[1] === y) || point;
    }
    return { x: rect.left + point[0], y: rect.top + point[1] };
  }

  describe(found) {
    const item = found.item;
    if (found.kind === "message") {
      const lines = [
        `${item.src} → ${item.dst} #${item.seq}`,
        `kind: ${item.kind}  epoch: ${item.epoch}`,
        `sent: ${fmtTime(item.sent_us)} (lc ${item.sent_lc})`,
        `delivered: ${item.delivered_us === null ? "never" : `${fmtTime(item.delivered_us)} (lc ${item.delivered_lc})`}`,
      ];
      if (item.discarded) lines.push("discarded by a rollback");
      if (item.payload_excerpt !== undefined) lines.push(`payload: ${item.payload_excerpt}`);
      return lines.join("\n");
    }
    if (found.kind === "cut") {
      const agents = Object.keys(item.recorded || {}).length;
      return [
        `snapshot S${item.seq} (${item.status})`,
        `id: ${item.id}`,
        `initiator: ${item.initiator ?? "-"}`,
        `started: ${fmtTime(item.started_at_us)}`,
        `completed: ${fmtTime(item.completed_at_us)}`,
        `${agents} agent(s), ${item.in_flight} message(s) in flight`,
        item.error ? `error: ${item.error}` : null,
      ]
        .filter(Boolean)
        .join("\n");
    }
    if (found.kind === "rollback") {
      const target = this.snapshots.find((s) => s.id === item.snapshot_id);
      return [
        `rollback to ${target ? `S${target.seq}` : shortId(item.snapshot_id)}`,
        `reason: ${item.reason}`,
        `agent: ${item.agent ?? "-"}  source: ${item.source}`,
        `at: ${fmtTime(item.at_us)}`,
      ].join("\n");
    }
    return `${item.tool} (${item.status})\nkey: ${item.key}\nagent: ${item.agent ?? "-"}\nat: ${fmtTime(item.at_us)}`;
  }

  bindInput() {
    const canvas = this.canvas;
    const local = (event) => {
      const rect = canvas.getBoundingClientRect();
      return [event.clientX - rect.left, event.clientY - rect.top];
    };
    canvas.addEventListener(
      "wheel",
      (event) => {
        event.preventDefault();
        const [x] = local(event);
        if (event.shiftKey) this.panBy(event.deltaY / 1000);
        else this.zoomBy(Math.exp(Math.max(-1, Math.min(1, event.deltaY * 0.0015))), x);
      },
      { passive: false },
    );
    let drag = null;
    canvas.addEventListener("pointerdown", (event) => {
      canvas.focus();
      drag = { x: event.clientX, from: this.view.from, to: this.view.to, moved: false };
      canvas.setPointerCapture(event.pointerId);
    });
    canvas.addEventListener("pointermove", (event) => {
      if (drag) {
        const dx = event.clientX - drag.x;
        if (Math.abs(dx) > 3) drag.moved = true;
        if (drag.moved) {
          const shift = (-dx / (this.width - 2 * PAD)) * (drag.to - drag.from);
          this.view = { from: drag.from + shift, to: drag.to + shift };
          this.changed(true);
        }
        return;
      }
      const [x, y] = local(event);
      const found = this.find(x, y);
      const was = this.hover;
      this.hover = found;
      if (found) {
        this.tip.textContent = this.describe(found);
        this.tip.hidden = false;
        this.tip.style.left = `${Math.min(x + 14, this.width - 280)}px`;
        this.tip.style.top = `${y + 14}px`;
        canvas.style.cursor = "pointer";
      } else {
        this.tip.hidden = true;
        canvas.style.cursor = "grab";
      }
      if ((was && was.kind === "message") || (found && found.kind === "message")) this.invalidate();
    });
    canvas.addEventListener("pointerleave", () => {
      this.tip.hidden = true;
      this.hover = null;
    });
    canvas.addEventListener("pointerup", (event) => {
      const wasDrag = drag && drag.moved;
      drag = null;
      if (wasDrag) return;
      const [x, y] = local(event);
      const found = this.find(x, y);
      if (!found) return;
      // The click takes the page elsewhere: the tip about what was under the pointer goes.
      this.tip.hidden = true;
      this.hover = null;
      if (found.kind === "cut") {
        this.selectedCut = found.item.id;
        this.invalidate();
        this.onCut(found.item);
      } else if (found.kind === "message") {
        this.onMessage(found.item);
      } else if (found.kind === "tool" && found.item.agent) {
        this.onAgent(found.item.agent);
      }
    });
    canvas.addEventListener("keydown", (event) => {
      if (this.key(event.key)) event.preventDefault();
    });
  }

  key(key) {
    if (key === "+" || key === "=") this.zoomBy(1 / 1.5);
    else if (key === "-" || key === "_") this.zoomBy(1.5);
    else if (key === "ArrowLeft") this.panBy(-0.15);
    else if (key === "ArrowRight") this.panBy(0.15);
    else if (key === "0") this.reset();
    else return false;
    return true;
  }

  select(snapshotId) {
    this.selectedCut = snapshotId;
    this.invalidate();
  }
}

// --- Views ----------------------------------------------------------------------------------

const view = () => document.getElementById("view");
const state = { run: null, timeline: null, timelineRun: null, route: null, controller: null, flash: null };

function statusBadge(status) {
  return el("span", { class: `badge s-${String(status).replace(/[^a-z_]/gi, "")}`, text: status });
}

function tags(list) {
  return el("span", { class: "tags" }, (list || []).map((tag) => el("span", { class: "tag", text: tag })));
}

function errorBox(error) {
  return el("p", { class: "error-box", role: "alert", text: error.message || String(error) });
}

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/runs";
  const [pathPart, queryPart] = raw.split("?");
  const parts = pathPart.split("/").filter(Boolean).map((p) => decodeURIComponent(p));
  const params = new URLSearchParams(queryPart || "");
  return { parts, params };
}

async function route() {
  if (state.controller) state.controller.abort();
  const controller = new AbortController();
  state.controller = controller;
  const { parts, params } = parseHash();
  const main = view();
  main.dataset.loaded = "false";
  setStatus("");
  // Taken before the data it stands for: a change in between only costs one more redraw.
  const token = liveToken(parts, controller.signal);
  try {
    if (parts[0] !== "runs" || parts.length === 1) {
      await runsView(main, params, controller.signal);
    } else {
      await runView(main, parts.slice(1), params, controller.signal);
    }
    if (!controller.signal.aborted) {
      live.drawn = await token;
      live.stale = false;
      showLive();
      main.dataset.loaded = "true";
    }
  } catch (error) {
    if (error && error.name === "AbortError") return;
    clear(main).appendChild(errorBox(error));
    main.dataset.loaded = "error";
  }
}

// Runs list.

async function runsView(main, params, signal) {
  const q = params.get("q") || "";
  const status = params.get("status") || "";
  const tag = params.get("tag") || "";
  const offset = Number(params.get("offset") || 0);
  const [body, waiting] = await Promise.all([
    api(`/api/runs${query({ q, status, tag, limit: 100, offset })}`, { signal }),
    api("/api/requests?pending=true", { signal }).catch(() => null),
  ]);
  const pendingByRun = new Map();
  for (const r of (waiting && waiting.requests) || []) pendingByRun.set(r.run_id, (pendingByRun.get(r.run_id) || 0) + 1);
  const form = el(
    "form",
    {
      class: "filters",
      onsubmit: (event) => {
        event.preventDefault();
        const data = new FormData(form);
        location.hash = `#/runs${query({ q: data.get("q"), status: data.get("status"), tag: data.get("tag") })}`;
      },
    },
    el("input", { name: "q", type: "search", placeholder: "id prefix or name", value: q, "aria-label": "Search runs" }),
    el(
      "select",
      { name: "status", "aria-label": "Status" },
      // The values of agentsnap.RunStatus, which the API's status filter takes.
      ["", "running", "succeeded", "failed", "interrupted", "cancelled", "created"].map((s) =>
        el("option", { value: s, text: s || "any status", selected: s === status }),
      ),
    ),
    el("input", { name: "tag", placeholder: "tag (key or key=value)", value: tag, "aria-label": "Tag" }),
    el("button", { type: "submit", text: "Filter" }),
  );
  const rows = body.runs.map((run) =>
    el(
      "tr",
      { dataset: { run: run.id } },
      el("td", null, link(`#/runs/${enc(run.id)}`, run.name || shortId(run.id), "run-link")),
      el("td", { class: "mono", text: shortId(run.id) }),
      el("td", null, tags(run.tags)),
      el(
        "td",
        null,
        statusBadge(run.status),
        pendingByRun.get(run.id) ? [" ", link(`#/runs/${enc(run.id)}/requests`, `${pendingByRun.get(run.id)} waiting for a person`, "badge pending-requests")] : null,
        run.reason ? el("div", { class: "reason", text: run.reason }) : null,
      ),
      el("td", { text: fmtTime(run.created_at_us) }),
      el("td", { text: fmtTime(run.updated_at_us) }),
      el("td", { class: "num", text: run.snapshots }),
      el("td", { class: "num", text: run.rollbacks }),
      el(
        "td",
        null,
        run.parent_run_id ? link(`#/runs/${enc(run.parent_run_id)}`, `fork of ${shortId(run.parent_run_id)}`) : null,
      ),
    ),
  );
  const table = el(
    "table",
    { class: "runs" },
    el(
      "thead",
      null,
      el("tr", null, ["Run", "Id", "Tags", "Status", "Created", "Updated", "Snapshots", "Rollbacks", "Lineage"].map((h) => el("th", { text: h }))),
    ),
    el("tbody", null, rows),
  );
  const pager = el("p", { class: "muted" }, `${body.runs.length} of ${body.total} run(s)`);
  if (offset + body.runs.length < body.total) {
    put(pager, " · ", link(`#/runs${query({ q, status, tag, offset: offset + 100 })}`, "next page"));
  }
  if (signal.aborted) return;
  put(clear(main), el("h1", { text: "Runs" }), form, body.runs.length ? table : el("p", { class: "muted", text: "No run matches." }), pager);
  state.timeline = null;
  state.timelineRun = null;
}

// One run.

async function loadRun(runId, signal) {
  if (state.run && (state.run.detail.id === runId || state.run.key === runId)) return state.run;
  const [detail, snaps] = await Promise.all([
    api(runPath(runId), { signal }),
    api(`${runPath(runId)}/snapshots`, { signal }),
  ]);
  state.run = { key: runId, detail, snapshots: snaps.snapshots };
  return state.run;
}

function runHeader(run, requests) {
  const d = run.detail;
  const waiting = requests ? requests.requests.filter((r) => r.status === "pending").length : 0;
  const id = enc(d.id);
  const lineage = el("div", { class: "lineage" });
  if (d.parent_run_id) {
    put(lineage, 
      "forked from ",
      link(`#/runs/${enc(d.parent_run_id)}`, shortId(d.parent_run_id)),
      d.parent_snapshot_id ? [" at ", link(`#/runs/${enc(d.parent_run_id)}/snapshots/${enc(d.parent_snapshot_id)}`, `snapshot ${shortId(d.parent_snapshot_id)}`)] : null,
    );
  }
  if (d.forks && d.forks.length) {
    put(lineage, 
      d.parent_run_id ? " · " : "",
      "forks: ",
      d.forks.map((f, i) => [i ? ", " : "", link(`#/runs/${enc(f.run_id)}`, shortId(f.run_id))]),
    );
  }
  const tabs = [
    ["", "Timeline"],
    ["snapshots", "Snapshots"],
    ["events", "Events"],
    ["tools", "Tools"],
    ["requests", waiting ? `Requests (${waiting} waiting)` : "Requests"],
    ["diff", "Diff"],
    ["bisect", "Bisect"],
  ];
  if (d.parent_run_id) tabs.push(["compare", "Compare with parent"]);
  return el(
    "div",
    { class: "run-header" },
    el("h1", null, el("span", { class: "run-name", text: d.name || `run ${shortId(d.id)}` }), " ", statusBadge(d.status)),
    d.reason ? el("p", { class: "reason", text: d.reason }) : null,
    el(
      "p",
      { class: "facts" },
      el("span", { class: "mono", text: d.id }),
      ` · ${d.agents.length} agent(s) · ${d.messages} message(s) · ${run.snapshots.length} snapshot(s) · ${d.rollbacks} rollback(s) · ${d.tool_calls} tool call(s) · `,
      `created ${fmtTime(d.created_at_us)}`,
      " ",
      tags(d.tags),
    ),
    lineage,
    waiting
      ? el("p", { class: "requests-alert", role: "alert" }, `${waiting} request(s) wait for a person: `, link(`#/runs/${id}/requests`, "see and answer them"))
      : null,
    el("nav", { class: "tabs" }, tabs.map(([path, label]) => link(`#/runs/${id}${path ? `/${path}` : ""}`, label, "tab"))),
  );
}

async function runView(main, parts, params, signal) {
  const runId = parts[0];
  const run = await loadRun(runId, signal);
  if (signal.aborted) return;
  // Asked each time: requests change while the run waits (a store without them has none).
  const requests = await api(`${runPath(run.detail.id)}/requests`, { signal }).catch((error) => {
    if (error && error.name === "AbortError") throw error;
    return null;
  });
  if (signal.aborted) return;
  const section = parts[1] || "";
  const header = runHeader(run, requests);
  const tabKey = section === "agents" || section === "messages" ? "" : section === "fork" ? "snapshots" : section;
  for (const tab of header.querySelectorAll("a.tab")) {
    const target = tab.getAttribute("href").split("/")[3] || "";
    if (target === tabKey || (target === "" && section === "snapshots" && parts[2])) tab.classList.add("active");
  }
  const panel = el("section", { class: "panel", id: "panel" });
  const content = [header];
  const session = await loadSession(signal);
  if (signal.aborted) return;
  const actions = runActions(run, session);
  if (actions) content.push(actions);
  if (run.detail.status === "failed") {
    // A failed run's page opens on its error (folded on the other views).
    const { failureBox } = await import("./views/failure.js");
    content.push(failureBox(run.detail, section === ""));
  }
  const showTimeline = section === "" || section === "agents" || section === "messages" || (section === "snapshots" && parts[2]);
  if (showTimeline) content.push(timelineFor(run).root);
  content.push(panel);
  put(clear(main), ...content);
  if (showTimeline) state.timeline.invalidate();
  if (section === "") {
    put(panel, el("p", { class: "muted", text: "Click a snapshot's cut for every agent's state at it, an agent's name for its history, an arrow for its message. Wheel or +/- zoom, drag or arrows pan, 0 resets." }));
    const topology = await api(`${runPath(run.detail.id)}/topology`, { signal });
    if (signal.aborted) return;
    main.insertBefore(topologyView(topology, state.timeline), state.timeline.root);
  } else if (section === "snapshots" && parts[2]) {
    state.timeline.select(parts[2]);
    await cutPanel(panel, run, parts[2], signal);
  } else if (section === "snapshots") {
    snapshotsPanel(panel, run);
  } else if (section === "agents" && parts[2]) {
    await agentPanel(panel, run, parts[2], signal);
  } else if (section === "messages" && parts.length >= 5) {
    await messagePanel(panel, run, parts[2], parts[3], parts[4], signal);
  } else if (section === "tools") {
    await toolsPanel(panel, run, params, signal);
  } else if (section === "requests") {
    await requestsPanel(panel, run, requests);
  } else if (section === "diff") {
    await diffPanel(panel, run, params, signal);
  } else if (section === "fork" && parts[2]) {
    await forkPanel(panel, run, parts[2], signal);
  } else if (section === "bisect") {
    bisectPanel(panel, run, params);
  } else if (section === "events") {
    const { eventsPanel } = await import("./views/events.js");
    await eventsPanel(panel, run, params, signal);
  } else if (section === "compare") {
    const { comparePanel } = await import("./views/compare.js");
    await comparePanel(panel, run, params, signal);
  } else {
    put(panel, errorBox(new Error(`nothing here: #${location.hash.slice(1)}; go back to the run`)));
  }
}

// --- Actions: resume and cancel ---------------------------------------------------------------

let sessionCache = null;
let typedToken = null;

async function loadSession(signal) {
  if (sessionCache) return sessionCache;
  try {
    sessionCache = await api("/api/session", { signal });
  } catch (error) {
    if (error && error.name === "AbortError") throw error;
    sessionCache = { allow_run: false, token: null, token_required: false, commands: {} };
  }
  return sessionCache;
}

function actionToken() {
  if (sessionCache && sessionCache.token) return sessionCache.token;
  if (typedToken === null) typedToken = sessionStorage.getItem("agentsnap-token");
  return typedToken;
}

/**
 * What can be done to the run from here: resume an interrupted (or created, or cancelled)
 * run, cancel a running one. Each asks for a confirmation that says what will happen; a
 * server not started with --allow-run shows the command that does the same instead.
 */
function runActions(run, session) {
  const d = run.detail;
  const verb = d.status === "running" ? "cancel" : ["interrupted", "created", "cancelled"].includes(d.status) ? "resume" : null;
  if (!verb) return null;
  const command = (session.commands[verb] || `agentsnap ${verb} RUN`).replace("RUN", d.id);
  const box = el("div", { class: "run-actions", dataset: { action: verb } });
  if (!session.allow_run) {
    put(box, el("span", { class: "muted", text: verb === "resume" ? "To resume this run: " : "To cancel this run: " }), el("code", { class: "action-command", text: command }), el("span", { class: "muted", text: " (or start the inspector with --app MODULE:FACTORY --allow-run)" }));
    return box;
  }
  const what = verb === "resume"
    ? `Resume run ${shortId(d.id)}: a process of its own runs its app (${session.app || "the app given to --app"}) from the run's last complete snapshot, re-executing the handlers the stop interrupted in the order they were logged; recorded model calls are replayed, and side-effecting calls already made return their recorded outcomes${(d.metadata || {})["agentsnap.tools"] === "dry" ? " (this fork's tools are dry: nothing reaches the world)" : ""}.`
    : `Cancel run ${shortId(d.id)}: its process stops at its next lease renewal (within seconds), handlers under way finish, nothing more is delivered, and the run is recorded cancelled. It can be resumed later.`;
  const result = el("span", { class: "action-result", role: "status" });
  const tokenInput = session.token_required && !actionToken()
    ? el("input", { type: "password", class: "action-token", placeholder: "the server's token", "aria-label": "Token" })
    : null;
  const confirm = el("div", { class: "action-confirm", hidden: true },
    el("p", { text: what }),
    tokenInput,
    el("button", {
      type: "button",
      class: `confirm-${verb} primary`,
      text: verb === "resume" ? "Yes, resume it" : "Yes, cancel it",
      onclick: async (event) => {
        event.target.disabled = true;
        if (tokenInput && tokenInput.value) {
          typedToken = tokenInput.value;
          sessionStorage.setItem("agentsnap-token", typedToken);
        }
        try {
          await api(`${runPath(d.id)}/${verb}`, { method: "POST" });
          confirm.hidden = true;
          delete box.dataset.dirty;
          result.textContent = verb === "resume" ? "Resuming: the page follows the run." : "Cancel requested: the run stops at its next lease renewal.";
          result.className = "action-result ok-box";
        } catch (error) {
          result.textContent = error.message;
          result.className = "action-result error-box";
          event.target.disabled = false;
        }
      },
    }),
    el("button", { type: "button", text: "No", onclick: () => { confirm.hidden = true; delete box.dataset.dirty; } }),
  );
  put(box,
    el("button", { type: "button", class: `action-${verb}`, text: verb === "resume" ? "Resume…" : "Cancel run…", onclick: () => { confirm.hidden = false; box.dataset.dirty = "true"; } }),
    " ",
    result,
    confirm,
  );
  return box;
}

// --- Topology: who talks to whom ------------------------------------------------------------

const TOPOLOGY_MAX = 60; // agents drawn; the busiest ones when a run has more

/**
 * The run's agents on a circle and an arrow per channel, thicker with its messages. Clicking
 * an agent shows only it and the agents it talks with in the space-time view; clicking an
 * arrow, only its two ends; "All agents" shows every lane again.
 */
function topologyView(topology, timeline) {
  const traffic = new Map();
  for (const c of topology.channels) {
    traffic.set(c.src, (traffic.get(c.src) || 0) + c.messages);
    traffic.set(c.dst, (traffic.get(c.dst) || 0) + c.messages);
  }
  let agents = [...new Set([...topology.agents, ...traffic.keys()])];
  const hidden = Math.max(0, agents.length - TOPOLOGY_MAX);
  if (hidden) agents = agents.sort((a, b) => (traffic.get(b) || 0) - (traffic.get(a) || 0)).slice(0, TOPOLOGY_MAX);
  agents.sort();
  const size = 360;
  const radius = agents.length > 1 ? size / 2 - 50 : 0;
  const at = new Map(agents.map((name, i) => {
    const angle = (2 * Math.PI * i) / Math.max(1, agents.length) - Math.PI / 2;
    return [name, [size / 2 + radius * Math.cos(angle), size / 2 + radius * Math.sin(angle)]];
  }));
  const NS = "http://www.w3.org/2000/svg";
  const svgEl = (tag, attrs, text) => {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  };
  const svg = svgEl("svg", { class: "topology-graph", viewBox: `0 0 ${size} ${size}`, width: size, height: size, role: "img", "aria-label": "Who talks to whom" });
  const defs = svgEl("defs");
  const marker = svgEl("marker", { id: "topology-arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" });
  marker.appendChild(svgEl("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#8a93a6" }));
  defs.appendChild(marker);
  svg.appendChild(defs);
  const note = el("span", { class: "muted topology-focus" });
  const show = (names, what) => {
    timeline.focus(names);
    note.textContent = names ? `The space-time view shows ${what}.` : "";
    all.hidden = !names;
  };
  const all = el("button", { type: "button", class: "topology-all", text: "All agents", hidden: !timeline.only, onclick: () => show(null) });
  if (timeline.only) note.textContent = `The space-time view shows ${[...timeline.only].sort().join(", ")}.`;
  const most = Math.max(1, ...topology.channels.map((c) => c.messages));
  for (const c of topology.channels) {
    const from = at.get(c.src);
    const to = at.get(c.dst);
    if (!from || !to || c.src === c.dst) continue;
    // Shortened at both ends so that the arrow stops at the node; bent a little so that
    // the two directions of a pair do not overlap.
    const [x1, y1] = from;
    const [x2, y2] = to;
    const dx = x2 - x1;
    const dy = y2 - y1;
    const length = Math.hypot(dx, dy) || 1;
    const [ux, uy] = [dx / length, dy / length];
    const [sx, sy] = [x1 + ux * 14, y1 + uy * 14];
    const [ex, ey] = [x2 - ux * 14, y2 - uy * 14];
    const [cx, cy] = [(sx + ex) / 2 - uy * 14, (sy + ey) / 2 + ux * 14];
    const width = 1 + 4 * Math.log2(1 + c.messages) / Math.log2(1 + most);
    const edge = svgEl("path", {
      d: `M ${sx} ${sy} Q ${cx} ${cy} ${ex} ${ey}`,
      class: "topology-edge",
      "stroke-width": width.toFixed(1),
      "marker-end": "url(#topology-arrow)",
      "data-src": c.src,
      "data-dst": c.dst,
      tabindex: 0,
    });
    edge.appendChild(svgEl("title", {}, `${c.src} → ${c.dst}: ${c.messages} message(s)${c.discarded ? `, ${c.discarded} undone by rollbacks` : ""}`));
    edge.addEventListener("click", () => show([c.src, c.dst], `${c.src} and ${c.dst}`));
    svg.appendChild(edge);
    svg.appendChild(svgEl("text", { x: cx, y: cy, class: "topology-count" }, String(c.messages)));
  }
  for (const name of agents) {
    const [x, y] = at.get(name);
    const neighbours = new Set([name]);
    for (const c of topology.channels) {
      if (c.src === name) neighbours.add(c.dst);
      if (c.dst === name) neighbours.add(c.src);
    }
    const node = svgEl("g", { class: "topology-agent", "data-agent": name, tabindex: 0 });
    node.appendChild(svgEl("circle", { cx: x, cy: y, r: 11 }));
    node.appendChild(svgEl("text", { x, y: y + (y < size / 2 ? -16 : 26), "text-anchor": "middle" }, name));
    node.appendChild(svgEl("title", {}, `${name}: ${traffic.get(name) || 0} message(s) sent or received`));
    node.addEventListener("click", () => show([...neighbours], `${name} and the agents it talks with`));
    svg.appendChild(node);
  }
  return el(
    "details",
    { class: "topology", open: true },
    el("summary", null, "Who talks to whom", hidden ? el("span", { class: "muted", text: ` (the ${TOPOLOGY_MAX} busiest agents of ${agents.length + hidden})` }) : null),
    topology.channels.length ? svg : el("p", { class: "muted", text: "No message journaled yet." }),
    el("div", { class: "topology-actions" }, all, note),
  );
}

function timelineFor(run) {
  if (state.timeline && state.timelineRun === run.detail.id) {
    state.timeline.update(run.detail, run.snapshots);
    import("./views/incidents.js").then((m) => m.attachIncidents(state.timeline, run.detail.id));
    return state.timeline;
  }
  const id = enc(run.detail.id);
  const timeline = new SpaceTime({
    run: run.detail,
    snapshots: run.snapshots,
    source: new ServerSource(run.detail.id),
    onCut: (s) => (location.hash = `#/runs/${id}/snapshots/${enc(s.id)}`),
    onAgent: (name) => (location.hash = `#/runs/${id}/agents/${enc(name)}`),
    onMessage: (m) => (location.hash = `#/runs/${id}/messages/${enc(m.src)}/${enc(m.dst)}/${m.seq}`),
  });
  state.timeline = timeline;
  state.timelineRun = run.detail.id;
  window.agentsnap.timeline = timeline;
  timeline.scheduleFetch();
  import("./views/incidents.js").then((m) => m.attachIncidents(timeline, run.detail.id));
  return timeline;
}

function snapshotLabel(s) {
  return `S${s.seq} (${s.status}) · ${fmtTime(s.started_at_us)}`;
}

function snapshotsPanel(panel, run) {
  const id = enc(run.detail.id);
  const rows = run.snapshots.map((s) =>
    el(
      "tr",
      { dataset: { snapshot: s.id } },
      el("td", null, link(`#/runs/${id}/snapshots/${enc(s.id)}`, `S${s.seq}`)),
      el("td", null, statusBadge(s.status)),
      el("td", { text: fmtTime(s.started_at_us) }),
      el("td", { text: fmtTime(s.completed_at_us) }),
      el("td", { text: s.initiator ?? "-" }),
      el("td", { class: "num", text: Object.keys(s.recorded || {}).length }),
      el("td", { class: "num", text: s.in_flight }),
      el("td", null, run.detail.allow_fork === false ? null : link(`#/runs/${id}/fork/${enc(s.id)}`, "fork…")),
    ),
  );
  put(panel, 
    el("h2", { text: "Snapshots" }),
    el(
      "table",
      { class: "snapshots" },
      el("thead", null, el("tr", null, ["Cut", "Status", "Started", "Completed", "Initiator", "Agents", "In flight", ""].map((h) => el("th", { text: h })))),
      el("tbody", null, rows),
    ),
  );
}

const snapshotCache = new Map();

async function loadSnapshot(runId, sid, signal) {
  const key = `${runId}|${sid}`;
  if (!snapshotCache.has(key)) {
    const promise = api(`${runPath(runId)}/snapshots/${enc(sid)}`, { signal });
    snapshotCache.set(key, promise);
    promise.catch(() => snapshotCache.delete(key));
  }
  return snapshotCache.get(key);
}

// Model calls: what agents asked their models, shown under a cut or an agent's history.

function fmtLatency(ms) {
  if (ms < 10) return `${ms.toFixed(1)} ms`;
  return ms >= 10000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms)} ms`;
}

/** A small table of model calls; each answer opens to the whole request and answer. */
function modelCallsTable(calls, options = {}) {
  const headers = [options.agent ? "Agent" : null, "Message", "Pos", "Timeline", "Model", "Tokens in/out", "Latency", "Answer"].filter(Boolean);
  const rows = calls.map((c) =>
    el(
      "tr",
      { class: c.discarded ? "discarded" : "", dataset: { agent: c.agent, position: c.position, timeline: c.timeline } },
      options.agent ? el("td", { text: c.agent }) : null,
      el("td", { class: "mono", text: c.message }),
      el("td", { class: "num", text: c.position }),
      el("td", { class: "num" }, String(c.timeline), c.discarded ? [" ", el("span", { class: "badge discarded", text: "discarded" })] : null),
      el("td", { text: c.model ?? "-" }),
      el("td", { class: "num", text: `${c.input_tokens} / ${c.output_tokens}` }),
      el("td", { class: "num", text: fmtLatency(c.latency_ms) }),
      el(
        "td",
        { class: "answer" },
        el(
          "details",
          { class: "model-call" },
          el("summary", { text: excerpt(c.answer || "(no text)", 120) }),
          el("div", { class: "muted", text: `started ${fmtTime(c.started_at_us)}${c.replays ? ` · replayed ${c.replays}×` : ""}` }),
          el("h4", { text: "Request" }),
          jsonTree(c.request, { open: 4 }),
          el("h4", { text: "Answer" }),
          jsonTree(c.response, { open: 2 }),
        ),
      ),
    ),
  );
  return el(
    "table",
    { class: "model-calls" },
    el("thead", null, el("tr", null, headers.map((h) => el("th", { text: h })))),
    el("tbody", null, rows),
  );
}

function tokenTotals(totals) {
  return `${totals.calls} call(s) · ${totals.input_tokens} tokens in · ${totals.output_tokens} out`;
}

async function cutPanel(panel, run, sid, signal) {
  const [snap, calls] = await Promise.all([
    loadSnapshot(run.detail.id, sid, signal),
    api(`${runPath(run.detail.id)}/model-calls${query({ snapshot: sid })}`, { signal }),
  ]);
  if (signal.aborted) return;
  const id = enc(run.detail.id);
  const others = run.snapshots.filter((s) => s.id !== snap.id);
  const pick = el(
    "select",
    { "aria-label": "Compare with" },
    others.map((s) => el("option", { value: s.id, text: snapshotLabel(s) })),
  );
  const actions = el(
    "div",
    { class: "actions" },
    others.length
      ? [
          pick,
          el("button", {
            type: "button",
            text: "Diff with this cut",
            onclick: () => {
              // Older against newer, whichever of the two was picked first.
              const other = run.snapshots.find((s) => s.id === pick.value);
              const [a, b] = other && other.seq > snap.seq ? [snap.id, other.id] : [pick.value, snap.id];
              location.hash = `#/runs/${id}/diff${query({ a, b })}`;
            },
          }),
        ]
      : null,
    run.detail.allow_fork === false
      ? null
      : el("button", { type: "button", class: "fork-btn", text: "Fork with edited state…", onclick: () => (location.hash = `#/runs/${id}/fork/${enc(snap.id)}`) }),
  );
  const agents = Object.entries(snap.agents).map(([name, agent]) =>
    el(
      "details",
      { class: "agent-state", open: true, dataset: { agent: name } },
      el("summary", null, el("strong", { text: name }), el("span", { class: "muted mono", text: ` ${String(agent.state_hash).slice(0, 12)}` }), " ", link(`#/runs/${id}/agents/${enc(name)}`, "history")),
      jsonTree(agent.state, { open: 1 }),
      agent.counters && Object.keys(agent.counters).length ? el("div", { class: "counters" }, el("span", { class: "muted", text: "counters " }), jsonTree(agent.counters, { open: 0 })) : null,
    ),
  );
  const channels = (snap.channels || []).map((c) =>
    el(
      "div",
      { class: "channel", dataset: { channel: `${c.src}>${c.dst}` } },
      el("h4", null, el("span", { text: c.src }), " → ", el("span", { text: c.dst }), ` · ${c.in_flight.length} in flight`),
      c.in_flight.map((m) => el("div", { class: "in-flight" }, el("span", { class: "mono", text: `#${m.seq} ${m.kind}` }), jsonTree(m.payload, { open: 0 }))),
    ),
  );
  put(clear(panel), 
    el("h2", null, `Cut S${snap.seq} `, statusBadge(snap.status)),
    el("p", { class: "facts" }, `started ${fmtTime(snap.started_at_us)} · completed ${fmtTime(snap.completed_at_us)} · `, el("span", { class: "mono", text: snap.id })),
    snap.error ? el("p", { class: "error-box", text: snap.error }) : null,
    actions,
    el("div", { class: "cut-grid" }, el("div", null, el("h3", { text: "Agents" }), agents), el("div", null, el("h3", { text: "Channels (messages in flight)" }), channels.length ? channels : el("p", { class: "muted", text: "No message was in flight." }))),
    el(
      "section",
      { class: "model-calls-since", dataset: { count: calls.calls.length } },
      el("h3", { text: `Model calls since ${calls.previous ? `S${calls.previous.seq}` : "the run began"}` }),
      calls.calls.length
        ? [el("p", { class: "facts", text: tokenTotals(calls.totals) }), modelCallsTable(calls.calls, { agent: true })]
        : el("p", { class: "muted", text: "No model call since the previous cut." }),
    ),
  );
}

async function agentPanel(panel, run, agent, signal) {
  const [body, calls] = await Promise.all([
    api(`${runPath(run.detail.id)}/agents/${enc(agent)}/history`, { signal }),
    api(`${runPath(run.detail.id)}/model-calls${query({ agent })}`, { signal }),
  ]);
  if (signal.aborted) return;
  const id = enc(run.detail.id);
  const byCut = new Map();
  for (const c of calls.calls) {
    const key = c.snapshot_id ?? "";
    if (!byCut.has(key)) byCut.set(key, []);
    byCut.get(key).push(c);
  }
  const callsOf = (key, label) => {
    const mine = byCut.get(key) || [];
    if (!mine.length) return null;
    return el("div", { class: "model-calls-since", dataset: { count: mine.length } }, el("h4", { text: `${label}: ${mine.length} model call(s)` }), modelCallsTable(mine));
  };
  let previous = null;
  const items = body.snapshots.map((s) => {
    const prev = previous;
    previous = s;
    return el(
      "details",
      { class: `history-item${s.changed ? " changed" : ""}`, open: s.changed, dataset: { snapshot: s.id } },
      el(
        "summary",
        null,
        el("strong", { text: `S${s.seq}` }),
        " ",
        statusBadge(s.status),
        el("span", { class: "mono muted", text: ` ${String(s.state_hash || "").slice(0, 12)} ` }),
        s.changed ? el("span", { class: "badge changed", text: "changed" }) : el("span", { class: "muted", text: "unchanged" }),
        prev ? [" ", link(`#/runs/${id}/diff${query({ a: prev.id, b: s.id, agent })}`, `diff with S${prev.seq}`)] : null,
      ),
      callsOf(s.id, prev ? `Since S${prev.seq}` : "Before this cut"),
      jsonTree(s.state, { open: 1 }),
    );
  });
  const after = callsOf("", "After the last cut");
  put(
    clear(panel),
    el("h2", null, "History of ", el("span", { class: "agent-name", text: body.agent })),
    calls.calls.length ? el("p", { class: "facts", text: `Model calls: ${tokenTotals(calls.totals)}` }) : null,
    items.length ? items : el("p", { class: "muted", text: "No snapshot records this agent." }),
    after,
  );
}

async function messagePanel(panel, run, src, dst, seq, signal) {
  const m = await api(`${runPath(run.detail.id)}/messages/${enc(src)}/${enc(dst)}/${enc(seq)}`, { signal });
  if (signal.aborted) return;
  put(clear(panel), 
    el("h2", null, "Message ", el("span", { text: m.src }), " → ", el("span", { text: m.dst }), ` #${m.seq}`),
    el("p", { class: "facts", text: `kind ${m.kind} · epoch ${m.epoch} · sent ${fmtTime(m.sent_us)} · delivered ${fmtTime(m.delivered_us)}${m.discarded ? " · discarded by a rollback" : ""}` }),
    el("h3", { text: "Payload" }),
    jsonTree(m.payload, { open: 2 }),
    el("h3", { text: "Headers" }),
    jsonTree(m.headers || {}, { open: 1 }),
  );
}

// Tools.

async function toolsPanel(panel, run, params, signal) {
  const id = enc(run.detail.id);
  const status = params.get("status") || "";
  const tool = params.get("tool") || "";
  const q = params.get("q") || "";
  const offset = Number(params.get("offset") || 0);
  const body = await api(`${runPath(run.detail.id)}/tools${query({ status, tool, q, limit: 200, offset })}`, { signal });
  const { resolveControl } = body.calls.some((c) => c.unknown) ? await import("./views/resolve.js") : {};
  if (signal.aborted) return;
  const form = el(
    "form",
    {
      class: "filters",
      onsubmit: (event) => {
        event.preventDefault();
        const data = new FormData(form);
        location.hash = `#/runs/${id}/tools${query({ status: data.get("status"), tool: data.get("tool"), q: data.get("q") })}`;
      },
    },
    el("input", { name: "q", type: "search", placeholder: "key, tool or agent", value: q, "aria-label": "Search tool calls" }),
    el("input", { name: "tool", placeholder: "tool", value: tool, "aria-label": "Tool" }),
    el(
      "select",
      { name: "status", "aria-label": "Status" },
      ["", "succeeded", "failed", "in_progress", "retryable", "unknown", "abandoned", "compensating", "compensated", "compensation_failed", "dry"].map((s) => el("option", { value: s, text: s || "any status", selected: s === status })),
    ),
    el("button", { type: "submit", text: "Filter" }),
  );
  const rows = body.calls.map((c) =>
    el(
      "tr",
      { class: c.unknown ? "unknown" : "", dataset: { key: c.key } },
      el("td", { class: "mono", text: c.key }),
      el("td", { text: c.tool }),
      el("td", { text: c.agent ?? "-" }),
      el("td", null, statusBadge(c.status), c.unknown ? [el("span", { class: "badge unknown", text: "outcome unknown" }), resolveControl(run.detail.id, c)] : null),
      el("td", { class: "num", text: c.attempts }),
      el("td", null, c.error ? el("div", { class: "error-text", text: c.error }) : null, c.outcome === null || c.outcome === undefined ? el("span", { class: "muted", text: "-" }) : jsonTree(c.outcome, { open: 0 })),
      el("td", { text: fmtTime(c.started_at_us) }),
      el("td", { text: fmtTime(c.finished_at_us) }),
    ),
  );
  const unknown = body.calls.filter((c) => c.unknown).length;
  put(clear(panel), 
    el("h2", { text: "Tool calls" }),
    form,
    unknown ? el("p", { class: "warn", role: "alert", text: `${unknown} call(s) on this page have an unknown outcome: the tool may or may not have acted.` }) : null,
    el(
      "table",
      { class: "tools" },
      el("thead", null, el("tr", null, ["Key", "Tool", "Agent", "Status", "Attempts", "Outcome", "Started", "Finished"].map((h) => el("th", { text: h })))),
      el("tbody", null, rows),
    ),
    el("p", { class: "muted" }, `${body.calls.length} of ${body.total} call(s)`, offset + body.calls.length < body.total ? [" · ", link(`#/runs/${id}/tools${query({ status, tool, q, offset: offset + 200 })}`, "next page")] : null),
  );
}

// Requests to people.

const ON_DEADLINE = {
  fail: "then the handler fails, and so the run",
  reject: "then it is turned down",
};

function deadlineText(r) {
  if (r.deadline_us === null || r.deadline_us === undefined) return "none";
  let then = ON_DEADLINE[r.on_deadline] || `then ${r.on_deadline}`;
  if (r.on_deadline === "default") {
    then = r.kind === "approval" ? `then ${r.default ? "approved" : "denied"} by default` : `then the default answer ${excerpt(r.default, 80)}`;
  }
  const overdue = r.status === "pending" && r.deadline_us < Date.now() * 1000 ? " (past: applied when the run next looks)" : "";
  return `${fmtTime(r.deadline_us)}, ${then}${overdue}`;
}

/** The question as text, or a tree of its JSON; an approval as its tool and arguments. */
function questionView(r) {
  const q = r.question;
  if (r.kind === "approval" && q && typeof q === "object" && !Array.isArray(q) && "tool" in q) {
    return el(
      "div",
      { class: "question" },
      el("p", null, "Call ", el("code", { class: "tool-name", text: String(q.tool) }), " with:"),
      jsonTree(q.arguments ?? null, { open: 3 }),
      q.key ? el("p", { class: "muted" }, "idempotency key ", el("code", { text: String(q.key) })) : null,
    );
  }
  if (typeof q === "string") return el("div", { class: "question" }, el("p", { class: "question-text", text: q }));
  return el("div", { class: "question" }, jsonTree(q, { open: 3 }));
}

/** The top-level properties of an object schema when each is simple enough for one input. */
function simpleFields(schema) {
  if (!schema || typeof schema !== "object" || schema.type !== "object") return null;
  const properties = schema.properties;
  if (!properties || typeof properties !== "object" || !Object.keys(properties).length) return null;
  if (schema.$ref || schema.anyOf || schema.oneOf || schema.allOf) return null;
  const required = new Set(schema.required || []);
  const fields = [];
  for (const [name, sub] of Object.entries(properties)) {
    if (!sub || typeof sub !== "object" || sub.$ref || sub.anyOf || sub.oneOf || sub.allOf) return null;
    let kind = null;
    if (Array.isArray(sub.enum) && sub.enum.every((v) => v === null || typeof v !== "object")) kind = "enum";
    else if (["string", "integer", "number", "boolean"].includes(sub.type)) kind = sub.type;
    if (!kind) return null;
    fields.push({ name, schema: sub, kind, required: required.has(name) });
  }
  return fields;
}

/** What the person types the answer in: an input per simple property, else JSON text. */
function answerEditor(r, onChange) {
  const schema = r.schema;
  const fields = simpleFields(schema);
  if (fields) {
    const inputs = fields.map((f) => {
      const attrs = { name: `field-${f.name}`, "aria-label": f.name, dataset: { field: f.name }, oninput: onChange, onchange: onChange };
      let input;
      if (f.kind === "enum" || f.kind === "boolean") {
        const options = f.kind === "enum" ? f.schema.enum : [true, false];
        input = el("select", attrs, el("option", { value: "", text: "-" }), options.map((v) => el("option", { value: JSON.stringify(v), text: typeof v === "string" ? v : JSON.stringify(v) })));
      } else if (f.kind === "integer" || f.kind === "number") {
        input = el("input", { ...attrs, type: "number", step: f.kind === "integer" ? "1" : "any" });
      } else {
        input = el("input", { ...attrs, type: "text" });
      }
      const label = el(
        "label",
        { class: "answer-field" },
        el("span", { class: "field-name", text: f.schema.title || f.name }),
        f.required ? el("span", { class: "required", text: " *" }) : null,
        input,
        f.schema.description ? el("span", { class: "muted", text: f.schema.description }) : null,
      );
      return { field: f, input, label };
    });
    return {
      node: el("div", { class: "answer-fields" }, inputs.map((i) => i.label)),
      read() {
        const value = {};
        const problems = [];
        for (const { field, input } of inputs) {
          const raw = input.value;
          if (raw === "") continue;
          if (field.kind === "enum" || field.kind === "boolean") value[field.name] = JSON.parse(raw);
          else if (field.kind === "integer" || field.kind === "number") {
            const n = Number(raw);
            if (Number.isNaN(n)) problems.push({ path: `$.${field.name}`, message: "must be a number" });
            else value[field.name] = n;
          } else value[field.name] = raw;
        }
        return { value, problems: problems.length ? problems : validateSchema(schema, value) };
      },
    };
  }
  const area = el("textarea", {
    class: "json-edit answer-json",
    name: "answer",
    spellcheck: "false",
    rows: 4,
    "aria-label": "Answer as JSON",
    placeholder: schema ? "the answer as JSON, fitting the schema above" : 'the answer as JSON: "text in double quotes", a number, an object…',
    oninput: onChange,
  });
  return {
    node: area,
    read() {
      if (!area.value.trim()) return { value: undefined, problems: [{ path: "$", message: "write the answer as JSON" }] };
      let value;
      try {
        value = JSON.parse(area.value);
      } catch (error) {
        return { value: undefined, problems: [{ path: "$", message: `not JSON: ${error.message}` }] };
      }
      return { value, problems: schema ? validateSchema(schema, value) : [] };
    },
  };
}

function answerForm(r) {
  const result = el("div", { class: "answer-result", role: "status" });
  const problems = el("ul", { class: "problems" });
  const by = el("input", { name: "by", placeholder: "your name (recorded with the answer)", "aria-label": "Answered by", value: localStorage.getItem("agentsnap.by") || "" });
  const reason = el("input", { name: "reason", class: "reason-input", placeholder: r.kind === "approval" ? "reason (the agent gets it; needed to deny)" : "reason, to decline", "aria-label": "Reason" });
  const buttons = [];

  const send = async (body) => {
    for (const b of buttons) b.disabled = true;
    clear(result);
    const name = by.value.trim();
    if (name) localStorage.setItem("agentsnap.by", name);
    try {
      const done = await api(`/api/requests/${enc(r.id)}/answer`, { method: "POST", body: { ...body, by: name || null } });
      state.flash = { id: r.id, status: done.request.status };
      state.run = null;
      route();
    } catch (error) {
      if (error.status === 403) {
        put(result, el("p", { class: "error-box", role: "alert", text: "This server does not answer requests: start it with `agentsnap ui --allow-answer`." }));
      } else if (error.status === 422) {
        put(result, el("p", { class: "error-box server-refusal", role: "alert" }, el("strong", { text: "The server refused the answer: " }), error.message));
      } else if (error.status === 409) {
        put(result, el("p", { class: "error-box", role: "alert" }, error.message, " ", el("button", { type: "button", class: "refresh", text: "Refresh", onclick: () => route() })));
      } else {
        put(result, errorBox(error));
      }
      check();
    }
  };

  let editor = null;
  let submit = null;
  const check = () => {
    if (!editor) {
      for (const b of buttons) b.disabled = false;
      return true;
    }
    const { problems: found } = editor.read();
    clear(problems);
    for (const p of found) put(problems, el("li", null, el("code", { text: p.path }), " ", p.message));
    for (const b of buttons) b.disabled = false;
    submit.disabled = found.length > 0;
    return found.length === 0;
  };

  const needReason = () => {
    if (reason.value.trim()) return true;
    clear(result);
    put(result, el("p", { class: "error-box", role: "alert", text: "Give a reason: the agent gets it." }));
    reason.focus();
    return false;
  };

  let controls;
  if (r.kind === "approval") {
    const approve = el("button", { type: "button", class: "primary approve", text: "Approve", onclick: () => send({ approve: true, reason: reason.value.trim() || null }) });
    const deny = el("button", { type: "button", class: "deny", text: "Deny", onclick: () => needReason() && send({ approve: false, reason: reason.value.trim() }) });
    buttons.push(approve, deny);
    controls = [el("div", { class: "actions" }, reason, by), el("div", { class: "actions" }, approve, deny)];
  } else {
    editor = answerEditor(r, () => check());
    submit = el("button", { type: "submit", class: "primary answer", text: "Answer" });
    const decline = el("button", { type: "button", class: "decline", text: "Decline", onclick: () => needReason() && send({ approve: false, reason: reason.value.trim() }) });
    buttons.push(submit, decline);
    controls = [
      r.schema ? null : el("p", { class: "muted", text: "No schema: any JSON is an answer." }),
      editor.node,
      problems,
      el("div", { class: "actions" }, by, submit),
      el("div", { class: "actions" }, reason, decline),
    ];
  }
  const form = el(
    "form",
    {
      class: "answer-form",
      onsubmit: (event) => {
        event.preventDefault();
        if (!editor || !check()) return;
        send({ answer: editor.read().value });
      },
    },
    controls,
    result,
  );
  check();
  return form;
}

function requestCard(r, canAnswer) {
  const pending = r.status === "pending";
  const settled = pending
    ? null
    : el(
        "div",
        { class: "settled" },
        el(
          "p",
          null,
          statusBadge(r.status),
          r.kind === "approval" && r.status === "answered" ? el("strong", { text: " approved" }) : null,
          r.kind === "approval" && r.status === "rejected" ? el("strong", { text: " denied" }) : null,
          " by ",
          el("span", { class: "answered-by", text: r.answered_by ?? "-" }),
          " at ",
          el("span", { class: "answered-at", text: fmtTime(r.answered_at_us) }),
        ),
        r.reason ? el("p", { class: "reason" }, "reason: ", el("span", { class: "reason-text", text: r.reason })) : null,
        r.kind !== "approval" && r.status !== "withdrawn" && r.status !== "rejected" ? el("div", { class: "answer" }, el("h4", { text: "Answer" }), jsonTree(r.answer, { open: 3 })) : null,
      );
  return el(
    "article",
    { class: `request ${pending ? "pending" : "settled"}`, dataset: { request: r.id, status: r.status, kind: r.kind } },
    el(
      "h3",
      null,
      el("span", { class: "badge kind", text: r.kind }),
      " ",
      statusBadge(r.status),
      " from ",
      link(`#/runs/${enc(r.run_id)}/agents/${enc(r.agent)}`, r.agent, "agent-link"),
      " ",
      el("span", { class: "mono muted", text: r.id }),
    ),
    el(
      "dl",
      { class: "request-facts" },
      el("dt", { text: "Asked" }),
      el("dd", { text: fmtTime(r.asked_at_us) }),
      el("dt", { text: "Who may answer" }),
      el("dd", { class: "who", text: r.who ?? "anyone" }),
      el("dt", { text: "Deadline" }),
      el("dd", { class: "deadline", text: deadlineText(r) }),
    ),
    questionView(r),
    r.schema ? el("details", { class: "schema" }, el("summary", { text: "Answer schema" }), jsonTree(r.schema, { open: 4 })) : null,
    settled,
    pending && canAnswer ? answerForm(r) : null,
  );
}

async function requestsPanel(panel, run, requests) {
  const body = requests || { requests: [], can_answer: false };
  const waiting = body.requests.filter((r) => r.status === "pending");
  const history = body.requests.filter((r) => r.status !== "pending").reverse();
  const flash = state.flash;
  state.flash = null;
  put(
    clear(panel),
    el("h2", null, "Waiting for a person ", el("button", { type: "button", class: "refresh", text: "Refresh", onclick: () => route() })),
    flash ? el("p", { class: "ok-box answer-done", role: "status", text: `Request ${shortId(flash.id)} is now ${flash.status}.` }) : null,
    waiting.length && !body.can_answer
      ? el("p", { class: "warn answer-off", text: "This server does not answer requests: start it with `agentsnap ui --allow-answer` to answer them here, or use `agentsnap answer ID`." })
      : null,
    waiting.length ? waiting.map((r) => requestCard(r, body.can_answer)) : el("p", { class: "muted", text: "No request waits." }),
    el("h2", { text: "History" }),
    history.length ? history.map((r) => requestCard(r, false)) : el("p", { class: "muted", text: "No request was answered, turned down, withdrawn or expired." }),
  );
}

// Diffs.

function diffMarks(diff) {
  // The paths a diff_states result names, for highlighting: memory.K, plan[i], fields K.
  const a = new Map();
  const b = new Map();
  const mark = (map, path, cls) => map.set(path.join("\u0000"), cls);
  for (const [part, prefix] of [["memory", ["memory"]], ["fields", []]]) {
    const m = diff[part];
    if (!m) continue;
    for (const key of Object.keys(m.added || {})) mark(b, [...prefix, key], "added");
    for (const key of Object.keys(m.removed || {})) mark(a, [...prefix, key], "removed");
    for (const key of Object.keys(m.changed || {})) {
      mark(a, [...prefix, key], "changed");
      mark(b, [...prefix, key], "changed");
    }
  }
  for (const step of diff.plan || []) {
    if (step.change !== "added") mark(a, ["plan", String(step.index)], step.change === "removed" ? "removed" : "changed");
    if (step.change !== "removed") mark(b, ["plan", String(step.index)], step.change === "added" ? "added" : "changed");
  }
  return [a, b];
}

function markToolCalls(state, diff, marks, side) {
  const calls = Array.isArray(state && state.tool_calls) ? state.tool_calls : [];
  const m = diff.tool_calls || {};
  calls.forEach((call, i) => {
    const key = call && call.key ? call.key : `#${i}`;
    let cls = null;
    if (key in (m.changed || {})) cls = "changed";
    else if (side === "a" && key in (m.removed || {})) cls = "removed";
    else if (side === "b" && key in (m.added || {})) cls = "added";
    if (cls) marks.set(["tool_calls", String(i)].join("\u0000"), cls);
  });
}

function changeList(diff) {
  const rows = [];
  for (const part of ["memory", "tool_calls", "fields"]) {
    const m = diff[part] || {};
    const where = (key) => (part === "fields" ? key : `${part}.${key}`);
    for (const [key, value] of Object.entries(m.added || {})) rows.push(["added", where(key), undefined, value]);
    for (const [key, value] of Object.entries(m.removed || {})) rows.push(["removed", where(key), value, undefined]);
    for (const [key, value] of Object.entries(m.changed || {})) rows.push(["changed", where(key), value.old, value.new]);
  }
  for (const step of diff.plan || []) rows.push([step.change, `plan[${step.index}]`, step.old ?? undefined, step.new ?? undefined]);
  return el(
    "table",
    { class: "changes" },
    el("thead", null, el("tr", null, ["Change", "Where", "Before", "After"].map((h) => el("th", { text: h })))),
    el(
      "tbody",
      null,
      rows.map(([change, where, before, after]) =>
        el("tr", { class: change }, el("td", { text: change }), el("td", { class: "mono", text: where }), el("td", { class: "mono", text: before === undefined ? "" : excerptJson(before, 200) }), el("td", { class: "mono", text: after === undefined ? "" : excerptJson(after, 200) })),
      ),
    ),
  );
}

async function diffPanel(panel, run, params, signal) {
  const id = enc(run.detail.id);
  const snaps = run.snapshots;
  const a = params.get("a") || (snaps.length > 1 ? snaps[snaps.length - 2].id : "");
  const b = params.get("b") || (snaps.length ? snaps[snaps.length - 1].id : "");
  const agent = params.get("agent") || "";
  const pick = (name, value) =>
    el("select", { name, "aria-label": name === "a" ? "Snapshot A" : "Snapshot B" }, snaps.map((s) => el("option", { value: s.id, text: snapshotLabel(s), selected: s.id === value })));
  const form = el(
    "form",
    {
      class: "filters",
      onsubmit: (event) => {
        event.preventDefault();
        const data = new FormData(form);
        location.hash = `#/runs/${id}/diff${query({ a: data.get("a"), b: data.get("b"), agent: data.get("agent") })}`;
      },
    },
    pick("a", a),
    " → ",
    pick("b", b),
    el(
      "select",
      { name: "agent", "aria-label": "Agent" },
      el("option", { value: "", text: "every agent" }),
      run.detail.agents.map((name) => el("option", { value: name, text: name, selected: name === agent })),
    ),
    el("button", { type: "submit", text: "Compare" }),
  );
  put(clear(panel), el("h2", { text: "Diff" }), form);
  if (!a || !b) {
    put(panel, el("p", { class: "muted", text: "This run has fewer than two snapshots." }));
    return;
  }
  const [diff, snapA, snapB] = await Promise.all([
    api(`${runPath(run.detail.id)}/diff${query({ a, b, agent })}`, { signal }),
    loadSnapshot(run.detail.id, a, signal),
    loadSnapshot(run.detail.id, b, signal),
  ]);
  if (signal.aborted) return;
  const sections = Object.entries(diff.agents || {}).map(([name, d]) => {
    const stateA = snapA.agents[name] ? snapA.agents[name].state : null;
    const stateB = snapB.agents[name] ? snapB.agents[name].state : null;
    const [marksA, marksB] = diffMarks(d);
    markToolCalls(stateA, d, marksA, "a");
    markToolCalls(stateB, d, marksB, "b");
    return el(
      "section",
      { class: "agent-diff", dataset: { agent: name } },
      el("h3", { text: name }),
      changeList(d),
      el(
        "div",
        { class: "side-by-side" },
        el("div", null, el("h4", { text: `S${snapA.seq}` }), stateA === null ? el("p", { class: "muted", text: "not in this cut" }) : jsonTree(stateA, { open: 1, marks: marksA })),
        el("div", null, el("h4", { text: `S${snapB.seq}` }), stateB === null ? el("p", { class: "muted", text: "not in this cut" }) : jsonTree(stateB, { open: 1, marks: marksB })),
      ),
    );
  });
  put(panel, 
    sections.length ? sections : el("p", { class: "muted", text: "No agent's state differs between these cuts." }),
    diff.channels && Object.keys(diff.channels).length ? [el("h3", { text: "Channels" }), jsonTree(diff.channels, { open: 1 })] : null,
  );
}

// Fork with an edited state.

async function forkPanel(panel, run, sid, signal) {
  const snap = await loadSnapshot(run.detail.id, sid, signal);
  if (signal.aborted) return;
  const schemas = run.detail.schemas || {};
  const editors = new Map();
  const submit = el("button", { type: "submit", class: "primary", text: "Create fork" });
  const result = el("div", { class: "fork-result", role: "status" });
  const nameInput = el("input", { name: "name", placeholder: "name of the fork (optional)", "aria-label": "Fork name" });
  const toolsSelect = el(
    "select",
    { name: "tools", "aria-label": "Tools when the fork runs" },
    el("option", { value: "dry", text: "dry: record side effects, run none (what-if)", selected: true }),
    el("option", { value: "live", text: "live: side effects run for real" }),
  );

  let messages = null;
  const check = () => {
    let ok = true;
    for (const editor of editors.values()) ok = editor.validate() && ok;
    if (messages) ok = messages.validate() && ok;
    submit.disabled = !ok;
    return ok;
  };

  const blocks = Object.entries(snap.agents).map(([name, agent]) => {
    const original = JSON.stringify(agent.state, null, 2);
    const area = el("textarea", { class: "json-edit", spellcheck: "false", rows: Math.min(24, original.split("\n").length + 1), "aria-label": `State of ${name}`, dataset: { agent: name } });
    area.value = original;
    const problems = el("ul", { class: "problems" });
    const badge = el("span", { class: "badge" });
    const editor = {
      area,
      original,
      value: undefined,
      validate() {
        clear(problems);
        let value;
        try {
          value = JSON.parse(area.value);
        } catch (error) {
          put(problems, el("li", { text: `not JSON: ${error.message}` }));
          return this.fail();
        }
        this.value = value;
        if (value === null || typeof value !== "object" || Array.isArray(value)) {
          put(problems, el("li", { text: "a state must be a JSON object" }));
          return this.fail();
        }
        const found = schemas[name] ? validateSchema(schemas[name], value) : [];
        for (const p of found) put(problems, el("li", null, el("code", { text: p.path }), " ", p.message));
        if (found.length) return this.fail();
        badge.textContent = area.value === original ? "unchanged" : schemas[name] ? "edited, valid" : "edited (no stored schema)";
        badge.className = "badge ok";
        area.classList.remove("invalid");
        return true;
      },
      fail() {
        badge.textContent = "invalid";
        badge.className = "badge invalid";
        area.classList.add("invalid");
        return false;
      },
      serverProblems(list) {
        for (const p of list) put(problems, el("li", { class: "server" }, "server: ", el("code", { text: p.path || "$" }), " ", p.message));
        this.fail();
      },
    };
    editors.set(name, editor);
    area.addEventListener("input", () => check());
    return el("div", { class: "fork-agent", dataset: { agent: name } }, el("h3", null, el("span", { text: name }), " ", badge, schemas[name] ? null : el("span", { class: "muted", text: " (no stored schema: checked by the server)" })), area, problems);
  });

  messages = forkMessages(snap, () => check());

  const form = el(
    "form",
    {
      class: "fork-form",
      onsubmit: async (event) => {
        event.preventDefault();
        if (!check()) return;
        const states = {};
        for (const [name, editor] of editors) if (editor.area.value !== editor.original) states[name] = editor.value;
        submit.disabled = true;
        clear(result);
        try {
          const body = await api(`${runPath(run.detail.id)}/fork`, { method: "POST", body: { snapshot: snap.id, states, name: nameInput.value || null, messages: messages.edits(), tools: toolsSelect.value } });
          const fork = body.run;
          state.run = null;
          put(result, 
            el("p", { class: "ok-box" }, "Created run ", link(`#/runs/${enc(fork.id)}`, fork.name || shortId(fork.id), "fork-link"), ` from S${snap.seq} of run `, link(`#/runs/${enc(run.detail.id)}`, run.detail.name || shortId(run.detail.id)), "."),
            el("p", { class: "lineage", text: `lineage: ${shortId(fork.parent_run_id)} @ S${snap.seq} → ${shortId(fork.id)}` }),
            el(
              "p",
              { class: "fork-next muted" },
              toolsSelect.value === "dry"
                ? "Its tools are dry: when it runs, side-effecting calls are recorded with their arguments and return the tools' stand-ins; nothing reaches the world. "
                : "Its tools are live: when it runs, side-effecting calls run for real, under new keys (a fork is another run). ",
              "Nothing runs yet: continue it with ",
              el("code", { text: `agentsnap resume ${fork.id} --app MODULE:FACTORY` }),
              ", or from a program that registers the same agents, with ",
              el("code", { text: `Runtime(store=..., run_id="${fork.id}").resume()` }),
              ".",
            ),
          );
        } catch (error) {
          if (error.status === 403) {
            put(result, el("p", { class: "error-box", text: "This server does not allow forks: start it with `agentsnap ui --allow-fork`." }));
          } else if (error.status === 422) {
            put(result, el("p", { class: "error-box", text: error.message }));
            for (const p of error.body.problems || []) {
              const editor = String(p.path || "").startsWith("message ") ? null : editors.get(p.agent);
              if (editor) editor.serverProblems([p]);
              else if (String(p.path || "").startsWith("message ")) messages.serverProblem(p);
              else put(result, el("p", { class: "error-box", text: `${p.agent ?? ""} ${p.path ?? ""} ${p.message}` }));
            }
          } else {
            put(result, errorBox(error));
          }
        } finally {
          submit.disabled = false;
        }
      },
    },
    el("p", { class: "muted", text: "Edit the states to start the fork from (JSON; checked against each agent's schema as you type). Unchanged agents keep their recorded state." }),
    blocks,
    messages.root,
    el("div", { class: "actions" }, nameInput, toolsSelect, submit),
    result,
  );
  put(clear(panel), el("h2", { text: `Fork from S${snap.seq}` }), run.detail.allow_fork === false ? el("p", { class: "error-box", text: "This server does not allow forks: start it with `agentsnap ui --allow-fork`." }) : form);
  check();
}

/**
 * The fork form's messages in flight: each can be dropped or given another payload, and
 * messages can be added between the cut's agents. The server checks them again.
 */
function forkMessages(snap, onChange) {
  const agents = Object.keys(snap.agents).filter((a) => a !== "$env").sort();
  const rows = [];
  const problems = el("ul", { class: "problems" });
  const flying = snap.channels.flatMap((c) => c.in_flight);
  for (const m of flying) {
    const original = JSON.stringify(m.payload, null, 2);
    const drop = el("input", { type: "checkbox", class: "drop-message", "aria-label": `Drop ${m.id}`, dataset: { message: m.id } });
    const area = el("textarea", { class: "json-edit message-edit", spellcheck: "false", rows: Math.min(8, original.split("\n").length + 1), "aria-label": `Payload of ${m.id}`, dataset: { message: m.id } });
    area.value = original;
    const badge = el("span", { class: "badge" });
    const row = el("div", { class: "fork-message", dataset: { message: m.id } }, el("h4", null, el("code", { text: m.id }), " ", el("span", { class: "muted", text: m.kind }), " ", badge), el("label", null, drop, " drop it (never delivered in the fork)"), area);
    drop.addEventListener("change", () => {
      area.disabled = drop.checked;
      onChange();
    });
    area.addEventListener("input", () => onChange());
    rows.push({ kind: "flying", id: m.id, drop, area, original, badge, row });
  }
  const list = el("div", { class: "fork-messages-list" }, rows.map((r) => r.row));
  const src = el("select", { "aria-label": "New message from" }, ["$env", ...agents].map((a) => el("option", { value: a, text: a })));
  const dst = el("select", { "aria-label": "New message to" }, agents.map((a) => el("option", { value: a, text: a })));
  const addArea = el("textarea", { class: "json-edit", rows: 3, spellcheck: "false", "aria-label": "New message payload" });
  addArea.value = "{}";
  const addButton = el("button", {
    type: "button",
    class: "add-message",
    text: "Add this message",
    onclick: () => {
      const original = addArea.value;
      const area = el("textarea", { class: "json-edit message-edit", rows: 3, spellcheck: "false", "aria-label": `Payload of the new message ${src.value}>${dst.value}` });
      area.value = original;
      const badge = el("span", { class: "badge" });
      const entry = { kind: "added", src: src.value, dst: dst.value, area, original, badge, row: null };
      const remove = el("button", { type: "button", text: "Remove", onclick: () => { rows.splice(rows.indexOf(entry), 1); entry.row.remove(); onChange(); } });
      entry.row = el("div", { class: "fork-message added", dataset: { added: `${src.value}>${dst.value}` } }, el("h4", null, el("code", { text: `${src.value}>${dst.value}` }), " ", el("span", { class: "muted", text: "added, after those in flight" }), " ", badge, " ", remove), area);
      area.addEventListener("input", () => onChange());
      rows.push(entry);
      list.appendChild(entry.row);
      onChange();
    },
  });
  const root = el(
    "section",
    { class: "fork-messages" },
    el("h3", { text: `Messages in flight (${flying.length})` }),
    flying.length ? null : el("p", { class: "muted", text: "None at this cut." }),
    list,
    agents.length ? el("div", { class: "add-message-form" }, el("span", { text: "Add a message from " }), src, el("span", { text: " to " }), dst, addArea, addButton) : null,
    problems,
  );
  const parse = (entry) => {
    try {
      entry.value = JSON.parse(entry.area.value);
      entry.badge.textContent = entry.kind === "added" ? "added" : entry.area.value === entry.original ? "" : "edited";
      entry.badge.className = entry.badge.textContent ? "badge ok" : "badge";
      entry.area.classList.remove("invalid");
      return true;
    } catch (error) {
      entry.badge.textContent = "not JSON";
      entry.badge.className = "badge invalid";
      entry.area.classList.add("invalid");
      return false;
    }
  };
  return {
    root,
    validate() {
      clear(problems);
      let ok = true;
      for (const entry of rows) {
        if (entry.kind === "flying" && entry.drop.checked) {
          entry.badge.textContent = "dropped";
          entry.badge.className = "badge invalid";
          entry.row.classList.add("dropped");
          continue;
        }
        if (entry.row) entry.row.classList.remove("dropped");
        ok = parse(entry) && ok;
      }
      return ok;
    },
    edits() {
      const out = { drop: [], edit: {}, add: [] };
      for (const entry of rows) {
        if (entry.kind === "flying") {
          if (entry.drop.checked) out.drop.push(entry.id);
          else if (entry.area.value !== entry.original) out.edit[entry.id] = entry.value;
        } else {
          out.add.push({ src: entry.src, dst: entry.dst, payload: entry.value });
        }
      }
      return out;
    },
    serverProblem(p) {
      put(problems, el("li", { class: "server" }, "server: ", el("code", { text: p.path }), " ", p.message));
    },
  };
}

// Bisect.

function bisectPanel(panel, run, params) {
  const id = enc(run.detail.id);
  const ops = ["==", "!=", "<", "<=", ">", ">=", "exists", "len==", "len<", "len<=", "len>", "len>="];
  const path = el("input", { name: "path", placeholder: "$.writer.memory", value: params.get("path") || "", required: true, "aria-label": "Path" });
  const op = el("select", { name: "op", "aria-label": "Operator" }, ops.map((o) => el("option", { value: o, text: o, selected: o === (params.get("op") || "==") })));
  const value = el("input", { name: "value", placeholder: "value (JSON, or text)", value: params.get("value") || "", "aria-label": "Value" });
  const out = el("div", { class: "bisect-result" });
  const form = el(
    "form",
    {
      class: "filters",
      onsubmit: async (event) => {
        event.preventDefault();
        let parsed = value.value;
        try {
          parsed = JSON.parse(value.value);
        } catch {
          parsed = value.value;
        }
        put(clear(out), el("p", { class: "muted", text: "bisecting…" }));
        try {
          const body = await api(`${runPath(run.detail.id)}/bisect`, { method: "POST", body: { path: path.value, op: op.value, value: op.value === "exists" ? null : parsed } });
          const summary = (label, s) =>
            el("p", { class: `bisect-${label.replace(/\s/g, "-")}` }, el("strong", { text: `${label}: ` }), s ? link(`#/runs/${id}/snapshots/${enc(s.id)}`, `S${s.seq}`) : "none", s ? ` (${s.status}, ${fmtTime(s.started_at_us)})` : "");
          put(clear(out), 
            summary("first bad", body.first_bad),
            summary("last good", body.last_good),
            el("p", { class: "muted", text: `${body.checked} snapshot(s) checked` }),
            body.diff ? [el("h3", { text: "What changed between them" }), body.diff.agents ? Object.entries(body.diff.agents).map(([name, d]) => el("section", { class: "agent-diff" }, el("h4", { text: name }), changeList(d))) : jsonTree(body.diff, { open: 2 })] : null,
          );
        } catch (error) {
          put(clear(out), errorBox(error));
        }
      },
    },
    path,
    op,
    value,
    el("button", { type: "submit", text: "Bisect" }),
  );
  put(clear(panel), el("h2", { text: "Bisect" }), el("p", { class: "muted", text: "Find the first snapshot where a condition over the agents' states stops holding: the path is JSONPath-style over {agent: state}." }), form, out);
}

// --- The static page (agentsnap timeline RUN -o run.html) ----------------------------------

function staticPage(data) {
  const main = view();
  const run = data.run;
  const source = new EmbeddedSource(data);
  const detail = el("pre", { class: "st-detail", text: "Click a cut or an arrow for its details." });
  const timeline = new SpaceTime({
    run,
    snapshots: data.snapshots,
    source,
    onCut: (s) => (detail.textContent = timeline.describe({ kind: "cut", item: s })),
    onMessage: (m) => (detail.textContent = timeline.describe({ kind: "message", item: m })),
    onAgent: (name) => (detail.textContent = `agent ${name}`),
  });
  window.agentsnap.timeline = timeline;
  put(clear(main), 
    el("h1", null, el("span", { class: "run-name", text: run.name || `run ${run.id}` }), " ", statusBadge(run.status)),
    el("p", { class: "facts", text: `${run.id} · ${run.agents.length} agent(s) · ${run.messages} message(s) · ${data.snapshots.length} snapshot(s) · ${data.events.rollbacks.length} rollback(s)` }),
    data.note ? el("p", { class: "muted", text: data.note }) : null,
    timeline.root,
    detail,
  );
  timeline.scheduleFetch();
  main.dataset.loaded = "true";
}

// --- Live ---------------------------------------------------------------------------------------

// A page follows what it shows: it asks the server for a token (GET /api/live) about once a
// second while a run runs (every few seconds otherwise) and redraws when the token moved on.
// A view with a form the user may be filling (a fork, a diff's choice, a bisect, an answer
// being typed) is never redrawn under them: the indicator offers the newer data instead.
const LIVE_FAST_MS = 1000;
const LIVE_SLOW_MS = 5000;
const live = { paused: false, drawn: null, stale: false, running: false, failed: false, timer: 0, busy: false, node: null, cost: 0 };

function liveRun(parts) {
  return parts[0] === "runs" && parts.length > 1 ? parts[1] : null;
}

async function liveToken(parts, signal) {
  const run = liveRun(parts);
  try {
    const body = await api(`/api/live${query({ run })}`, { signal });
    live.running = run === null || body.running === true;
    live.failed = false;
    return run === null ? body.runs : body.run;
  } catch (error) {
    if (error && error.name === "AbortError") throw error;
    live.failed = true;
    return null;
  }
}

function redrawable(main) {
  const { parts } = parseHash();
  const section = parts[0] === "runs" && parts.length > 1 ? parts[2] || "" : "list";
  if (!["list", "", "snapshots", "agents", "messages", "tools", "requests", "events"].includes(section)) return false;
  const active = document.activeElement;
  if (active && active !== document.body && main.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) return false;
  return !main.querySelector("[data-dirty='true']");
}

async function redraw() {
  state.run = null;
  const y = window.scrollY;
  const start = performance.now();
  await route();
  live.cost = performance.now() - start;
  window.scrollTo(0, y);
}

async function liveTick() {
  live.timer = 0;
  const main = view();
  if (!live.paused && !document.hidden && !live.busy && main && main.dataset.loaded === "true") {
    live.busy = true;
    const routed = location.hash;
    try {
      const token = await liveToken(parseHash().parts);
      if (location.hash === routed && main.dataset.loaded === "true" && token !== null && token !== live.drawn) {
        if (redrawable(main)) await redraw();
        else live.stale = true;
      }
    } catch {
      // An aborted poll: the page moved on, the next tick asks again.
    } finally {
      live.busy = false;
    }
  }
  showLive();
  // A redraw that took the server long (a big run's index read again) is not asked for
  // again at once: the page never keeps the server busier than about a quarter of the time.
  live.timer = setTimeout(liveTick, Math.max(live.running ? LIVE_FAST_MS : LIVE_SLOW_MS, 3 * live.cost));
}

function showLive() {
  const node = live.node;
  if (!node) return;
  const mode = live.paused ? "paused" : live.failed ? "offline" : live.stale ? "stale" : "live";
  node.dataset.state = mode;
  const text = {
    live: live.running ? "live" : "live (idle)",
    paused: "paused",
    offline: "server unreachable",
    stale: "newer data",
  }[mode];
  const label = node.querySelector(".live-text");
  label.textContent = text;
  node.querySelector(".live-pause").textContent = live.paused ? "Resume" : "Pause";
  node.querySelector(".live-reload").hidden = !live.stale;
}

function startLive() {
  const header = document.querySelector("header.top");
  if (!header) return;
  live.node = el(
    "span",
    { class: "live", id: "live", title: "The page follows the runs as they change" },
    el("span", { class: "live-dot", "aria-hidden": "true" }),
    el("span", { class: "live-text", role: "status" }),
    el("button", {
      type: "button",
      class: "live-reload",
      text: "Reload",
      hidden: true,
      onclick: () => redraw(),
    }),
    el("button", {
      type: "button",
      class: "live-pause",
      text: "Pause",
      onclick: () => {
        live.paused = !live.paused;
        showLive();
      },
    }),
  );
  header.insertBefore(live.node, document.getElementById("status"));
  // A form the user typed into is theirs until they send it or leave the page.
  view().addEventListener("input", (event) => {
    const form = event.target.closest && event.target.closest("form");
    if (form) form.dataset.dirty = "true";
  });
  showLive();
  live.timer = setTimeout(liveTick, LIVE_FAST_MS);
}

// --- Start ------------------------------------------------------------------------------------

// What the views in ./views/ use (they are loaded when first shown).
export { api, changeList, clear, diffMarks, el, enc, errorBox, excerptJson, fmtSpan, fmtTime, jsonTree, LabelRows, link, markToolCalls, put, query, route, runPath, shortId, statusBadge, TOP };

window.agentsnap = { SpaceTime, EmbeddedSource, ServerSource, validateSchema, jsonTree, timeline: null, route, live };

function start() {
  const embedded = document.getElementById("agentsnap-data");
  if (embedded) {
    staticPage(JSON.parse(embedded.textContent));
    return;
  }
  window.addEventListener("hashchange", route);
  startLive();
  document.addEventListener("keydown", (event) => {
    const target = event.target;
    if (target !== document.body || !state.timeline || !state.timeline.root.isConnected) return;
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (state.timeline.key(event.key)) event.preventDefault();
  });
  route();
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
