import { api, query } from "./api.js";
import { el } from "./dom.js";
import { parseHash, route } from "./router.js";
import { state, view } from "./views/common.js";

// A page follows what it shows: it asks the server for a token (GET /api/live) about once a
// second while a run runs (every few seconds otherwise) and redraws when the token moved on.
// A view with a form the user may be filling (a fork, a diff's choice, a bisect, an answer
// being typed) is never redrawn under them: the indicator offers the newer data instead.
const LIVE_FAST_MS = 1000;
const LIVE_SLOW_MS = 5000;
export const live = { paused: false, drawn: null, stale: false, running: false, failed: false, timer: 0, busy: false, node: null, cost: 0 };

function liveRun(parts) {
  return parts[0] === "runs" && parts.length > 1 ? parts[1] : null;
}

export async function liveToken(parts, signal) {
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

export function showLive() {
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

export function startLive() {
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
