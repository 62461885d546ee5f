// The list of runs.

import { api, query } from "../api.js";
import { clear, el, enc, fmtTime, link, put, shortId } from "../dom.js";
import { state, statusBadge, tags } from "./common.js";
import { choiceSelect, filterForm } from "./filters.js";

export async function runsView(main, params, signal) {
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
  const form = filterForm(
    "/runs",
    ["q", "status", "tag"],
    "filters",
    el("input", { name: "q", type: "search", placeholder: "id prefix or name", value: q, "aria-label": "Search runs" }),
    // The values of agentsnap.RunStatus, which the API's status filter takes.
    choiceSelect("status", "Status", ["running", "succeeded", "failed", "interrupted", "cancelled", "created"], status, "any status"),
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
