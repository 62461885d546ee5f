// Fork a run from a snapshot with an edited state.

import { api, loadSession, runPath } from "../api.js";
import { clear, el, enc, link, put, shortId } from "../dom.js";
import { validateSchema } from "../schema.js";
import { runActions } from "./actions.js";
import { errorBox, state } from "./common.js";
import { loadSnapshot } from "./snapshots.js";

export async function forkPanel(panel, run, sid, signal) {
  const snap = await loadSnapshot(run.detail.id, sid, signal);
  if (signal.aborted) return;
  const schemas = run.detail.schemas || {};
  const editors = new Map();
  const submit = el("button", { type: "submit", class: "primary", text: "Create fork" });
  const result = el("div", { class: "fork-result", role: "status" });
  const nameInput = el("input", { name: "name", placeholder: "name of the fork (optional)", "aria-label": "Fork name" });
  const toolsSelect = el(
    "select",
    { name: "tools", "aria-label": "Tools when the fork runs" },
    el("option", { value: "dry", text: "dry: record side effects, run none (what-if)", selected: true }),
    el("option", { value: "live", text: "live: side effects run for real" }),
  );

  let messages = null;
  const check = () => {
    let ok = true;
    for (const editor of editors.values()) ok = editor.validate() && ok;
    if (messages) ok = messages.validate() && ok;
    submit.disabled = !ok;
    return ok;
  };

  const blocks = Object.entries(snap.agents).map(([name, agent]) => {
    const original = JSON.stringify(agent.state, null, 2);
    const area = el("textarea", { class: "json-edit", spellcheck: "false", rows: Math.min(24, original.split("\n").length + 1), "aria-label": `State of ${name}`, dataset: { agent: name } });
    area.value = original;
    const problems = el("ul", { class: "problems" });
    const badge = el("span", { class: "badge" });
    const editor = {
      area,
      original,
      value: undefined,
      validate() {
        clear(problems);
        let value;
        try {
          value = JSON.parse(area.value);
        } catch (error) {
          put(problems, el("li", { text: `not JSON: ${error.message}` }));
          return this.fail();
        }
        this.value = value;
        if (value === null || typeof value !== "object" || Array.isArray(value)) {
          put(problems, el("li", { text: "a state must be a JSON object" }));
          return this.fail();
        }
        const found = schemas[name] ? validateSchema(schemas[name], value) : [];
        for (const p of found) put(problems, el("li", null, el("code", { text: p.path }), " ", p.message));
        if (found.length) return this.fail();
        badge.textContent = area.value === original ? "unchanged" : schemas[name] ? "edited, valid" : "edited (no stored schema)";
        badge.className = "badge ok";
        area.classList.remove("invalid");
        return true;
      },
      fail() {
        badge.textContent = "invalid";
        badge.className = "badge invalid";
        area.classList.add("invalid");
        return false;
      },
      serverProblems(list) {
        for (const p of list) put(problems, el("li", { class: "server" }, "server: ", el("code", { text: p.path || "$" }), " ", p.message));
        this.fail();
      },
    };
    editors.set(name, editor);
    area.addEventListener("input", () => check());
    return el("div", { class: "fork-agent", dataset: { agent: name } }, el("h3", null, el("span", { text: name }), " ", badge, schemas[name] ? null : el("span", { class: "muted", text: " (no stored schema: checked by the server)" })), area, problems);
  });

  messages = forkMessages(snap, () => check());

  const form = el(
    "form",
    {
      class: "fork-form",
      onsubmit: async (event) => {
        event.preventDefault();
        if (!check()) return;
        const states = {};
        for (const [name, editor] of editors) if (editor.area.value !== editor.original) states[name] = editor.value;
        submit.disabled = true;
        clear(result);
        try {
          const body = await api(`${runPath(run.detail.id)}/fork`, { method: "POST", body: { snapshot: snap.id, states, name: nameInput.value || null, messages: messages.edits(), tools: toolsSelect.value } });
          const fork = body.run;
          state.run = null;
          put(result, 
            el("p", { class: "ok-box" }, "Created run ", link(`#/runs/${enc(fork.id)}`, fork.name || shortId(fork.id), "fork-link"), ` from S${snap.seq} of run `, link(`#/runs/${enc(run.detail.id)}`, run.detail.name || shortId(run.detail.id)), "."),
            el("p", { class: "lineage", text: `lineage: ${shortId(fork.parent_run_id)} @ S${snap.seq} → ${shortId(fork.id)}` }),
            el(
              "p",
              { class: "fork-next muted" },
              toolsSelect.value === "dry"
                ? "Its tools are dry: when it runs, side-effecting calls are recorded with their arguments and return the tools' stand-ins; nothing reaches the world. "
                : "Its tools are live: when it runs, side-effecting calls run for real, under new keys (a fork is another run). ",
              "Nothing runs yet: continue it with ",
              el("code", { text: `agentsnap resume ${fork.id} --app MODULE:FACTORY` }),
              ", or from a program that registers the same agents, with ",
              el("code", { text: `Runtime(store=..., run_id="${fork.id}").resume()` }),
              ".",
            ),
          );
          // A server that runs apps (--allow-run) continues the fork from here, at once.
          const session = await loadSession();
          if (session.allow_run) {
            const go = runActions({ detail: fork }, session);
            if (go) result.append(el("div", { class: "fork-continue" }, go));
          }
        } catch (error) {
          if (error.status === 403) {
            put(result, el("p", { class: "error-box", text: "This server does not allow forks: start it with `agentsnap ui --allow-fork`." }));
          } else if (error.status === 422) {
            put(result, el("p", { class: "error-box", text: error.message }));
            for (const p of error.body.problems || []) {
              const editor = String(p.path || "").startsWith("message ") ? null : editors.get(p.agent);
              if (editor) editor.serverProblems([p]);
              else if (String(p.path || "").startsWith("message ")) messages.serverProblem(p);
              else put(result, el("p", { class: "error-box", text: `${p.agent ?? ""} ${p.path ?? ""} ${p.message}` }));
            }
          } else {
            put(result, errorBox(error));
          }
        } finally {
          submit.disabled = false;
        }
      },
    },
    el("p", { class: "muted", text: "Edit the states to start the fork from (JSON; checked against each agent's schema as you type). Unchanged agents keep their recorded state." }),
    blocks,
    messages.root,
    el("div", { class: "actions" }, nameInput, toolsSelect, submit),
    result,
  );
  put(clear(panel), el("h2", { text: `Fork from S${snap.seq}` }), run.detail.allow_fork === false ? el("p", { class: "error-box", text: "This server does not allow forks: start it with `agentsnap ui --allow-fork`." }) : form);
  check();
}

