// Actions on a run: resume and cancel.

import { actionToken, api, rememberToken, runPath } from "../api.js";
import { el, put, shortId } from "../dom.js";

/**
 * What can be done to the run from here: resume an interrupted (or created, or cancelled)
 * run, cancel a running one. Each asks for a confirmation that says what will happen; a
 * server not started with --allow-run shows the command that does the same instead.
 */
export function runActions(run, session) {
  const d = run.detail;
  const verb = d.status === "running" ? "cancel" : ["interrupted", "created", "cancelled"].includes(d.status) ? "resume" : null;
  if (!verb) return null;
  const command = (session.commands[verb] || `agentsnap ${verb} RUN`).replace("RUN", d.id);
  const box = el("div", { class: "run-actions", dataset: { action: verb } });
  if (!session.allow_run) {
    put(box, el("span", { class: "muted", text: verb === "resume" ? "To resume this run: " : "To cancel this run: " }), el("code", { class: "action-command", text: command }), el("span", { class: "muted", text: " (or start the inspector with --app MODULE:FACTORY --allow-run)" }));
    return box;
  }
  const what = verb === "resume"
    ? `Resume run ${shortId(d.id)}: a process of its own runs its app (${session.app || "the app given to --app"}) from the run's last complete snapshot, re-executing the handlers the stop interrupted in the order they were logged; recorded model calls are replayed, and side-effecting calls already made return their recorded outcomes${(d.metadata || {})["agentsnap.tools"] === "dry" ? " (this fork's tools are dry: nothing reaches the world)" : ""}.`
    : `Cancel run ${shortId(d.id)}: its process stops at its next lease renewal (within seconds), handlers under way finish, nothing more is delivered, and the run is recorded cancelled. It can be resumed later.`;
  const result = el("span", { class: "action-result", role: "status" });
  const tokenInput = session.token_required && !actionToken()
    ? el("input", { type: "password", class: "action-token", placeholder: "the server's token", "aria-label": "Token" })
    : null;
  const confirm = el("div", { class: "action-confirm", hidden: true },
    el("p", { text: what }),
    tokenInput,
    el("button", {
      type: "button",
      class: `confirm-${verb} primary`,
      text: verb === "resume" ? "Yes, resume it" : "Yes, cancel it",
      onclick: async (event) => {
        event.target.disabled = true;
        if (tokenInput && tokenInput.value) {
          rememberToken(tokenInput.value);
        }
        try {
          await api(`${runPath(d.id)}/${verb}`, { method: "POST" });
          confirm.hidden = true;
          delete box.dataset.dirty;
          result.textContent = verb === "resume" ? "Resuming: the page follows the run." : "Cancel requested: the run stops at its next lease renewal.";
          result.className = "action-result ok-box";
        } catch (error) {
          result.textContent = error.message;
          result.className = "action-result error-box";
          event.target.disabled = false;
        }
      },
    }),
    el("button", { type: "button", text: "No", onclick: () => { confirm.hidden = true; delete box.dataset.dirty; } }),
  );
  put(box,
    el("button", { type: "button", class: `action-${verb}`, text: verb === "resume" ? "Resume…" : "Cancel run…", onclick: () => { confirm.hidden = false; box.dataset.dirty = "true"; } }),
    " ",
    result,
    confirm,
  );
  return box;
}
