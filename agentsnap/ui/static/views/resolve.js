// Resolving a tool call whose outcome is unknown: a person checks the outside system and
// records what happened (it succeeded, with its result; it failed; try it again). A write,
// under the rules of the run actions: a server started with --allow-run takes it with its
// token, any other shows the exact `agentsnap tools resolve` command instead.

import { api, runPath } from "../api.js";
import { el, put } from "../dom.js";
import { route } from "../router.js";

// [outcome, label, what the record says, what it does]
const OUTCOMES = [
  ["succeeded", "It happened", "happened", "later calls with this key return the result you give, without running the tool"],
  ["failed", "It did not happen", "did not happen", "later calls with this key fail with the error you give"],
  ["retry", "Try it again", "did not happen and is to be tried again", "the next call with this key runs the tool again"],
];

/** The cell of an unknown call's row in the tools table: a resolve form, or the commands. */
export function resolveControl(runId, call) {
  const box = el("div", { class: "resolve", dataset: { key: call.key } });
  const opener = el("button", {
    type: "button",
    class: "action-resolve",
    text: "Resolve…",
    onclick: async () => {
      opener.disabled = true;
      try {
        const told = await api(`${runPath(runId)}/tools/resolution?key=${encodeURIComponent(call.key)}`);
        box.replaceChildren(told.allow_run ? resolveForm(runId, call) : commands(told));
        box.dataset.dirty = "true"; // the live view does not redraw it away
      } catch (error) {
        put(box, el("p", { class: "error-box", text: error.message }));
        opener.disabled = false;
      }
    },
  });
  put(box, opener);
  return box;
}

function commands(told) {
  return el(
    "div",
    { class: "resolve-commands" },
    el("p", { class: "muted", text: "Check the outside system, then record what happened (or start the inspector with --allow-run):" }),
    OUTCOMES.map(([outcome, label]) => el("div", null, el("span", { class: "muted", text: `${label}: ` }), el("code", { class: `action-command resolve-${outcome}`, text: told.commands[outcome] }))),
  );
}

function resolveForm(runId, call) {
  const result = el("textarea", { class: "resolve-result", rows: 2, placeholder: "what the tool returned, as JSON", "aria-label": "Result (JSON)" });
  const error = el("input", { class: "resolve-error", placeholder: "what went wrong", "aria-label": "Error" });
  const said = el("p", { class: "resolve-what muted" });
  const message = el("p", { class: "resolve-message", role: "status" });
  const form = el("form", { class: "resolve-form" });
  const choices = OUTCOMES.map(([outcome, label], i) =>
    el("label", null, el("input", { type: "radio", name: `outcome-${call.key}`, value: outcome, checked: i === 0, onchange: () => show() }), ` ${label}`));
  const chosen = () => form.querySelector("input[type=radio]:checked").value;
  const show = () => {
    const outcome = chosen();
    result.hidden = outcome !== "succeeded";
    error.hidden = outcome !== "failed";
    const [, , phrase, effect] = OUTCOMES.find(([o]) => o === outcome);
    said.textContent = `Record that ${call.tool} (${call.key}) ${phrase}: ${effect}.`;
  };
  const submit = el("button", { type: "submit", class: "confirm-resolve primary", text: "Record it" });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const outcome = chosen();
    const body = { key: call.key, outcome };
    if (outcome === "succeeded") {
      try {
        body.result = result.value.trim() ? JSON.parse(result.value) : null;
      } catch (problem) {
        message.textContent = `The result is not JSON: ${problem.message}`;
        message.className = "resolve-message error-box";
        return;
      }
    }
    if (outcome === "failed") body.error = error.value;
    submit.disabled = true;
    try {
      const done = await api(`${runPath(runId)}/tools/resolve`, { method: "POST", body });
      message.textContent = `Recorded: ${done.status}.`;
      message.className = "resolve-message ok-box";
      await route();
    } catch (problem) {
      message.textContent = problem.message;
      message.className = "resolve-message error-box";
      submit.disabled = false;
    }
  });
  put(form, el("div", { class: "resolve-choices" }, choices), result, error, said, submit, message);
  show();
  return form;
}
