// The space-time view: agents as lanes, messages as arrows, cuts, rollbacks and tool calls.

import { clear, el, fmtSpan, fmtTime, shortId } from "./dom.js";

const LANE = 30;
export const TOP = 58; // room for the cuts' labels (two rows) and the rollbacks' (one row)
const CUT_LABEL_ROWS = [TOP - 30, TOP - 43]; // baselines, tried in this order
const ROLLBACK_LABEL_ROW = TOP - 17;

/**
 * Where labels go on a row of the canvas without overlapping: each placed label keeps its
 * horizontal span; a label that fits on no row is left out (the hit area and the tooltip
 * still tell what is there).
 */
export class LabelRows {
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
export class SpaceTime {
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
    this.due = false; // a fetch is scheduled and has not started
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

  // ``data-loading`` is on the canvas from the moment a fetch is due until its data came:
  // a page (or a test) that waits for it to go sees the window it asked for drawn.
  scheduleFetch() {
    clearTimeout(this.timer);
    this.due = false;
    if (!this.needsFetch()) {
      this.loaded();
      return;
    }
    this.due = true;
    this.canvas.dataset.loading = "true";
    const delay = this.data ? 120 : 0;
    this.timer = setTimeout(() => this.fetchWindow(), delay);
  }

  loaded() {
    if (!this.due && !this.pending) delete this.canvas.dataset.loading;
  }

  async fetchWindow() {
    this.due = false;
    if (!this.needsFetch()) {
      this.loaded();
      return;
    }
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
        this.loaded();
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
