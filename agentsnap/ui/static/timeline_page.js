// The page of `agentsnap timeline RUN -o run.html`: the inspector's space-time view over the
// run embedded in the page, with no server and no network. The export inlines this module and
// the modules it imports, nothing else (see agentsnap/timeline.py).

import { clear, el, put } from "./dom.js";
import { EmbeddedSource } from "./sources.js";
import { SpaceTime } from "./spacetime.js";
import { statusBadge, view } from "./views/common.js";

function staticPage(data) {
  const main = view();
  const run = data.run;
  const source = new EmbeddedSource(data);
  const detail = el("pre", { class: "st-detail", text: "Click a cut or an arrow for its details." });
  const timeline = new SpaceTime({
    run,
    snapshots: data.snapshots,
    source,
    onCut: (s) => (detail.textContent = timeline.describe({ kind: "cut", item: s })),
    onMessage: (m) => (detail.textContent = timeline.describe({ kind: "message", item: m })),
    onAgent: (name) => (detail.textContent = `agent ${name}`),
  });
  window.agentsnap.timeline = timeline;
  put(clear(main), 
    el("h1", null, el("span", { class: "run-name", text: run.name || `run ${run.id}` }), " ", statusBadge(run.status)),
    el("p", { class: "facts", text: `${run.id} · ${run.agents.length} agent(s) · ${run.messages} message(s) · ${data.snapshots.length} snapshot(s) · ${data.events.rollbacks.length} rollback(s)` }),
    data.note ? el("p", { class: "muted", text: data.note }) : null,
    timeline.root,
    detail,
  );
  timeline.scheduleFetch();
  main.dataset.loaded = "true";
}

window.agentsnap = { SpaceTime, EmbeddedSource, timeline: null };

function start() {
  staticPage(JSON.parse(document.getElementById("agentsnap-data").textContent));
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
