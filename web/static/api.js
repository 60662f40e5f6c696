// The inspector's JSON API: requests in the service's envelope
// ({status, message, data, error}) and the server-sent event stream.

export const BASE = '/api/v1/ext';

export class APIError extends Error {
  constructor(httpStatus, code, message) {
    super(message);
    this.httpStatus = httpStatus;
    this.code = code;
  }
}

async function call(method, path, { params, body, signal } = {}) {
  let url = path.startsWith('/') ? path : `${BASE}/${path}`;
  if (params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) {
      if (v != null && v !== '') q.set(k, String(v));
    }
    const s = q.toString();
    if (s) url += '?' + s;
  }
  const init = { method, signal, headers: { Accept: 'application/json' }, credentials: 'same-origin' };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(url, init);
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new APIError(0, 'network', 'The inspector is not reachable');
  }
  let env = null;
  try {
    env = await res.json();
  } catch {
    // not an envelope; handled below
  }
  if (!res.ok || !env || env.status === false) {
    const err = (env && env.error) || {};
    throw new APIError(res.status, err.code || 'http_' + res.status, err.message || (env && env.message) || `HTTP ${res.status}`);
  }
  return env.data;
}

export const get = (path, params, signal) => call('GET', path, { params, signal });
export const post = (path, body) => call('POST', path, { body });
export const del = (path) => call('DELETE', path);
export const put = (path, body) => call('PUT', path, { body });

export const listCaptures = (params, signal) => get('webhooks/', params, signal);
export const getCapture = (id, signal) => get(`webhooks/${encodeURIComponent(id)}/`, null, signal);
export const bodyURL = (id) => `${BASE}/webhooks/${encodeURIComponent(id)}/body`;
export const replay = (req) => post('webhooks/replay/', req);
export const getTunnel = () => get('tunnel/');
export const listCalls = (params, signal) => get('calls/', params, signal);
export const getCall = (id, signal) => get(`calls/${encodeURIComponent(id)}/`, null, signal);
export const deleteCapture = (id) => del(`webhooks/${encodeURIComponent(id)}/`);
export const setKeep = (id, keep) => put(`webhooks/${encodeURIComponent(id)}/keep`, { keep });
export const deleteCall = (id) => del(`calls/${encodeURIComponent(id)}/`);
export const replayCall = (id, timeScale) => post(`calls/${encodeURIComponent(id)}/replay/`, { time_scale: timeScale });
// exportURL downloads what the list's filters select (limit and offset
// aside), as JSON Lines or HAR.
export function exportURL(filters, format) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(filters || {})) {
    if (v != null && v !== '' && k !== 'limit' && k !== 'offset') q.set(k, String(v));
  }
  q.set('format', format);
  return `${BASE}/export?${q}`;
}

// Stream follows /api/v1/ext/stream. EventSource reconnects by itself after
// a dropped connection but gives up for good on an HTTP error, so a closed
// source is reopened here with a capped backoff. onState gets 'live',
// 'reconnecting' or 'offline'; onResync is called after a reconnect, when
// events may have been missed.
export class Stream {
  constructor({ onCapture, onTunnel, onMedia, onState, onResync }) {
    this.h = { onCapture, onTunnel, onMedia, onState, onResync };
    this.backoff = 500;
    this.wasLive = false;
    this.open();
  }

  open() {
    const es = new EventSource(`${BASE}/stream`);
    this.es = es;
    es.addEventListener('open', () => {
      this.backoff = 500;
      this.h.onState?.('live');
      if (this.wasLive) this.h.onResync?.();
      this.wasLive = true;
    });
    es.addEventListener('capture', (e) => {
      const c = parse(e.data);
      if (c && c.id) this.h.onCapture?.(c);
    });
    // The server drops events for a client that cannot keep up and says
    // so with "resync": refetch what is on screen.
    es.addEventListener('resync', () => this.h.onResync?.());
    es.addEventListener('media', (e) => {
      const m = parse(e.data);
      if (m) this.h.onMedia?.(m);
    });
    es.addEventListener('tunnel', (e) => {
      const t = parse(e.data);
      if (t) this.h.onTunnel?.(t);
    });
    es.addEventListener('error', () => {
      if (es.readyState === EventSource.CLOSED) {
        this.h.onState?.('offline');
        const wait = this.backoff;
        this.backoff = Math.min(this.backoff * 2, 10000);
        setTimeout(() => {
          if (this.es === es) this.open();
        }, wait);
      } else {
        this.h.onState?.('reconnecting');
      }
    });
  }
}

function parse(s) {
  try {
    return JSON.parse(s);
  } catch {
    return null;
  }
}
