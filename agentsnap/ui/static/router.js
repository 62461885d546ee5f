// The router: the page's hash names the view to draw.

import { clear, setStatus } from "./dom.js";
import { live, liveToken, showLive } from "./live.js";
import { errorBox, state, view } from "./views/common.js";
import { runView } from "./views/run.js";
import { runsView } from "./views/runs.js";

export function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/runs";
  const [pathPart, queryPart] = raw.split("?");
  const parts = pathPart.split("/").filter(Boolean).map((p) => decodeURIComponent(p));
  const params = new URLSearchParams(queryPart || "");
  return { parts, params };
}

export async function route() {
  if (state.controller) state.controller.abort();
  const controller = new AbortController();
  state.controller = controller;
  const { parts, params } = parseHash();
  const main = view();
  main.dataset.loaded = "false";
  setStatus("");
  // Taken before the data it stands for: a change in between only costs one more redraw.
  const token = liveToken(parts, controller.signal);
  // A view left before it was drawn never awaits its token: its abort is nobody's error.
  token.catch(() => null);
  try {
    if (parts[0] !== "runs" || parts.length === 1) {
      await runsView(main, params, controller.signal);
    } else {
      await runView(main, parts.slice(1), params, controller.signal);
    }
    if (!controller.signal.aborted) {
      live.drawn = await token;
      live.stale = false;
      showLive();
      main.dataset.loaded = "true";
    }
  } catch (error) {
    if (error && error.name === "AbortError") return;
    clear(main).appendChild(errorBox(error));
    main.dataset.loaded = "error";
  }
}
