// Snapshots, a cut's agents and channels, an agent's history and one message.

import { api, query, runPath } from "../api.js";
import { clear, el, enc, fmtTime, link, put } from "../dom.js";
import { jsonTree } from "../json_tree.js";
import { statusBadge } from "./common.js";
import { modelCallsTable, tokenTotals } from "./model_calls.js";

export function snapshotLabel(s) {
  return `S${s.seq} (${s.status}) · ${fmtTime(s.started_at_us)}`;
}

export function snapshotsPanel(panel, run) {
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

export async function loadSnapshot(runId, sid, signal) {
  const key = `${runId}|${sid}`;
  if (!snapshotCache.has(key)) {
    const promise = api(`${runPath(runId)}/snapshots/${enc(sid)}`, { signal });
    snapshotCache.set(key, promise);
    promise.catch(() => snapshotCache.delete(key));
  }
  return snapshotCache.get(key);
}

export async function cutPanel(panel, run, sid, signal) {
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

export async function agentPanel(panel, run, agent, signal) {
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

export async function messagePanel(panel, run, src, dst, seq, signal) {
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
