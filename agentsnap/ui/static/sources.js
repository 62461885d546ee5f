// Window data for the space-time view from a run embedded in the page.

export const EXACT_LIMIT = 5000;
const DENSITY_BINS = 240;

/**
 * Window data from a run embedded in the page (the static export). The same answers as the
 * server: exact messages when few enough touch the window, else per-channel counts per bin.
 */
export class EmbeddedSource {
  constructor(data) {
    this.data = data;
    const names = data.names;
    const rows = data.messages.rows;
    const excerpts = data.messages.payloads || [];
    this.messages = rows.map((r, i) => ({
      src: names[r[0]],
      dst: names[r[1]],
      seq: r[2],
      kind: data.messages.kinds[r[3]],
      epoch: r[4],
      sent_us: r[5],
      delivered_us: r[6],
      sent_lc: r[7],
      delivered_lc: r[8],
      discarded: Boolean(r[9]),
      payload_excerpt: excerpts[i],
    }));
  }

  async window(axis, from, to) {
    const lamport = axis === "lamport";
    const touching = [];
    for (const m of this.messages) {
      const start = lamport ? m.sent_lc : m.sent_us;
      const endRaw = lamport ? m.delivered_lc : m.delivered_us;
      const end = endRaw === null || endRaw === undefined ? start : endRaw;
      if (end >= from && start <= to) touching.push(m);
    }
    let messages;
    if (touching.length <= EXACT_LIMIT) {
      messages = { mode: "exact", messages: touching };
    } else {
      const channels = new Map();
      const width = (to - from) / DENSITY_BINS || 1;
      for (const m of touching) {
        const start = lamport ? m.sent_lc : m.sent_us;
        if (start < from || start > to) continue;
        const key = `${m.src}\u0000${m.dst}`;
        let channel = channels.get(key);
        if (!channel) {
          channel = { src: m.src, dst: m.dst, counts: new Array(DENSITY_BINS).fill(0) };
          channels.set(key, channel);
        }
        channel.counts[Math.min(DENSITY_BINS - 1, Math.floor((start - from) / width))] += 1;
      }
      messages = { mode: "density", from, to, bins: DENSITY_BINS, channels: [...channels.values()] };
    }
    const at = (event) => (lamport ? event.lc : event.at_us);
    const events = {
      rollbacks: this.data.events.rollbacks.filter((e) => at(e) >= from && at(e) <= to),
      tool_calls: this.data.events.tool_calls.filter((e) => at(e) >= from && at(e) <= to),
    };
    return { axis, from, to, messages, events };
  }

  async message(src, dst, seq) {
    const found = this.messages.find((m) => m.src === src && m.dst === dst && m.seq === Number(seq));
    return found ? { ...found, payload: found.payload_excerpt } : null;
  }
}
