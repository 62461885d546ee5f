// Bisect: the first snapshot where a condition stops holding.

import { api, runPath } from "../api.js";
import { clear, el, enc, fmtTime, link, put } from "../dom.js";
import { jsonTree } from "../json_tree.js";
import { errorBox } from "./common.js";
import { changeList } from "./diff.js";

export function bisectPanel(panel, run, params) {
  const id = enc(run.detail.id);
  const ops = ["==", "!=", "<", "<=", ">", ">=", "exists", "len==", "len<", "len<=", "len>", "len>="];
  const path = el("input", { name: "path", placeholder: "$.writer.memory", value: params.get("path") || "", required: true, "aria-label": "Path" });
  const op = el("select", { name: "op", "aria-label": "Operator" }, ops.map((o) => el("option", { value: o, text: o, selected: o === (params.get("op") || "==") })));
  const value = el("input", { name: "value", placeholder: "value (JSON, or text)", value: params.get("value") || "", "aria-label": "Value" });
  const out = el("div", { class: "bisect-result" });
  const form = el(
    "form",
    {
      class: "filters",
      onsubmit: async (event) => {
        event.preventDefault();
        let parsed = value.value;
        try {
          parsed = JSON.parse(value.value);
        } catch {
          parsed = value.value;
        }
        put(clear(out), el("p", { class: "muted", text: "bisecting…" }));
        try {
          const body = await api(`${runPath(run.detail.id)}/bisect`, { method: "POST", body: { path: path.value, op: op.value, value: op.value === "exists" ? null : parsed } });
          const summary = (label, s) =>
            el("p", { class: `bisect-${label.replace(/\s/g, "-")}` }, el("strong", { text: `${label}: ` }), s ? link(`#/runs/${id}/snapshots/${enc(s.id)}`, `S${s.seq}`) : "none", s ? ` (${s.status}, ${fmtTime(s.started_at_us)})` : "");
          put(clear(out), 
            summary("first bad", body.first_bad),
            summary("last good", body.last_good),
            el("p", { class: "muted", text: `${body.checked} snapshot(s) checked` }),
            body.diff ? [el("h3", { text: "What changed between them" }), body.diff.agents ? Object.entries(body.diff.agents).map(([name, d]) => el("section", { class: "agent-diff" }, el("h4", { text: name }), changeList(d))) : jsonTree(body.diff, { open: 2 })] : null,
          );
        } catch (error) {
          put(clear(out), errorBox(error));
        }
      },
    },
    path,
    op,
    value,
    el("button", { type: "submit", text: "Bisect" }),
  );
  put(clear(panel), el("h2", { text: "Bisect" }), el("p", { class: "muted", text: "Find the first snapshot where a condition over the agents' states stops holding: the path is JSONPath-style over {agent: state}." }), form, out);
}
