// The client of the inspector's JSON API, and the session whose token its writes carry.

import { enc } from "./dom.js";

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error) || `the server answered ${status}`);
    this.status = status;
    this.body = body || {};
  }
}

export async function api(path, options = {}) {
  const init = { signal: options.signal, method: options.method || "GET", headers: {} };
  // Every write carries the server's token (see actions): another site's page cannot.
  if (init.method !== "GET" && actionToken()) init.headers["x-agentsnap-token"] = actionToken();
  if (options.body !== undefined) {
    init.body = JSON.stringify(options.body);
    init.headers["content-type"] = "application/json";
  }
  const response = await fetch(path, init);
  let body = null;
  const text = await response.text();
  if (text) {
    try {
      body = JSON.parse(text);
    } catch {
      body = { error: text.slice(0, 300) };
    }
  }
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

export function query(params) {
  const parts = [];
  for (const [key, value] of Object.entries(params)) {
    if (value === undefined || value === null || value === "") continue;
    parts.push(`${enc(key)}=${enc(value)}`);
  }
  return parts.length ? `?${parts.join("&")}` : "";
}

export function runPath(runId) {
  return `/api/runs/${enc(runId)}`;
}

let sessionCache = null;
let typedToken = null;

export async function loadSession(signal) {
  if (sessionCache) return sessionCache;
  try {
    sessionCache = await api("/api/session", { signal });
  } catch (error) {
    if (error && error.name === "AbortError") throw error;
    sessionCache = { allow_run: false, token: null, token_required: false, commands: {} };
  }
  return sessionCache;
}

export function actionToken() {
  if (sessionCache && sessionCache.token) return sessionCache.token;
  if (typedToken === null) typedToken = sessionStorage.getItem("agentsnap-token");
  return typedToken;
}

/** Keep the token a person typed for this tab's later writes. */
export function rememberToken(token) {
  typedToken = token;
  sessionStorage.setItem("agentsnap-token", typedToken);
}
