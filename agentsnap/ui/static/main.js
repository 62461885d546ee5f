// agentsnap inspector: a single page over the inspector's JSON API. This is the entry of
// index.html; `agentsnap timeline RUN -o run.html` has its own (timeline_page.js).
//
// Plain ES modules, no build step. Every piece of text that comes from a run (agent names,
// run names, payloads, reasons) is inserted with textContent, createTextNode or canvas
// fillText: never as HTML.

import { jsonTree } from "./json_tree.js";
import { live, startLive } from "./live.js";
import { route } from "./router.js";
import { validateSchema } from "./schema.js";
import { ServerSource } from "./server_source.js";
import { EmbeddedSource } from "./sources.js";
import { SpaceTime } from "./spacetime.js";
import { state } from "./views/common.js";

window.agentsnap = { SpaceTime, EmbeddedSource, ServerSource, validateSchema, jsonTree, timeline: null, route, live };

function start() {
  window.addEventListener("hashchange", route);
  startLive();
  document.addEventListener("keydown", (event) => {
    const target = event.target;
    if (target !== document.body || !state.timeline || !state.timeline.root.isConnected) return;
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (state.timeline.key(event.key)) event.preventDefault();
  });
  route();
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
