// Model calls: what agents asked their models.

import { el, excerpt, fmtTime } from "../dom.js";
import { jsonTree } from "../json_tree.js";

// Model calls: what agents asked their models, shown under a cut or an agent's history.

function fmtLatency(ms) {
  if (ms < 10) return `${ms.toFixed(1)} ms`;
  return ms >= 10000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms)} ms`;
}

/** A small table of model calls; each answer opens to the whole request and answer. */
export function modelCallsTable(calls, options = {}) {
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

export function tokenTotals(totals) {
  return `${totals.calls} call(s) · ${totals.input_tokens} tokens in · ${totals.output_tokens} out`;
}