/**
 * The fork form's messages in flight: each can be dropped or given another payload, and
 * messages can be added between the cut's agents. The server checks them again.
 */
function forkMessages(snap, onChange) {
  const agents = Object.keys(snap.agents).filter((a) => a !== "$env").sort();
  const rows = [];
  const problems = el("ul", { class: "problems" });
  const flying = snap.channels.flatMap((c) => c.in_flight);
  for (const m of flying) {
    const original = JSON.stringify(m.payload, null, 2);
    const drop = el("input", { type: "checkbox", class: "drop-message", "aria-label": `Drop ${m.id}`, dataset: { message: m.id } });
    const area = el("textarea", { class: "json-edit message-edit", spellcheck: "false", rows: Math.min(8, original.split("\n").length + 1), "aria-label": `Payload of ${m.id}`, dataset: { message: m.id } });
    area.value = original;
    const badge = el("span", { class: "badge" });
    const row = el("div", { class: "fork-message", dataset: { message: m.id } }, el("h4", null, el("code", { text: m.id }), " ", el("span", { class: "muted", text: m.kind }), " ", badge), el("label", null, drop, " drop it (never delivered in the fork)"), area);
    drop.addEventListener("change", () => {
      area.disabled = drop.checked;
      onChange();
    });
    area.addEventListener("input", () => onChange());
    rows.push({ kind: "flying", id: m.id, drop, area, original, badge, row });
  }
  const list = el("div", { class: "fork-messages-list" }, rows.map((r) => r.row));
  const src = el("select", { "aria-label": "New message from" }, ["$env", ...agents].map((a) => el("option", { value: a, text: a })));
  const dst = el("select", { "aria-label": "New message to" }, agents.map((a) => el("option", { value: a, text: a })));
  const addArea = el("textarea", { class: "json-edit", rows: 3, spellcheck: "false", "aria-label": "New message payload" });
  addArea.value = "{}";
  const addButton = el("button", {
    type: "button",
    class: "add-message",
    text: "Add this message",
    onclick: () => {
      const original = addArea.value;
      const area = el("textarea", { class: "json-edit message-edit", rows: 3, spellcheck: "false", "aria-label": `Payload of the new message ${src.value}>${dst.value}` });
      area.value = original;
      const badge = el("span", { class: "badge" });
      const entry = { kind: "added", src: src.value, dst: dst.value, area, original, badge, row: null };
      const remove = el("button", { type: "button", text: "Remove", onclick: () => { rows.splice(rows.indexOf(entry), 1); entry.row.remove(); onChange(); } });
      entry.row = el("div", { class: "fork-message added", dataset: { added: `${src.value}>${dst.value}` } }, el("h4", null, el("code", { text: `${src.value}>${dst.value}` }), " ", el("span", { class: "muted", text: "added, after those in flight" }), " ", badge, " ", remove), area);
      area.addEventListener("input", () => onChange());
      rows.push(entry);
      list.appendChild(entry.row);
      onChange();
    },
  });
  const root = el(
    "section",
    { class: "fork-messages" },
    el("h3", { text: `Messages in flight (${flying.length})` }),
    flying.length ? null : el("p", { class: "muted", text: "None at this cut." }),
    list,
    agents.length ? el("div", { class: "add-message-form" }, el("span", { text: "Add a message from " }), src, el("span", { text: " to " }), dst, addArea, addButton) : null,
    problems,
  );
  const parse = (entry) => {
    try {
      entry.value = JSON.parse(entry.area.value);
      entry.badge.textContent = entry.kind === "added" ? "added" : entry.area.value === entry.original ? "" : "edited";
      entry.badge.className = entry.badge.textContent ? "badge ok" : "badge";
      entry.area.classList.remove("invalid");
      return true;
    } catch (error) {
      entry.badge.textContent = "not JSON";
      entry.badge.className = "badge invalid";
      entry.area.classList.add("invalid");
      return false;
    }
  };
  return {
    root,
    validate() {
      clear(problems);
      let ok = true;
      for (const entry of rows) {
        if (entry.kind === "flying" && entry.drop.checked) {
          entry.badge.textContent = "dropped";
          entry.badge.className = "badge invalid";
          entry.row.classList.add("dropped");
          continue;
        }
        if (entry.row) entry.row.classList.remove("dropped");
        ok = parse(entry) && ok;
      }
      return ok;
    },
    edits() {
      const out = { drop: [], edit: {}, add: [] };
      for (const entry of rows) {
        if (entry.kind === "flying") {
          if (entry.drop.checked) out.drop.push(entry.id);
          else if (entry.area.value !== entry.original) out.edit[entry.id] = entry.value;
        } else {
          out.add.push({ src: entry.src, dst: entry.dst, payload: entry.value });
        }
      }
      return out;
    },
    serverProblem(p) {
      put(problems, el("li", { class: "server" }, "server: ", el("code", { text: p.path }), " ", p.message));
    },
  };
}
