// Tool calls of the ledger.

import { api, query, runPath } from "../api.js";
import { clear, el, enc, fmtTime, link, put } from "../dom.js";
import { jsonTree } from "../json_tree.js";
import { statusBadge } from "./common.js";
import { choiceSelect, filterForm } from "./filters.js";
import { resolveControl } from "./resolve.js";

export async function toolsPanel(panel, run, params, signal) {
  const id = enc(run.detail.id);
  const status = params.get("status") || "";
  const tool = params.get("tool") || "";
  const q = params.get("q") || "";
  const offset = Number(params.get("offset") || 0);
  const body = await api(`${runPath(run.detail.id)}/tools${query({ status, tool, q, limit: 200, offset })}`, { signal });
  if (signal.aborted) return;
  const form = filterForm(
    `/runs/${id}/tools`,
    ["status", "tool", "q"],
    "filters",
    el("input", { name: "q", type: "search", placeholder: "key, tool or agent", value: q, "aria-label": "Search tool calls" }),
    el("input", { name: "tool", placeholder: "tool", value: tool, "aria-label": "Tool" }),
    choiceSelect("status", "Status", ["succeeded", "failed", "in_progress", "retryable", "unknown", "abandoned", "compensating", "compensated", "compensation_failed", "dry"], status, "any status"),
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
