// Topology: who talks to whom.

import { el } from "../dom.js";

const TOPOLOGY_MAX = 60; // agents drawn; the busiest ones when a run has more

/**
 * The run's agents on a circle and an arrow per channel, thicker with its messages. Clicking
 * an agent shows only it and the agents it talks with in the space-time view; clicking an
 * arrow, only its two ends; "All agents" shows every lane again.
 */
export function topologyView(topology, timeline) {
  const traffic = new Map();
  for (const c of topology.channels) {
    traffic.set(c.src, (traffic.get(c.src) || 0) + c.messages);
    traffic.set(c.dst, (traffic.get(c.dst) || 0) + c.messages);
  }
  let agents = [...new Set([...topology.agents, ...traffic.keys()])];
  const hidden = Math.max(0, agents.length - TOPOLOGY_MAX);
  if (hidden) agents = agents.sort((a, b) => (traffic.get(b) || 0) - (traffic.get(a) || 0)).slice(0, TOPOLOGY_MAX);
  agents.sort();
  const size = 360;
  const radius = agents.length > 1 ? size / 2 - 50 : 0;
  const at = new Map(agents.map((name, i) => {
    const angle = (2 * Math.PI * i) / Math.max(1, agents.length) - Math.PI / 2;
    return [name, [size / 2 + radius * Math.cos(angle), size / 2 + radius * Math.sin(angle)]];
  }));
  const NS = "http://www.w3.org/2000/svg";
  const svgEl = (tag, attrs, text) => {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  };
  const svg = svgEl("svg", { class: "topology-graph", viewBox: `0 0 ${size} ${size}`, width: size, height: size, role: "img", "aria-label": "Who talks to whom" });
  const defs = svgEl("defs");
  const marker = svgEl("marker", { id: "topology-arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" });
  marker.appendChild(svgEl("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#8a93a6" }));
  defs.appendChild(marker);
  svg.appendChild(defs);
  const note = el("span", { class: "muted topology-focus" });
  const show = (names, what) => {
    timeline.focus(names);
    note.textContent = names ? `The space-time view shows ${what}.` : "";
    all.hidden = !names;
  };
  const all = el("button", { type: "button", class: "topology-all", text: "All agents", hidden: !timeline.only, onclick: () => show(null) });
  if (timeline.only) note.textContent = `The space-time view shows ${[...timeline.only].sort().join(", ")}.`;
  const most = Math.max(1, ...topology.channels.map((c) => c.messages));
  for (const c of topology.channels) {
    const from = at.get(c.src);
    const to = at.get(c.dst);
    if (!from || !to || c.src === c.dst) continue;
    // Shortened at both ends so that the arrow stops at the node; bent a little so that
    // the two directions of a pair do not overlap.
    const [x1, y1] = from;
    const [x2, y2] = to;
    const dx = x2 - x1;
    const dy = y2 - y1;
    const length = Math.hypot(dx, dy) || 1;
    const [ux, uy] = [dx / length, dy / length];
    const [sx, sy] = [x1 + ux * 14, y1 + uy * 14];
    const [ex, ey] = [x2 - ux * 14, y2 - uy * 14];
    const [cx, cy] = [(sx + ex) / 2 - uy * 14, (sy + ey) / 2 + ux * 14];
    const width = 1 + 4 * Math.log2(1 + c.messages) / Math.log2(1 + most);
    const edge = svgEl("path", {
      d: `M ${sx} ${sy} Q ${cx} ${cy} ${ex} ${ey}`,
      class: "topology-edge",
      "stroke-width": width.toFixed(1),
      "marker-end": "url(#topology-arrow)",
      "data-src": c.src,
      "data-dst": c.dst,
      tabindex: 0,
    });
    edge.appendChild(svgEl("title", {}, `${c.src} → ${c.dst}: ${c.messages} message(s)${c.discarded ? `, ${c.discarded} undone by rollbacks` : ""}`));
    edge.addEventListener("click", () => show([c.src, c.dst], `${c.src} and ${c.dst}`));
    svg.appendChild(edge);
    svg.appendChild(svgEl("text", { x: cx, y: cy, class: "topology-count" }, String(c.messages)));
  }
  for (const name of agents) {
    const [x, y] = at.get(name);
    const neighbours = new Set([name]);
    for (const c of topology.channels) {
      if (c.src === name) neighbours.add(c.dst);
      if (c.dst === name) neighbours.add(c.src);
    }
    const node = svgEl("g", { class: "topology-agent", "data-agent": name, tabindex: 0 });
    node.appendChild(svgEl("circle", { cx: x, cy: y, r: 11 }));
    node.appendChild(svgEl("text", { x, y: y + (y < size / 2 ? -16 : 26), "text-anchor": "middle" }, name));
    node.appendChild(svgEl("title", {}, `${name}: ${traffic.get(name) || 0} message(s) sent or received`));
    node.addEventListener("click", () => show([...neighbours], `${name} and the agents it talks with`));
    svg.appendChild(node);
  }
  return el(
    "details",
    { class: "topology", open: true },
    el("summary", null, "Who talks to whom", hidden ? el("span", { class: "muted", text: ` (the ${TOPOLOGY_MAX} busiest agents of ${agents.length + hidden})` }) : null),
    topology.channels.length ? svg : el("p", { class: "muted", text: "No message journaled yet." }),
    el("div", { class: "topology-actions" }, all, note),
  );
}
