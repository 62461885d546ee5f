// One run: its header, its space-time view and the panel of its section.

import { api, loadSession, runPath } from "../api.js";
import { clear, el, enc, fmtTime, link, put, shortId } from "../dom.js";
import { ServerSource } from "../server_source.js";
import { SpaceTime } from "../spacetime.js";
import { runActions } from "./actions.js";
import { bisectPanel } from "./bisect.js";
import { errorBox, state, statusBadge, tags } from "./common.js";
import { comparePanel } from "./compare.js";
import { diffPanel } from "./diff.js";
import { eventsPanel } from "./events.js";
import { failureBox } from "./failure.js";
import { forkPanel } from "./fork.js";
import { attachIncidents } from "./incidents.js";
import { requestsPanel } from "./requests.js";
import { agentPanel, cutPanel, messagePanel, snapshotsPanel } from "./snapshots.js";
import { toolsPanel } from "./tools.js";
import { topologyView } from "./topology.js";

async function loadRun(runId, signal) {
  if (state.run && (state.run.detail.id === runId || state.run.key === runId)) return state.run;
  const [detail, snaps] = await Promise.all([
    api(runPath(runId), { signal }),
    api(`${runPath(runId)}/snapshots`, { signal }),
  ]);
  state.run = { key: runId, detail, snapshots: snaps.snapshots };
  return state.run;
}

function runHeader(run, requests) {
  const d = run.detail;
  const waiting = requests ? requests.requests.filter((r) => r.status === "pending").length : 0;
  const id = enc(d.id);
  const lineage = el("div", { class: "lineage" });
  if (d.parent_run_id) {
    put(lineage, 
      "forked from ",
      link(`#/runs/${enc(d.parent_run_id)}`, shortId(d.parent_run_id)),
      d.parent_snapshot_id ? [" at ", link(`#/runs/${enc(d.parent_run_id)}/snapshots/${enc(d.parent_snapshot_id)}`, `snapshot ${shortId(d.parent_snapshot_id)}`)] : null,
    );
  }
  if (d.forks && d.forks.length) {
    put(lineage, 
      d.parent_run_id ? " · " : "",
      "forks: ",
      d.forks.map((f, i) => [i ? ", " : "", link(`#/runs/${enc(f.run_id)}`, shortId(f.run_id))]),
    );
  }
  const tabs = [
    ["", "Timeline"],
    ["snapshots", "Snapshots"],
    ["events", "Events"],
    ["tools", "Tools"],
    ["requests", waiting ? `Requests (${waiting} waiting)` : "Requests"],
    ["diff", "Diff"],
    ["bisect", "Bisect"],
  ];
  if (d.parent_run_id) tabs.push(["compare", "Compare with parent"]);
  return el(
    "div",
    { class: "run-header" },
    el("h1", null, el("span", { class: "run-name", text: d.name || `run ${shortId(d.id)}` }), " ", statusBadge(d.status)),
    d.reason ? el("p", { class: "reason", text: d.reason }) : null,
    el(
      "p",
      { class: "facts" },
      el("span", { class: "mono", text: d.id }),
      ` · ${d.agents.length} agent(s) · ${d.messages} message(s) · ${run.snapshots.length} snapshot(s) · ${d.rollbacks} rollback(s) · ${d.tool_calls} tool call(s) · `,
      `created ${fmtTime(d.created_at_us)}`,
      " ",
      tags(d.tags),
    ),
    lineage,
    waiting
      ? el("p", { class: "requests-alert", role: "alert" }, `${waiting} request(s) wait for a person: `, link(`#/runs/${id}/requests`, "see and answer them"))
      : null,
    el("nav", { class: "tabs" }, tabs.map(([path, label]) => link(`#/runs/${id}${path ? `/${path}` : ""}`, label, "tab"))),
  );
}

