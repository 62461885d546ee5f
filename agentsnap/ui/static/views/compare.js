// A fork beside its parent, from the snapshot it was forked at: the states at corresponding
// cuts (the fork point and the fork's copy of it, then each side's following snapshots in
// order), the side-effecting tool calls paired where agent, tool and arguments agree (a dry
// fork's show `dry`), and the model calls paired by agent, message and position.

import { api, runPath } from "../api.js";
import { clear, el, enc, excerptJson, fmtTime, link, put, shortId } from "../dom.js";
import { jsonTree } from "../json_tree.js";
import { statusBadge } from "./common.js";
import { changeList, diffMarks, markToolCalls } from "./diff.js";

function side(runId, snap) {
  if (!snap) return el("span", { class: "muted", text: "no cut" });
  return link(`#/runs/${enc(runId)}/snapshots/${enc(snap.id)}`, `S${snap.seq}`);
}

function cutSection(body, pair) {
  const differing = pair.agents.filter((a) => !a.same);
  const rows = pair.agents.map((a) => {
    const [marksA, marksB] = diffMarks(a.diff);
    markToolCalls(a.parent, a.diff, marksA, "a");
    markToolCalls(a.fork, a.diff, marksB, "b");
    return el(
      "details",
      { class: `compare-agent ${a.same ? "same" : "differs"}`, dataset: { agent: a.agent }, open: !a.same && differing.length <= 3 },
      el("summary", null, el("span", { class: "agent", text: a.agent }), " ", el("span", { class: `badge ${a.same ? "s-succeeded" : "s-interrupted"}`, text: a.same ? "same" : "differs" })),
      a.same ? null : changeList(a.diff),
      el(
        "div",
        { class: "side-by-side" },
        el("div", null, el("h4", { text: "parent" }), a.parent === null ? el("p", { class: "muted", text: "not in this cut" }) : jsonTree(a.parent, { open: 1, marks: marksA })),
        el("div", null, el("h4", { text: "fork" }), a.fork === null ? el("p", { class: "muted", text: "not in this cut" }) : jsonTree(a.fork, { open: 1, marks: marksB })),
      ),
    );
  });
  return el(
    "section",
    { class: "compare-cut", dataset: { index: pair.index } },
    el("h3", null, pair.index === 0 ? "Fork point: " : `Cut ${pair.index}: `, "parent ", side(body.parent.id, pair.parent), " · fork ", side(body.fork.id, pair.fork), ` · ${differing.length} agent(s) differ`),
    rows,
  );
}

function callCell(call, what) {
  if (!call) return el("td", { class: "muted", text: "-" });
  return el("td", null, statusBadge(call.status), " ", what(call));
}

function toolTable(rows) {
  const what = (c) => [el("span", { text: `${c.tool} (${c.agent ?? "-"})` }), el("div", { class: "mono muted", text: excerptJson(c.arguments, 100) }), el("div", { class: "mono", text: c.error ? c.error : excerptJson(c.result, 100) })];
  return el(
    "table",
    { class: "compare-tools" },
    el("thead", null, el("tr", null, ["Parent", "Fork"].map((h) => el("th", { text: h })))),
    el("tbody", null, rows.map((r) => el("tr", { class: r.parent && r.fork ? "paired" : "alone" }, callCell(r.parent, what), callCell(r.fork, what)))),
  );
}

function modelTable(rows) {
  const what = (c) => [el("span", { text: `${c.model} · ${c.agent} #${c.position} · ${fmtTime(c.started_at ? Date.parse(c.started_at) * 1000 : null)}` }), el("div", { class: "muted", text: c.answer })];
  return el(
    "table",
    { class: "compare-models" },
    el("thead", null, el("tr", null, ["Parent", "Fork"].map((h) => el("th", { text: h })))),
    el("tbody", null, rows.map((r) => el("tr", null, callCell(r.parent && { ...r.parent, status: r.parent.discarded ? "discarded" : "answered" }, what), callCell(r.fork && { ...r.fork, status: r.fork.discarded ? "discarded" : "answered" }, what)))),
  );
}

/** `#/runs/FORK/compare`: the fork beside its parent. */
export async function comparePanel(panel, run, params, signal) {
  const body = await api(`${runPath(run.detail.id)}/compare`, { signal });
  if (signal.aborted) return;
  put(
    clear(panel),
    el("h2", null, "Fork ", link(`#/runs/${enc(body.fork.id)}`, body.fork.name || shortId(body.fork.id)), " beside its parent ", link(`#/runs/${enc(body.parent.id)}`, body.parent.name || shortId(body.parent.id))),
    el("p", { class: "facts" }, `forked at snapshot S${body.fork_point.seq} · the fork's tools are `, el("strong", { class: `tools-${body.fork.tools}`, text: body.fork.tools }), " · fork ", statusBadge(body.fork.status), " · parent ", statusBadge(body.parent.status)),
    el("h3", { text: "States at corresponding cuts" }),
    body.cuts.map((pair) => cutSection(body, pair)),
    el("h3", { text: `Side-effecting tool calls after the fork point (${body.tool_calls.length})` }),
    body.tool_calls.length ? toolTable(body.tool_calls) : el("p", { class: "muted", text: "Neither side made one." }),
    el("h3", { text: `Model calls after the fork point (${body.model_calls.length})` }),
    body.model_calls.length ? modelTable(body.model_calls) : el("p", { class: "muted", text: "Neither side made one (or none were recorded)." }),
  );
}
