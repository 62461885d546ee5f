// The difference between two snapshots.

import { api, query, runPath } from "../api.js";
import { clear, el, enc, excerptJson, put } from "../dom.js";
import { jsonTree } from "../json_tree.js";
import { filterForm } from "./filters.js";
import { loadSnapshot, snapshotLabel } from "./snapshots.js";

export function diffMarks(diff) {
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

export function markToolCalls(state, diff, marks, side) {
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

export function changeList(diff) {
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

export async function diffPanel(panel, run, params, signal) {
  const id = enc(run.detail.id);
  const snaps = run.snapshots;
  const a = params.get("a") || (snaps.length > 1 ? snaps[snaps.length - 2].id : "");
  const b = params.get("b") || (snaps.length ? snaps[snaps.length - 1].id : "");
  const agent = params.get("agent") || "";
  const pick = (name, value) =>
    el("select", { name, "aria-label": name === "a" ? "Snapshot A" : "Snapshot B" }, snaps.map((s) => el("option", { value: s.id, text: snapshotLabel(s), selected: s.id === value })));
  const form = filterForm(
    `/runs/${id}/diff`,
    ["a", "b", "agent"],
    "filters",
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
