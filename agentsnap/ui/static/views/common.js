// What every view shares: the page's main element, the router's state and small badges.

import { el } from "../dom.js";

export const view = () => document.getElementById("view");
export const state = { run: null, timeline: null, timelineRun: null, route: null, controller: null, flash: null };

export function statusBadge(status) {
  return el("span", { class: `badge s-${String(status).replace(/[^a-z_]/gi, "")}`, text: status });
}

export function tags(list) {
  return el("span", { class: "tags" }, (list || []).map((tag) => el("span", { class: "tag", text: tag })));
}

export function errorBox(error) {
  return el("p", { class: "error-box", role: "alert", text: error.message || String(error) });
}
