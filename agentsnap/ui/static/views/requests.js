// Requests to people, and the forms that answer them.

import { api } from "../api.js";
import { clear, el, enc, excerpt, fmtTime, link, put, shortId } from "../dom.js";
import { jsonTree } from "../json_tree.js";
import { route } from "../router.js";
import { validateSchema } from "../schema.js";
import { errorBox, state, statusBadge } from "./common.js";

const ON_DEADLINE = {
  fail: "then the handler fails, and so the run",
  reject: "then it is turned down",
};

function deadlineText(r) {
  if (r.deadline_us === null || r.deadline_us === undefined) return "none";
  let then = ON_DEADLINE[r.on_deadline] || `then ${r.on_deadline}`;
  if (r.on_deadline === "default") {
    then = r.kind === "approval" ? `then ${r.default ? "approved" : "denied"} by default` : `then the default answer ${excerpt(r.default, 80)}`;
  }
  const overdue = r.status === "pending" && r.deadline_us < Date.now() * 1000 ? " (past: applied when the run next looks)" : "";
  return `${fmtTime(r.deadline_us)}, ${then}${overdue}`;
}

/** The question as text, or a tree of its JSON; an approval as its tool and arguments. */
function questionView(r) {
  const q = r.question;
  if (r.kind === "approval" && q && typeof q === "object" && !Array.isArray(q) && "tool" in q) {
    return el(
      "div",
      { class: "question" },
      el("p", null, "Call ", el("code", { class: "tool-name", text: String(q.tool) }), " with:"),
      jsonTree(q.arguments ?? null, { open: 3 }),
      q.key ? el("p", { class: "muted" }, "idempotency key ", el("code", { text: String(q.key) })) : null,
    );
  }
  if (typeof q === "string") return el("div", { class: "question" }, el("p", { class: "question-text", text: q }));
  return el("div", { class: "question" }, jsonTree(q, { open: 3 }));
}

/** The top-level properties of an object schema when each is simple enough for one input. */
function simpleFields(schema) {
  if (!schema || typeof schema !== "object" || schema.type !== "object") return null;
  const properties = schema.properties;
  if (!properties || typeof properties !== "object" || !Object.keys(properties).length) return null;
  if (schema.$ref || schema.anyOf || schema.oneOf || schema.allOf) return null;
  const required = new Set(schema.required || []);
  const fields = [];
  for (const [name, sub] of Object.entries(properties)) {
    if (!sub || typeof sub !== "object" || sub.$ref || sub.anyOf || sub.oneOf || sub.allOf) return null;
    let kind = null;
    if (Array.isArray(sub.enum) && sub.enum.every((v) => v === null || typeof v !== "object")) kind = "enum";
    else if (["string", "integer", "number", "boolean"].includes(sub.type)) kind = sub.type;
    if (!kind) return null;
    fields.push({ name, schema: sub, kind, required: required.has(name) });
  }
  return fields;
}

