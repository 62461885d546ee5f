// The event history: a run's handler executions as a table (what `agentsnap events RUN`
// prints), filtered by agent, kind, status and text in payloads and states, each row linked
// to its message in the space-time view and to the cuts before and after it.
//
// Every piece of text that comes from a run is inserted as text, never as HTML.

import { api, query, runPath } from "../api.js";
import { clear, el, enc, excerptJson, fmtTime, link, put, shortId } from "../dom.js";
import { statusBadge } from "./common.js";
import { choiceSelect, filterForm } from "./filters.js";

const PAGE = 200;

function fmtDuration(ms) {
  if (ms === null || ms === undefined) return "-";
  if (ms < 10) return `${ms.toFixed(1)} ms`;
  return ms < 10000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(1)} s`;
}

function snapshotName(run, sid) {
  const found = run.snapshots.find((s) => s.id === sid);
  return found ? `S${found.seq}` : shortId(sid);
}

function cutLink(run, sid, word) {
  if (!sid) return el("span", { class: "muted", text: `${word} -` });
  return link(`#/runs/${enc(run.detail.id)}/snapshots/${enc(sid)}`, `${word} ${snapshotName(run, sid)}`, `cut-${word}`);
}

function sentList(row) {
  if (!row.sent.length) return el("span", { class: "muted", text: "-" });
  return el("ul", { class: "sent" }, row.sent.map((m) => el("li", null, el("span", { class: "mono", text: `→ ${m.to} #${m.seq}` }), " ", el("span", { class: "muted", text: m.kind }), " ", el("span", { class: "payload", text: excerptJson(m.payload, 60) }))));
}

function toolList(run, row) {
  if (!row.tool_calls.length) return null;
  return el("ul", { class: "calls" }, row.tool_calls.map((c) =>
    el("li", null, link(`#/runs/${enc(run.detail.id)}/tools${query({ q: c.key })}`, c.tool, "tool-link"), " ", statusBadge(c.status))));
}

function modelList(row) {
  if (!row.model_calls.length) return null;
  return el("ul", { class: "calls" }, row.model_calls.map((c) =>
    el("li", { text: `${c.model || "model"} #${c.position} · ${c.latency_ms === null ? "-" : fmtDuration(c.latency_ms)} · ${c.input_tokens}+${c.output_tokens} tok${c.replays ? ` · replayed ${c.replays}×` : ""}` })));
}

/** The run's executions at `#/runs/RUN/events?agent=&kind=&status=&q=`. */
export async function eventsPanel(panel, run, params, signal) {
  const id = enc(run.detail.id);
  const agent = params.get("agent") || "";
  const kind = params.get("kind") || "";
  const status = params.get("status") || "";
  const q = params.get("q") || "";
  const offset = Number(params.get("offset") || 0);
  const body = await api(`${runPath(run.detail.id)}/executions${query({ agent, kind, status, q, limit: PAGE, offset })}`, { signal });
  if (signal.aborted) return;
  const choice = (name, label, values, chosen) => choiceSelect(name, label, values, chosen, `any ${name}`);
  const form = filterForm(
    `/runs/${id}/events`,
    ["agent", "kind", "status", "q"],
    "filters events-filters",
    choice("agent", "Agent", body.agents, agent),
    choice("kind", "Kind", body.kinds, kind),
    choice("status", "Status", body.statuses, status),
    el("input", { name: "q", type: "search", placeholder: "text in payloads and states", value: q, "aria-label": "Search executions" }),
    el("button", { type: "submit", text: "Filter" }),
    agent || kind || status || q ? link(`#/runs/${id}/events`, "clear", "clear-filters") : null,
  );
  const rows = body.executions.map((row) =>
    el(
      "tr",
      { class: `execution e-${row.status}`, dataset: { index: row.index, agent: row.agent } },
      el("td", { class: "num", text: row.index }),
      el("td", { class: "agent", text: row.agent }),
      el(
        "td",
        null,
        link(`#/runs/${id}/messages/${enc(row.src)}/${enc(row.dst)}/${enc(row.seq)}`, row.message, "message-link mono"),
        row.kind ? [" ", el("span", { class: "muted", text: row.kind })] : null,
        el("div", { class: "payload", text: excerptJson(row.payload, 120) }),
      ),
      el("td", null, sentList(row)),
      el("td", null, toolList(run, row), modelList(row)),
      el("td", { text: fmtTime(row.started_at_us) }),
      el("td", { class: "num", text: fmtDuration(row.duration_ms) }),
      el("td", { class: "num", text: row.timeline }),
      el("td", null, statusBadge(row.status), row.reexecuted ? el("div", { class: "muted", text: "re-executed" }) : null),
      el(
        "td",
        { class: "cuts" },
        cutLink(run, row.cut_before, "before"),
        " ",
        cutLink(run, row.cut_after, "after"),
        row.cut_before && row.cut_after ? [" ", link(`#/runs/${id}/diff${query({ a: row.cut_before, b: row.cut_after, agent: row.agent })}`, "diff", "cut-diff")] : null,
      ),
    ),
  );
  const table = el(
    "table",
    { class: "events" },
    el("thead", null, el("tr", null, ["#", "Agent", "Message taken", "Sent", "Tool and model calls", "Started", "Duration", "Timeline", "Status", "Cuts"].map((h) => el("th", { text: h })))),
    el("tbody", null, rows),
  );
  const pager = el("p", { class: "muted events-count" }, `${body.executions.length} of ${body.total} execution(s)`);
  if (offset + body.executions.length < body.total) {
    put(pager, " · ", link(`#/runs/${id}/events${query({ agent, kind, status, q, offset: offset + PAGE })}`, "next page"));
  }
  put(
    clear(panel),
    el("h2", { text: "Events: handler executions" }),
    el("p", { class: "muted", text: "Each time an agent takes a message its handler runs once. A row links to its message in the space-time view and to the cuts before and after it; discarded: a rollback undid it." }),
    form,
    body.executions.length ? table : el("p", { class: "muted", text: "No execution matches." }),
    pager,
  );
}
