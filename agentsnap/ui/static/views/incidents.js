// What the space-time view marks besides messages and cuts, from `/api/runs/RUN/incidents`:
// where each owner of the run stopped (a crash in red, a clean stop in grey) and where the
// next took its lease (with the new owner), and
// its long idle gaps, folded to a narrow band that says how long they were, so that a run
// stopped for an hour does not squash its minutes of work to a line.

import { api, runPath } from "../api.js";
import { fmtSpan } from "../dom.js";
import { LabelRows, TOP } from "../spacetime.js";

const FOLD_SHARE = 0.03; // a folded gap keeps this share of the run's active time

/**
 * The wall-clock axis with `gaps` folded: `u(t)` maps a time to the folded axis, `t(u)` back.
 * Each gap keeps at most FOLD_SHARE of the time outside the gaps.
 */
export function foldedAxis(gaps, start, end) {
  const sorted = [...gaps].sort((a, b) => a.from_us - b.from_us);
  const idle = sorted.reduce((sum, g) => sum + g.length_us, 0);
  const active = Math.max(1000, end - start - idle);
  const folds = sorted.map((g) => ({ a: g.from_us, b: g.to_us, length: g.length_us, kept: Math.max(1, Math.min(g.length_us, active * FOLD_SHARE)) }));
  const u = (t) => {
    let shift = 0;
    for (const f of folds) {
      if (t <= f.a) break;
      if (t < f.b) return t - shift - (t - f.a) * (1 - f.kept / f.length);
      shift += f.length - f.kept;
    }
    return t - shift;
  };
  const back = (v) => {
    let shift = 0;
    for (const f of folds) {
      const ua = f.a - shift;
      if (v <= ua) break;
      if (v < ua + f.kept) return f.a + (v - ua) * (f.length / f.kept);
      shift += f.length - f.kept;
    }
    return v + shift;
  };
  return { folds, u, t: back };
}

/** Ask for the run's incidents and give them to `timeline` (drawn at its next frame). */
export async function attachIncidents(timeline, runId) {
  let body;
  try {
    body = await api(`${runPath(runId)}/incidents`);
  } catch {
    return; // the view works without them
  }
  const [start, end] = [timeline.run.start_us ?? 0, timeline.run.end_us ?? 0];
  timeline.incidents = body;
  timeline.fold = body.gaps.length ? foldedAxis(body.gaps, start, end) : null;
  timeline.overlay = (ctx, height) => drawIncidents(timeline, ctx, height);
  timeline.invalidate();
}

function owner(text) {
  // host:pid:token -> pid on host
  const parts = String(text || "").split(":");
  return parts.length >= 3 ? `pid ${parts[parts.length - 2]} on ${parts.slice(0, -2).join(":")}` : text;
}

/** Folds, stops and resumes on the wall-clock axis; what was drawn, for the tooltips and tests. */
export function drawIncidents(timeline, ctx, height) {
  const marks = [];
  timeline.incidentMarks = marks;
  const body = timeline.incidents;
  if (!body || timeline.axis !== "wall") {
    timeline.canvas.dataset.folds = "0";
    return;
  }
  const width = timeline.width;
  const bottom = height - 30;
  const labels = new LabelRows(ctx, width, [TOP - 4, height - 1]);
  ctx.save();
  ctx.font = "11px system-ui, sans-serif";
  for (const f of timeline.fold ? timeline.fold.folds : []) {
    const x0 = timeline.x(f.a);
    const x1 = timeline.x(f.b);
    if (x1 < 0 || x0 > width) continue;
    ctx.fillStyle = "rgba(236, 238, 242, 0.96)";
    ctx.fillRect(x0, TOP - 14, Math.max(2, x1 - x0), height - 10 - (TOP - 14)); // over the axis labels too
    ctx.strokeStyle = "#9aa3b5";
    ctx.setLineDash([]);
    for (const x of [x0, x1]) {
      // A zig-zag edge: the axis is cut here.
      ctx.beginPath();
      for (let y = TOP - 14, i = 0; y <= bottom; y += 6, i++) ctx.lineTo(x + (i % 2 ? 2 : -2), y);
      ctx.stroke();
    }
    ctx.fillStyle = "#556";
    const label = `idle ${fmtSpan(f.length)}`;
    labels.place(label, (x0 + x1) / 2);
    marks.push({ kind: "fold", x0, x1, label, from_us: f.a, to_us: f.b });
  }
  const stop = (at, crashed, who) => {
    const x = timeline.x(at);
    if (x < -2 || x > width + 2) return;
    // A crash (the owner stopped without giving the run back) in red; a clean stop in grey.
    const colour = crashed === false ? "#778" : "#c33";
    const label = crashed === false ? "■ stopped" : crashed ? "✕ crashed" : "✕ stopped";
    ctx.strokeStyle = colour;
    ctx.setLineDash([4, 3]);
    ctx.beginPath();
    ctx.moveTo(x, TOP - 14);
    ctx.lineTo(x, bottom);
    ctx.stroke();
    ctx.fillStyle = colour;
    labels.place(label, x - ctx.measureText(label).width / 2 - 6);
    marks.push({ kind: "stopped", x, label, at_us: at, crashed, owner: who ?? null });
  };
  for (const r of body.resumes) {
    if (r.stopped_us !== null && r.stopped_us !== undefined) stop(r.stopped_us, r.crashed ?? null, null);
    const x = timeline.x(r.at_us);
    if (x >= -2 && x <= width + 2) {
      ctx.strokeStyle = "#2a8a3e";
      ctx.setLineDash([]);
      ctx.lineWidth = 2;
      ctx.beginPath();
      ctx.moveTo(x, TOP - 14);
      ctx.lineTo(x, bottom);
      ctx.stroke();
      ctx.lineWidth = 1;
      ctx.fillStyle = "#2a8a3e";
      const label = r.owner ? `▶ resumed by ${owner(r.owner)}` : "▶ resumed";
      labels.place(label, x, "left");
      marks.push({ kind: "resumed", x, label, at_us: r.at_us, owner: r.owner ?? null, token: r.token ?? null });
    }
  }
  // An owner that died and that nobody took over yet: no resume carries its stop.
  for (const c of body.crashes || []) {
    if (c.by === null && c.stopped_us !== null) stop(c.stopped_us, true, c.owner);
  }
  ctx.restore();
  timeline.canvas.dataset.folds = String(marks.filter((m) => m.kind === "fold").length);
}