/** What the person types the answer in: an input per simple property, else JSON text. */
function answerEditor(r, onChange) {
  const schema = r.schema;
  const fields = simpleFields(schema);
  if (fields) {
    const inputs = fields.map((f) => {
      const attrs = { name: `field-${f.name}`, "aria-label": f.name, dataset: { field: f.name }, oninput: onChange, onchange: onChange };
      let input;
      if (f.kind === "enum" || f.kind === "boolean") {
        const options = f.kind === "enum" ? f.schema.enum : [true, false];
        input = el("select", attrs, el("option", { value: "", text: "-" }), options.map((v) => el("option", { value: JSON.stringify(v), text: typeof v === "string" ? v : JSON.stringify(v) })));
      } else if (f.kind === "integer" || f.kind === "number") {
        input = el("input", { ...attrs, type: "number", step: f.kind === "integer" ? "1" : "any" });
      } else {
        input = el("input", { ...attrs, type: "text" });
      }
      const label = el(
        "label",
        { class: "answer-field" },
        el("span", { class: "field-name", text: f.schema.title || f.name }),
        f.required ? el("span", { class: "required", text: " *" }) : null,
        input,
        f.schema.description ? el("span", { class: "muted", text: f.schema.description }) : null,
      );
      return { field: f, input, label };
    });
    return {
      node: el("div", { class: "answer-fields" }, inputs.map((i) => i.label)),
      read() {
        const value = {};
        const problems = [];
        for (const { field, input } of inputs) {
          const raw = input.value;
          if (raw === "") continue;
          if (field.kind === "enum" || field.kind === "boolean") value[field.name] = JSON.parse(raw);
          else if (field.kind === "integer" || field.kind === "number") {
            const n = Number(raw);
            if (Number.isNaN(n)) problems.push({ path: `$.${field.name}`, message: "must be a number" });
            else value[field.name] = n;
          } else value[field.name] = raw;
        }
        return { value, problems: problems.length ? problems : validateSchema(schema, value) };
      },
    };
  }
  const area = el("textarea", {
    class: "json-edit answer-json",
    name: "answer",
    spellcheck: "false",
    rows: 4,
    "aria-label": "Answer as JSON",
    placeholder: schema ? "the answer as JSON, fitting the schema above" : 'the answer as JSON: "text in double quotes", a number, an object…',
    oninput: onChange,
  });
  return {
    node: area,
    read() {
      if (!area.value.trim()) return { value: undefined, problems: [{ path: "$", message: "write the answer as JSON" }] };
      let value;
      try {
        value = JSON.parse(area.value);
      } catch (error) {
        return { value: undefined, problems: [{ path: "$", message: `not JSON: ${error.message}` }] };
      }
      return { value, problems: schema ? validateSchema(schema, value) : [] };
    },
  };
}

function answerForm(r) {
  const result = el("div", { class: "answer-result", role: "status" });
  const problems = el("ul", { class: "problems" });
  const by = el("input", { name: "by", placeholder: "your name (recorded with the answer)", "aria-label": "Answered by", value: localStorage.getItem("agentsnap.by") || "" });
  const reason = el("input", { name: "reason", class: "reason-input", placeholder: r.kind === "approval" ? "reason (the agent gets it; needed to deny)" : "reason, to decline", "aria-label": "Reason" });
  const buttons = [];

  const send = async (body) => {
    for (const b of buttons) b.disabled = true;
    clear(result);
    const name = by.value.trim();
    if (name) localStorage.setItem("agentsnap.by", name);
    try {
      const done = await api(`/api/requests/${enc(r.id)}/answer`, { method: "POST", body: { ...body, by: name || null } });
      state.flash = { id: r.id, status: done.request.status };
      state.run = null;
      route();
    } catch (error) {
      if (error.status === 403) {
        put(result, el("p", { class: "error-box", role: "alert", text: "This server does not answer requests: start it with `agentsnap ui --allow-answer`." }));
      } else if (error.status === 422) {
        put(result, el("p", { class: "error-box server-refusal", role: "alert" }, el("strong", { text: "The server refused the answer: " }), error.message));
      } else if (error.status === 409) {
        put(result, el("p", { class: "error-box", role: "alert" }, error.message, " ", el("button", { type: "button", class: "refresh", text: "Refresh", onclick: () => route() })));
      } else {
        put(result, errorBox(error));
      }
      check();
    }
  };

  let editor = null;
  let submit = null;
  const check = () => {
    if (!editor) {
      for (const b of buttons) b.disabled = false;
      return true;
    }
    const { problems: found } = editor.read();
    clear(problems);
    for (const p of found) put(problems, el("li", null, el("code", { text: p.path }), " ", p.message));
    for (const b of buttons) b.disabled = false;
    submit.disabled = found.length > 0;
    return found.length === 0;
  };

  const needReason = () => {
    if (reason.value.trim()) return true;
    clear(result);
    put(result, el("p", { class: "error-box", role: "alert", text: "Give a reason: the agent gets it." }));
    reason.focus();
    return false;
  };

  let controls;
  if (r.kind === "approval") {
    const approve = el("button", { type: "button", class: "primary approve", text: "Approve", onclick: () => send({ approve: true, reason: reason.value.trim() || null }) });
    const deny = el("button", { type: "button", class: "deny", text: "Deny", onclick: () => needReason() && send({ approve: false, reason: reason.value.trim() }) });
    buttons.push(approve, deny);
    controls = [el("div", { class: "actions" }, reason, by), el("div", { class: "actions" }, approve, deny)];
  } else {
    editor = answerEditor(r, () => check());
    submit = el("button", { type: "submit", class: "primary answer", text: "Answer" });
    const decline = el("button", { type: "button", class: "decline", text: "Decline", onclick: () => needReason() && send({ approve: false, reason: reason.value.trim() }) });
    buttons.push(submit, decline);
    controls = [
      r.schema ? null : el("p", { class: "muted", text: "No schema: any JSON is an answer." }),
      editor.node,
      problems,
      el("div", { class: "actions" }, by, submit),
      el("div", { class: "actions" }, reason, decline),
    ];
  }
  const form = el(
    "form",
    {
      class: "answer-form",
      onsubmit: (event) => {
        event.preventDefault();
        if (!editor || !check()) return;
        send({ answer: editor.read().value });
      },
    },
    controls,
    result,
  );
  check();
  return form;
}

