// Window data for the space-time view from the inspector's server.

import { api, query, runPath } from "./api.js";
import { enc } from "./dom.js";
import { EXACT_LIMIT } from "./sources.js";

/** Window data from the server: debounced by the view, stale requests aborted, tiles cached. */
export class ServerSource {
  constructor(runId) {
    this.runId = runId;
    this.cache = new Map();
  }

  async window(axis, from, to, signal) {
    const key = `${axis}|${from}|${to}`;
    if (this.cache.has(key)) {
      const hit = this.cache.get(key);
      this.cache.delete(key);
      this.cache.set(key, hit);
      return hit;
    }
    const base = runPath(this.runId);
    const range = { axis, from: Math.floor(from), to: Math.ceil(to) };
    const [messages, events] = await Promise.all([
      api(`${base}/messages${query({ ...range, limit: EXACT_LIMIT })}`, { signal }),
      api(`${base}/events${query(range)}`, { signal }),
    ]);
    const data = { axis, from, to, messages, events };
    this.cache.set(key, data);
    while (this.cache.size > 48) this.cache.delete(this.cache.keys().next().value);
    return data;
  }

  async message(src, dst, seq) {
    return api(`${runPath(this.runId)}/messages/${enc(src)}/${enc(dst)}/${enc(seq)}`);
  }
}
