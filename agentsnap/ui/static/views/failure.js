// A failed run's error: the reason it ended with and the stored traceback (the handler
// failures' and the one that ended the run, with their exception chain), shown first on the
// run's page.

import { el, enc, link } from "../dom.js";

/**
 * The error of a failed run, open on the run's first view (`open`), folded on the others.
 * Returns null for a run that did not fail.
 */
export function failureBox(detail, open) {
  if (detail.status !== "failed") return null;
  const id = enc(detail.id);
  const trace = detail.traceback
    ? el("details", { class: "traceback-box", open },
        el("summary", { text: "Traceback" }),
        el("pre", { class: "traceback", tabindex: "0", text: detail.traceback }))
    : el("p", { class: "muted", text: "No traceback was stored (the run failed before tracebacks were kept, or in no handler)." });
  return el(
    "section",
    { class: "run-failure", role: "alert", "aria-label": "Why the run failed" },
    el("h2", { text: "This run failed" }),
    el("p", { class: "failure-reason", text: detail.reason || "(no reason recorded)" }),
    trace,
    el("p", { class: "muted" }, "See the ", link(`#/runs/${id}/events`, "events"), " and the ", link(`#/runs/${id}/snapshots`, "snapshots"), " before it."),
  );
}