function requestCard(r, canAnswer) {
  const pending = r.status === "pending";
  const settled = pending
    ? null
    : el(
        "div",
        { class: "settled" },
        el(
          "p",
          null,
          statusBadge(r.status),
          r.kind === "approval" && r.status === "answered" ? el("strong", { text: " approved" }) : null,
          r.kind === "approval" && r.status === "rejected" ? el("strong", { text: " denied" }) : null,
          " by ",
          el("span", { class: "answered-by", text: r.answered_by ?? "-" }),
          " at ",
          el("span", { class: "answered-at", text: fmtTime(r.answered_at_us) }),
        ),
        r.reason ? el("p", { class: "reason" }, "reason: ", el("span", { class: "reason-text", text: r.reason })) : null,
        r.kind !== "approval" && r.status !== "withdrawn" && r.status !== "rejected" ? el("div", { class: "answer" }, el("h4", { text: "Answer" }), jsonTree(r.answer, { open: 3 })) : null,
      );
  return el(
    "article",
    { class: `request ${pending ? "pending" : "settled"}`, dataset: { request: r.id, status: r.status, kind: r.kind } },
    el(
      "h3",
      null,
      el("span", { class: "badge kind", text: r.kind }),
      " ",
      statusBadge(r.status),
      " from ",
      link(`#/runs/${enc(r.run_id)}/agents/${enc(r.agent)}`, r.agent, "agent-link"),
      " ",
      el("span", { class: "mono muted", text: r.id }),
    ),
    el(
      "dl",
      { class: "request-facts" },
      el("dt", { text: "Asked" }),
      el("dd", { text: fmtTime(r.asked_at_us) }),
      el("dt", { text: "Who may answer" }),
      el("dd", { class: "who", text: r.who ?? "anyone" }),
      el("dt", { text: "Deadline" }),
      el("dd", { class: "deadline", text: deadlineText(r) }),
    ),
    questionView(r),
    r.schema ? el("details", { class: "schema" }, el("summary", { text: "Answer schema" }), jsonTree(r.schema, { open: 4 })) : null,
    settled,
    pending && canAnswer ? answerForm(r) : null,
  );
}

export async function requestsPanel(panel, run, requests) {
  const body = requests || { requests: [], can_answer: false };
  const waiting = body.requests.filter((r) => r.status === "pending");
  const history = body.requests.filter((r) => r.status !== "pending").reverse();
  const flash = state.flash;
  state.flash = null;
  put(
    clear(panel),
    el("h2", null, "Waiting for a person ", el("button", { type: "button", class: "refresh", text: "Refresh", onclick: () => route() })),
    flash ? el("p", { class: "ok-box answer-done", role: "status", text: `Request ${shortId(flash.id)} is now ${flash.status}.` }) : null,
    waiting.length && !body.can_answer
      ? el("p", { class: "warn answer-off", text: "This server does not answer requests: start it with `agentsnap ui --allow-answer` to answer them here, or use `agentsnap answer ID`." })
      : null,
    waiting.length ? waiting.map((r) => requestCard(r, body.can_answer)) : el("p", { class: "muted", text: "No request waits." }),
    el("h2", { text: "History" }),
    history.length ? history.map((r) => requestCard(r, false)) : el("p", { class: "muted", text: "No request was answered, turned down, withdrawn or expired." }),
  );
}