export async function runView(main, parts, params, signal) {
  const runId = parts[0];
  const run = await loadRun(runId, signal);
  if (signal.aborted) return;
  // Asked each time: requests change while the run waits (a store without them has none).
  const requests = await api(`${runPath(run.detail.id)}/requests`, { signal }).catch((error) => {
    if (error && error.name === "AbortError") throw error;
    return null;
  });
  if (signal.aborted) return;
  const section = parts[1] || "";
  const header = runHeader(run, requests);
  const tabKey = section === "agents" || section === "messages" ? "" : section === "fork" ? "snapshots" : section;
  for (const tab of header.querySelectorAll("a.tab")) {
    const target = tab.getAttribute("href").split("/")[3] || "";
    if (target === tabKey || (target === "" && section === "snapshots" && parts[2])) tab.classList.add("active");
  }
  const panel = el("section", { class: "panel", id: "panel" });
  const content = [header];
  const session = await loadSession(signal);
  if (signal.aborted) return;
  const actions = runActions(run, session);
  if (actions) content.push(actions);
  // A failed run's page opens on its error (folded on the other views).
  if (run.detail.status === "failed") content.push(failureBox(run.detail, section === ""));
  const showTimeline = section === "" || section === "agents" || section === "messages" || (section === "snapshots" && parts[2]);
  if (showTimeline) content.push(timelineFor(run).root);
  content.push(panel);
  put(clear(main), ...content);
  if (showTimeline) state.timeline.invalidate();
  if (section === "") {
    put(panel, el("p", { class: "muted", text: "Click a snapshot's cut for every agent's state at it, an agent's name for its history, an arrow for its message. Wheel or +/- zoom, drag or arrows pan, 0 resets." }));
    const topology = await api(`${runPath(run.detail.id)}/topology`, { signal });
    if (signal.aborted) return;
    main.insertBefore(topologyView(topology, state.timeline), state.timeline.root);
  } else if (section === "snapshots" && parts[2]) {
    state.timeline.select(parts[2]);
    await cutPanel(panel, run, parts[2], signal);
  } else if (section === "snapshots") {
    snapshotsPanel(panel, run);
  } else if (section === "agents" && parts[2]) {
    await agentPanel(panel, run, parts[2], signal);
  } else if (section === "messages" && parts.length >= 5) {
    await messagePanel(panel, run, parts[2], parts[3], parts[4], signal);
  } else if (section === "tools") {
    await toolsPanel(panel, run, params, signal);
  } else if (section === "requests") {
    await requestsPanel(panel, run, requests);
  } else if (section === "diff") {
    await diffPanel(panel, run, params, signal);
  } else if (section === "fork" && parts[2]) {
    await forkPanel(panel, run, parts[2], signal);
  } else if (section === "bisect") {
    bisectPanel(panel, run, params);
  } else if (section === "events") {
    await eventsPanel(panel, run, params, signal);
  } else if (section === "compare") {
    await comparePanel(panel, run, params, signal);
  } else {
    put(panel, errorBox(new Error(`nothing here: #${location.hash.slice(1)}; go back to the run`)));
  }
}

function timelineFor(run) {
  if (state.timeline && state.timelineRun === run.detail.id) {
    state.timeline.update(run.detail, run.snapshots);
    attachIncidents(state.timeline, run.detail.id);
    return state.timeline;
  }
  const id = enc(run.detail.id);
  const timeline = new SpaceTime({
    run: run.detail,
    snapshots: run.snapshots,
    source: new ServerSource(run.detail.id),
    onCut: (s) => (location.hash = `#/runs/${id}/snapshots/${enc(s.id)}`),
    onAgent: (name) => (location.hash = `#/runs/${id}/agents/${enc(name)}`),
    onMessage: (m) => (location.hash = `#/runs/${id}/messages/${enc(m.src)}/${enc(m.dst)}/${m.seq}`),
  });
  state.timeline = timeline;
  state.timelineRun = run.detail.id;
  window.agentsnap.timeline = timeline;
  timeline.scheduleFetch();
  attachIncidents(timeline, run.detail.id);
  return timeline;
}
