// Formatting of times, durations, sizes, statuses and event kinds for
// display. Pure functions; no DOM.

const pad = (n, w = 2) => String(n).padStart(w, '0');

export function parseTime(s) {
  if (!s) return null;
  const t = Date.parse(s);
  return Number.isNaN(t) ? null : t;
}

// clock is HH:MM:SS.mmm in local time, with the date in front when the
// time is not today.
export function clock(s) {
  const t = parseTime(s);
  if (t == null) return '';
  const d = new Date(t);
  const hms = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
  const now = new Date();
  if (d.toDateString() === now.toDateString()) return hms;
  return `${d.toLocaleString('en', { month: 'short' })} ${d.getDate()} ${hms.slice(0, 8)}`;
}

// timeOfDay is HH:MM:SS.mmm in local time, for rows within one call.
export function timeOfDay(s) {
  const t = parseTime(s);
  if (t == null) return '';
  const d = new Date(t);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

// fullTime is an unambiguous local date and time, for titles and details.
export function fullTime(s) {
  const t = parseTime(s);
  if (t == null) return s ? String(s) : '';
  const d = new Date(t);
  const off = -d.getTimezoneOffset();
  const sign = off >= 0 ? '+' : '-';
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)} ` +
    `${sign}${pad(Math.floor(Math.abs(off) / 60))}:${pad(Math.abs(off) % 60)}`;
}

export function ago(s) {
  const t = parseTime(s);
  if (t == null) return '';
  const sec = Math.round((Date.now() - t) / 1000);
  if (sec < 5) return 'just now';
  if (sec < 60) return `${sec}s ago`;
  if (sec < 3600) return `${Math.floor(sec / 60)}m ago`;
  if (sec < 86400) return `${Math.floor(sec / 3600)}h ago`;
  return `${Math.floor(sec / 86400)}d ago`;
}

// duration formats milliseconds compactly: 840 µs, 12 ms, 1.24 s, 2m 03s.
export function duration(ms) {
  if (ms == null || Number.isNaN(Number(ms))) return '';
  ms = Number(ms);
  if (ms < 1) return `${Math.round(ms * 1000)} µs`;
  if (ms < 1000) return `${ms < 10 ? ms.toFixed(1) : Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s < 10 ? s.toFixed(2) : s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${pad(Math.floor(s % 60))}s`;
  return `${Math.floor(m / 60)}h ${pad(m % 60)}m`;
}

// span formats a signed difference in milliseconds, "+1.2 s".
export function delta(ms) {
  if (ms == null) return '';
  return (ms < 0 ? '−' : '+') + duration(Math.abs(ms));
}

export function size(n) {
  if (n == null) return '';
  n = Number(n);
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(n < 10240 ? 1 : 0)} KB`;
  return `${(n / 1024 / 1024).toFixed(1)} MB`;
}

export function num(n) {
  return n == null ? '' : Number(n).toLocaleString();
}

// statusClass names the colour class of an HTTP status: s2, s3, s4, s5 or
// snone when there is no response (yet).
export function statusClass(code) {
  if (code == null || code === 0) return 'snone';
  const c = Math.floor(Number(code) / 100);
  return c >= 1 && c <= 5 ? 's' + c : 'snone';
}

export function shortId(id) {
  return id ? String(id).slice(0, 8) : '';
}

// The six event kinds of the service (documentation section 6.2), each with
// a short badge label and a colour class. Other kinds are shown as they
// come, in grey.
export const EVENT_KINDS = [
  ['call.started', 'started', 'k-started'],
  ['call.connected', 'connected', 'k-connected'],
  ['call.ended', 'ended', 'k-ended'],
  ['call.failed', 'failed', 'k-failed'],
  ['call.recording_available', 'recording', 'k-recording'],
  ['call.analysis_completed', 'analysis', 'k-analysis'],
];
const KIND = new Map(EVENT_KINDS.map(([k, label, cls]) => [k, { label, cls }]));

export function eventKind(ev) {
  if (!ev) return null;
  const k = KIND.get(ev);
  if (k) return k;
  return { label: String(ev).replace(/^call\./, ''), cls: 'k-other' };
}

// toLocalInput turns an RFC 3339 time into the value of a datetime-local
// input (local time, seconds precision), and back.
export function toLocalInput(s) {
  const t = parseTime(s);
  if (t == null) return '';
  const d = new Date(t);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

export function fromLocalInput(v) {
  if (!v) return '';
  const t = new Date(v);
  return Number.isNaN(t.getTime()) ? '' : t.toISOString();
}
