// The calls view: captures grouped by call id, and one call in full — a
// timeline of its events drawn to scale (when each happened at the service
// and when it reached calltap), the call block, the analysis, media and
// anomalies. The calls API is read tolerantly: fields it does not send are
// left out, fields it adds later do no harm.

import { h, icon, clear, extLink, safeURL, copyButton, toast, confirmDialog } from './dom.js';
import * as api from './api.js';
import * as fmt from './format.js';
import * as json from './json.js';
import { VirtualList } from './vlist.js';
import { eventBadge, statusCell } from './list.js';

export const CALL_FILTERS = ['event', 'outcome_code', 'anomaly'];

// The anomaly codes of the calls API (issue 5), for the filter.
const ANOMALY_CODES = ['ended_and_failed', 'multiple_ended', 'multiple_failed', 'after_final', 'out_of_order', 'analysis_pending', 'missing_events'];

const first = (...vs) => vs.find((v) => v != null && v !== '');

function callSummary(c) {
  const call = c.call || {};
  const anomalies = Array.isArray(c.anomalies) ? c.anomalies.length : Number(first(c.anomalies, c.anomaly_count, 0)) || 0;
  return {
    id: first(c.call_id, call.call_id, c.id),
    last: first(c.last_at, c.last_activity, c.last_activity_at, c.updated_at, c.last_received_at),
    lastEvent: first(c.last_event, c.queuedst_event, c.event),
    count: first(c.event_count, c.events_count, typeof c.events === 'number' ? c.events : null, Array.isArray(c.events) ? c.events.length : null, c.count),
    outcome: first(c.outcome_code, call.outcome_code, c.state, c.outcome, call.outcome, c.final_event ? String(c.final_event).replace(/^call\./, '') : null),
    who: first(c.contact_name, call.contact && call.contact.name, c.to_number, call.to_number),
    leadScore: c.lead_score,
    anomalies,
  };
}

function anomalyText(a) {
  if (typeof a === 'string') return { code: '', message: a, severity: 'warning', refs: [] };
  const refs = Array.isArray(a.capture_ids) ? a.capture_ids.filter(Boolean) : [first(a.capture_id)].filter(Boolean);
  return { code: a.code || a.kind || '', message: a.message || a.description || a.code || '', severity: a.severity || 'warning', refs, event: a.event };
}

export class CallsView {
  // app: {navigate(path), tunnel()}
  constructor(app) {
    this.app = app;
    this.filters = this.filtersFromURL();
    this.countEl = h('span', { class: 'count' });
    this.list = new VirtualList({
      rowHeight: 34,
      pageSize: 100,
      key: (c) => callSummary(c).id,
      fetchPage: (offset, limit, signal) => api.listCalls({ ...this.filters, limit, offset }, signal),
      createRow: () => this.createRow(),
      fillRow: (el, c) => this.fillRow(el, c),
      onOpen: (c) => app.navigate(`/calls/${encodeURIComponent(callSummary(c).id)}${this.query()}`),
      onCount: (n) => {
        this.countEl.textContent = `${fmt.num(n)} ${n === 1 ? 'call' : 'calls'}`;
      },
      empty: () => h('div', { class: 'empty-msg' }, h('div', { class: 'empty-title' }, 'No calls yet'),
        h('div', { class: 'muted' }, 'Requests whose body is a call event of the service are grouped here by call id.'),
        h('div', { class: 'muted' }, 'Try ', h('code', { class: 'mono' }, 'calltap trigger --flow completed --to <public url>'))),
    });
    this.listPane = h('section', { class: 'pane list-pane', 'aria-label': 'Calls' },
      this.filterBar(),
      h('div', { class: 'lhead call' }, h('span', null, 'Last activity'), h('span', null, 'Call'), h('span', null, 'Contact'), h('span', null, 'Last event'),
        h('span', { class: 'r' }, 'Events'), h('span', null, 'Outcome'), h('span', null, 'Anomalies')),
      this.list.el,
      h('div', { class: 'lfoot' }, this.countEl, h('span', { class: 'spacer' }), h('span', { class: 'muted' }, 'latest activity first')));
    this.detail = h('section', { class: 'pane detail-pane', 'aria-label': 'Call detail' });
    this.callId = null;
    this.started = false;
    this.showEmpty();
  }

  start() {
    if (!this.started) {
      this.started = true;
      this.list.reset();
    }
  }

  filtersFromURL() {
    const q = new URLSearchParams(location.search);
    const f = {};
    for (const k of CALL_FILTERS) if (q.get(k)) f[k] = q.get(k);
    return f;
  }

  query() {
    const q = new URLSearchParams();
    for (const k of CALL_FILTERS) if (this.filters[k]) q.set(k, this.filters[k]);
    const s = q.toString();
    return s ? '?' + s : '';
  }

  filterBar() {
    this.inputs = {};
    const ev = h('select', { class: 'f-event', 'aria-label': 'Has event' }, h('option', { value: '' }, 'Any event'), fmt.EVENT_KINDS.map(([k]) => h('option', { value: k }, k)));
    ev.value = this.filters.event || '';
    ev.addEventListener('change', () => this.set('event', ev.value));
    const oc = h('input', { class: 'f-outcome mono', type: 'text', placeholder: 'outcome code', 'aria-label': 'Outcome code', spellcheck: 'false', value: this.filters.outcome_code || '', list: 'outcome-codes' });
    oc.addEventListener('change', () => this.set('outcome_code', oc.value.trim()));
    const dl = h('datalist', { id: 'outcome-codes' }, ['busy', 'no_answer', 'dispatch_error'].map((v) => h('option', { value: v })));
    const an = h('select', { class: 'f-anomaly', 'aria-label': 'Anomalies' },
      [['', 'Any calls'], ['any', 'With anomalies'], ...ANOMALY_CODES.map((c) => [c, c.replace(/_/g, ' ')])].map(([v, t]) => h('option', { value: v }, t)));
    an.value = this.filters.anomaly || '';
    an.addEventListener('change', () => this.set('anomaly', an.value));
    Object.assign(this.inputs, { event: ev, outcome_code: oc, anomaly: an });
    return h('div', { class: 'filters' }, h('div', { class: 'frow' }, ev, oc, dl, an));
  }

  set(k, v) {
    if (v) this.filters[k] = v;
    else delete this.filters[k];
    history.replaceState(history.state, '', location.pathname + this.query());
    this.list.reset();
  }

  syncFromURL() {
    const f = this.filtersFromURL();
    const same = CALL_FILTERS.every((k) => (f[k] || '') === (this.filters[k] || ''));
    if (same) return;
    this.filters = f;
    this.inputs.event.value = f.event || '';
    this.inputs.outcome_code.value = f.outcome_code || '';
    this.inputs.anomaly.value = f.anomaly || '';
    if (this.started) this.list.reset();
  }

  createRow() {
    const row = h('div', { class: 'call' });
    row.c = {
      time: h('span', { class: 'c-time mono' }),
      id: h('span', { class: 'c-call mono' }),
      who: h('span', { class: 'c-who' }),
      ev: h('span', { class: 'c-event' }),
      n: h('span', { class: 'c-n r mono' }),
      outcome: h('span', { class: 'c-outcome' }),
      anom: h('span', { class: 'c-anom' }),
    };
    row.append(...Object.values(row.c));
    return row;
  }

  fillRow(row, c) {
    const x = row.c;
    if (!c) {
      for (const el of Object.values(x)) clear(el);
      return;
    }
    const s = callSummary(c);
    x.time.textContent = fmt.clock(s.last);
    x.time.title = fmt.fullTime(s.last);
    x.id.textContent = fmt.shortId(s.id);
    x.id.title = s.id || '';
    x.who.textContent = s.who || '';
    clear(x.ev, s.lastEvent ? eventBadge(s.lastEvent) : '');
    x.n.textContent = s.count != null ? String(s.count) : '';
    clear(x.outcome, s.outcome ? h('span', { class: 'outcome o-' + String(s.outcome).replace(/[^a-z_]/gi, '') }, s.outcome) : '');
    clear(x.anom, s.anomalies ? h('span', { class: 'flag f-anom', title: `${s.anomalies} anomal${s.anomalies === 1 ? 'y' : 'ies'}` }, icon('warn'), String(s.anomalies)) : '');
  }

  showEmpty() {
    this.callId = null;
    clear(this.detail, h('div', { class: 'detail-empty' }, h('div', { class: 'empty-title' }, 'Select a call'),
      h('div', { class: 'muted' }, 'See its events on a timeline, the call block, analysis, media and anomalies.')));
  }

  async open(id) {
    this.list.select(id);
    if (!id) return this.showEmpty();
    const same = id === this.callId;
    this.callId = id;
    if (!same) clear(this.detail, h('div', { class: 'detail-loading' }, h('div', { class: 'spinner' })));
    this.ctl?.abort();
    const ctl = (this.ctl = new AbortController());
    try {
      const d = await api.getCall(id, ctl.signal);
      if (this.callId !== id) return;
      const scroll = same ? this.detail.querySelector('.detail-body')?.scrollTop : 0;
      this.render(id, d);
      if (scroll) this.detail.querySelector('.detail-body').scrollTop = scroll;
    } catch (e) {
      if (e.name === 'AbortError' || this.callId !== id) return;
      clear(this.detail, h('div', { class: 'detail-empty' },
        h('div', { class: 'empty-title' }, e.httpStatus === 404 ? 'Call not found' : 'Could not load the call'), h('div', { class: 'muted' }, e.message)));
    }
  }

  onCapture(c) {
    if (!c.call_id) return;
    // A call's row moves to the top on any activity, and only the server
    // knows its new summary: refetch the head.
    if (this.started) this.list.refreshHead();
    if (c.call_id === this.callId) {
      clearTimeout(this.refreshTimer);
      this.refreshTimer = setTimeout(() => this.open(this.callId), 150);
    }
  }

  // onMedia: a saved copy of the open call's media changed state.
  onMedia(m) {
    if (m.call_id && m.call_id === this.callId) {
      clearTimeout(this.refreshTimer);
      this.refreshTimer = setTimeout(() => this.open(this.callId), 150);
    }
  }

  resync() {
    if (this.started) this.list.refreshHead();
    if (this.callId) this.open(this.callId);
  }

  render(id, d) {
    const call = d.call || {};
    const events = (Array.isArray(d.events) ? d.events : Array.isArray(d.timeline) ? d.timeline : Array.isArray(d.captures) ? d.captures : []).slice();
    const anomalies = (Array.isArray(d.anomalies) ? d.anomalies : []).map(anomalyText);
    const analysis = d.analysis || null;
    const media = d.media || null;
    const saved = first(d.media_files, d.saved_media, d.downloads, media && media.saved, media && media.files) || [];
    const s = callSummary({ ...d, call });

    const close = h('button', { class: 'btn btn-ghost btn-sm btn-icon', type: 'button', title: 'Close (Esc)', 'aria-label': 'Close' }, icon('x'));
    close.addEventListener('click', () => this.app.navigate('/calls' + this.query()));
    // Replay call: every event again, in order, spaced as they first
    // arrived or back to back.
    const spacing = h('select', { class: 'act-replay-spacing', 'aria-label': 'Spacing of the replayed events', title: 'Spacing of the replayed events' },
      h('option', { value: '1' }, 'as they arrived'), h('option', { value: '0' }, 'back to back'));
    const replayBtn = h('button', { class: 'btn btn-primary btn-sm act-replay-call', type: 'button', title: 'Replay every event of this call (r)' }, icon('replay'), 'Replay call');
    this.replayCall = async () => {
      replayBtn.disabled = true;
      try {
        const r = await api.replayCall(id, Number(spacing.value));
        toast(`Replaying ${r.count} event${r.count === 1 ? '' : 's'} of the call`, 'info', 2500);
      } catch (err) {
        toast(`Could not replay the call: ${err.message}`, 'error');
      } finally {
        replayBtn.disabled = false;
      }
    };
    replayBtn.addEventListener('click', () => this.replayCall());
    const delBtn = h('button', { class: 'btn btn-sm btn-danger act-delete-call', type: 'button', title: 'Delete every request of this call, and its saved media' }, 'Delete call');
    delBtn.addEventListener('click', async () => {
      if (!(await confirmDialog('Delete this call?', `Every request of call ${id} and its saved recordings and transcripts will be gone from the store.`))) return;
      try {
        await api.deleteCall(id);
        toast('Call deleted', 'ok', 1500);
        this.app.onDeleted();
        this.app.navigate('/calls' + this.query());
      } catch (err) {
        toast(`Could not delete the call: ${err.message}`, 'error');
      }
    });
    const head = h('header', { class: 'd-head' },
      h('div', { class: 'd-line' },
        icon('phone', 'big-icon'),
        h('span', { class: 'd-path mono' }, id),
        copyButton(id, '', 'Copy call id'),
        h('span', { class: 'spacer' }),
        spacing,
        replayBtn,
        delBtn,
        close),
      h('div', { class: 'd-meta' },
        s.lastEvent ? eventBadge(s.lastEvent) : null,
        call.status ? h('span', null, call.status) : null,
        s.outcome ? h('span', { class: 'outcome o-' + String(s.outcome).replace(/[^a-z_]/gi, '') }, s.outcome) : null,
        call.duration_seconds != null ? h('span', null, fmt.duration(call.duration_seconds * 1000)) : null,
        h('span', null, `${events.length} event${events.length === 1 ? '' : 's'}`),
        anomalies.length ? h('span', { class: 'flag f-anom' }, icon('warn'), `${anomalies.length} anomal${anomalies.length === 1 ? 'y' : 'ies'}`) : null,
        h('a', { href: `/?call_id=${encodeURIComponent(id)}`, 'data-nav': '', class: 'small' }, 'show requests')));

    const body = h('div', { class: 'detail-body call-body' });
    if (anomalies.length) {
      body.append(h('div', { class: 'sect-plain' }, h('ul', { class: 'checks anomalies' }, anomalies.map((a) => h('li', { class: 'check ' + json.severityClass(a.severity) },
        icon('warn'), h('span', { class: 'check-msg' }, a.message), a.code ? h('span', { class: 'check-code mono' }, a.code) : null,
        a.refs.slice(0, 4).map((r) => h('a', { href: `/requests/${encodeURIComponent(r)}`, 'data-nav': '', class: 'mono small' }, fmt.shortId(r))))))));
    }
    body.append(section('Timeline', h('span', { class: 'muted' }, 'to scale'), timeline(events, anomalies)));
    body.append(section('Events', h('span', { class: 'muted' }, String(events.length)), eventsTable(events)));
    body.append(section('Call', null, callBlock(call)));
    const contact = call.contact;
    if (contact && typeof contact === 'object') body.append(section('Contact', contact.name || null, contactBlock(contact)));
    if (call.variables && typeof call.variables === 'object') body.append(section('Variables', h('span', { class: 'muted' }, String(Object.keys(call.variables).length)), mapTable(call.variables)));
    if (analysis) body.append(section('Analysis', analysis.sentiment ? h('span', { class: 'pill sent-' + String(analysis.sentiment).replace(/[^a-z]/gi, '') }, analysis.sentiment) : null, analysisBlock(analysis)));
    if (media || saved.length) body.append(section('Media', null, mediaBlock(media, saved, events)));
    if (Object.keys(call).length) body.append(section('Call block (raw)', h('span', { class: 'muted' }, 'latest, as sent'), json.tree(json.parse(JSON.stringify(call))), false));
    clear(this.detail, head, body);
  }
}

function section(title, extra, content, open = true) {
  return h('details', { class: 'sect', open }, h('summary', null, icon('chevron', 'sect-chev'), h('span', { class: 'sect-title' }, title), extra ? h('span', { class: 'sect-extra' }, extra) : null), content);
}

function kv(rows) {
  const r = rows.filter((x) => x && x[1] != null && x[1] !== '');
  if (!r.length) return h('div', { class: 'muted pad' }, 'Nothing reported');
  return h('dl', { class: 'kv' }, r.map(([k, v]) => [h('dt', null, k), h('dd', null, typeof v === 'object' && !(v instanceof Node) ? JSON.stringify(v) : v)]));
}

function mono(v) {
  return v == null || v === '' ? null : h('span', { class: 'mono' }, String(v));
}

function timeCell(v) {
  return v ? h('span', { title: String(v) }, fmt.fullTime(v)) : null;
}

function callBlock(c) {
  const agent = c.agent && typeof c.agent === 'object' ? [c.agent.name, c.agent.id ? h('span', { class: 'mono muted' }, ' ' + c.agent.id) : null] : c.agent;
  return kv([
    ['Direction', c.direction],
    ['Status', c.status],
    ['Outcome', c.outcome],
    ['Outcome code', mono(c.outcome_code)],
    ['Disposition', c.disposition],
    ['From', mono(c.from_number)],
    ['To', mono(c.to_number)],
    ['Started', timeCell(c.started_at)],
    ['Answered', timeCell(c.answered_at)],
    ['Ended', timeCell(c.ended_at)],
    ['Duration', c.duration_seconds != null ? `${c.duration_seconds} s` : null],
    ['Attempt', c.attempt_number],
    ['Agent', agent ? h('span', null, agent) : null],
    ['Campaign', mono(c.campaign_id)],
  ]);
}

function contactBlock(ct) {
  const wrap = h('div', null, kv([
    ['Name', ct.name],
    ['Phone', mono(ct.phone)],
    ['Email', ct.email],
    ['Id', mono(ct.id)],
  ]));
  if (ct.custom_fields && typeof ct.custom_fields === 'object' && Object.keys(ct.custom_fields).length) {
    wrap.append(h('div', { class: 'sub-title' }, 'Custom fields'), mapTable(ct.custom_fields));
  }
  return wrap;
}

function mapTable(obj) {
  const entries = Object.entries(obj);
  if (!entries.length) return h('div', { class: 'muted pad' }, 'None');
  return h('table', { class: 'htable' }, h('tbody', null, entries.map(([k, v]) => h('tr', null, h('th', { class: 'mono' }, k),
    h('td', { class: 'mono' }, typeof v === 'string' ? v : JSON.stringify(v))))));
}

function analysisBlock(a) {
  const wrap = h('div', { class: 'analysis' });
  if (a.summary) wrap.append(h('p', { class: 'summary' }, a.summary));
  const score = Number(a.lead_score);
  const scoreEl = a.lead_score != null && !Number.isNaN(score)
    ? h('span', { class: 'score' }, h('span', { class: 'meter' }, h('span', { class: 'meter-fill', style: { width: `${Math.max(0, Math.min(100, score <= 1 ? score * 100 : score))}%` } })), h('span', { class: 'mono' }, String(a.lead_score)))
    : a.lead_score != null ? mono(a.lead_score) : null;
  wrap.append(kv([
    ['Short summary', a.short_summary],
    ['Sentiment', a.sentiment],
    ['Lead score', scoreEl],
    ['Disposition', a.disposition],
  ]));
  const rs = Array.isArray(a.extracted_responses) ? a.extracted_responses : [];
  if (rs.length) {
    wrap.append(h('div', { class: 'sub-title' }, 'Extracted answers'),
      h('table', { class: 'grid answers' },
        h('thead', null, h('tr', null, ['Question', 'Variable', 'Answer', 'Weight'].map((t) => h('th', null, t)))),
        h('tbody', null, rs.map((r) => h('tr', null,
          h('td', null, r.question ?? ''), h('td', { class: 'mono' }, r.variableName ?? ''), h('td', { class: 'answer' }, r.answer ?? ''), h('td', { class: 'mono r' }, r.weight ?? ''))))));
  }
  return wrap;
}

// sameOrigin returns a link for a path the inspector serves (saved media).
function localHref(p) {
  if (typeof p !== 'string' || !p) return null;
  try {
    const u = new URL(p, location.href);
    return u.origin === location.origin ? u.pathname + u.search : safeURL(u.href);
  } catch {
    return null;
  }
}

function mediaBlock(media, saved, events) {
  const wrap = h('div', { class: 'media' });
  if (media) {
    const received = events.map((e) => fmt.parseTime(first(e.received_at, e.created_at))).filter((t) => t != null);
    const base = received.length ? Math.max(...received) : null;
    // The agent knows when each link expires (media_files); otherwise
    // count from the last event that brought links.
    const fileExpired = (kind) => { const f = (saved || []).find((x) => x.kind === kind); return f && typeof f.expired === 'boolean' ? f.expired : null; };
    const guess = media.expires_in != null && base != null && Date.now() > base + Number(media.expires_in) * 1000;
    const expiredOf = (kind) => fileExpired(kind) ?? guess;
    wrap.append(kv([
      ['Recording', media.recording_url ? h('span', { class: 'wrap' }, extLink(media.recording_url, 'original link'), expiredOf('recording') ? h('span', { class: 'flag f-failed' }, 'expired') : null) : null],
      ['Transcript', media.transcript_url ? h('span', { class: 'wrap' }, extLink(media.transcript_url, 'original link'), expiredOf('transcript') ? h('span', { class: 'flag f-failed' }, 'expired') : null) : null],
      ['Links valid for', media.expires_in != null ? `${media.expires_in} s` : null],
    ]));
  }
  const files = Array.isArray(saved) ? saved : [];
  if (files.length) {
    wrap.append(h('div', { class: 'sub-title' }, 'Saved copies'), h('table', { class: 'grid' },
      h('thead', null, h('tr', null, ['File', 'Type', 'Size', 'sha256', 'State'].map((t) => h('th', null, t)))),
      h('tbody', null, files.map((f) => {
        const href = localHref(first(f.url, f.href, f.path, f.download_url));
        const st = first(f.status, f.state, href ? 'saved' : '');
        const tries = f.attempts > 1 ? ` (${f.attempts} attempts)` : '';
        const state = f.error
          ? h('span', { class: 'err-text', title: f.error }, `${st ? st + ': ' : ''}${f.error}${tries}`)
          : h('span', { class: st === 'saved' ? 's2' : 'muted' }, st + tries);
        const kind = first(f.kind, f.name, f.type, 'file');
        return h('tr', null,
          h('td', null, href ? h('a', { href, download: '' }, kind) : kind),
          h('td', { class: 'mono' }, f.content_type || ''),
          h('td', { class: 'mono' }, f.size != null ? fmt.size(f.size) : ''),
          h('td', { class: 'mono small', title: f.sha256 || '' }, f.sha256 ? String(f.sha256).slice(0, 12) + '…' : ''),
          h('td', null, state || ''));
      }))));
    const audio = files.find((f) => /^audio\//.test(f.content_type || '') && localHref(first(f.url, f.href, f.path, f.download_url)));
    if (audio) wrap.append(h('audio', { controls: true, preload: 'none', src: localHref(first(audio.url, audio.href, audio.path, audio.download_url)) }));
  } else if (media) {
    wrap.append(h('div', { class: 'muted small pad' }, 'No saved copies yet.'));
  }
  return wrap;
}

function evFields(e) {
  return {
    id: first(e.capture_id, e.id),
    kind: first(e.event, e.kind),
    occurred: fmt.parseTime(e.occurred_at),
    received: fmt.parseTime(first(e.received_at, e.created_at)),
    arrived: fmt.parseTime(e.arrived_at),
    delivery: first(e.delivery_id),
    dup: e.duplicate || !!first(e.duplicate_of),
    queued: !!e.queued,
    status: e.response_status,
    raw: e,
  };
}

function checkCounts(e) {
  const out = [];
  if (e.check_errors) out.push(h('span', { class: 'flag f-failed', title: 'contract findings of severity error' }, `${e.check_errors} error${e.check_errors === 1 ? '' : 's'}`));
  if (e.check_warnings) out.push(h('span', { class: 'flag f-anom', title: 'contract findings of severity warning' }, `${e.check_warnings} warning${e.check_warnings === 1 ? '' : 's'}`));
  return out.length ? out : h('span', { class: 'muted small' }, e.check_errors === 0 ? 'ok' : '');
}

function eventsTable(events) {
  if (!events.length) return h('div', { class: 'muted pad' }, 'No events');
  return h('table', { class: 'grid events' },
    h('thead', null, h('tr', null, ['Occurred', 'Received', 'Event', 'Status', 'Delivery', 'Checks', ''].map((t) => h('th', null, t)))),
    h('tbody', null, events.map((e) => {
      const f = evFields(e);
      return h('tr', { class: 'ev-row', dataset: { event: f.kind || '' } },
        h('td', { class: 'mono', title: e.occurred_at || '' }, fmt.timeOfDay(e.occurred_at)),
        h('td', { class: 'mono', title: fmt.fullTime(first(e.received_at, e.created_at)) }, fmt.timeOfDay(first(e.received_at, e.created_at))),
        h('td', null, f.kind ? eventBadge(f.kind) : ''),
        h('td', null, statusCell(e)),
        h('td', null, f.occurred != null && f.received != null ? h('span', { class: 'mono muted' }, fmt.delta(f.received - f.occurred)) : '',
          f.dup ? h('span', { class: 'flag f-dup' }, 'dup') : null, f.queued ? h('span', { class: 'flag f-queued' }, 'queued') : null,
          e.replay_of ? h('span', { class: 'flag f-replay' }, 'replay') : null),
        h('td', null, checkCounts(e)),
        h('td', null, f.id ? h('a', { href: `/requests/${encodeURIComponent(f.id)}`, 'data-nav': '', class: 'mono small' }, fmt.shortId(f.id)) : ''));
    })));
}

// niceStep picks a tick interval giving about n ticks over span ms.
function niceStep(span, n) {
  const steps = [100, 250, 500, 1e3, 2e3, 5e3, 10e3, 15e3, 30e3, 60e3, 120e3, 300e3, 600e3, 900e3, 1800e3, 3600e3, 7200e3, 21600e3, 43200e3, 86400e3];
  return steps.find((s) => span / s <= n) || 86400e3 * Math.ceil(span / n / 86400e3);
}

function tickLabel(ms) {
  if (ms === 0) return '0';
  if (ms < 1000) return `+${ms} ms`;
  if (ms < 60e3) return `+${ms / 1000}s`;
  if (ms < 3600e3) return `+${Math.floor(ms / 60e3)}m${ms % 60e3 ? ` ${(ms % 60e3) / 1000}s` : ''}`;
  return `+${Math.floor(ms / 3600e3)}h${ms % 3600e3 ? ` ${Math.floor((ms % 3600e3) / 60e3)}m` : ''}`;
}

// fitTicks shows every kth axis label, k the smallest for which no two
// overlap at the axis's present width: the labels keep their size while
// the axis grows and shrinks with the window, so a span's nice steps
// (every 250 ms of a second) may not all fit.
function fitTicks(axis) {
  if (!axis.isConnected || !axis.clientWidth) return;
  const ticks = [...axis.children];
  for (let k = 1; k <= ticks.length; k++) {
    ticks.forEach((t, i) => t.classList.toggle('off', i % k !== 0));
    const shown = ticks.filter((_, i) => i % k === 0).map((t) => t.getBoundingClientRect());
    if (shown.every((r, i) => i === 0 || shown[i - 1].right + 6 <= r.left)) return;
  }
}

// tickFitter fits an axis's labels when it is laid out and whenever its
// width changes; an axis taken out of the page is let go.
const tickFitter = new ResizeObserver((entries) => {
  for (const e of entries) {
    if (e.target.isConnected) fitTicks(e.target);
    else tickFitter.unobserve(e.target);
  }
});

// timeline draws one lane per delivery (retries and duplicates of one
// payload id share a lane): a hollow mark when the event occurred at the
// service, filled marks when copies reached calltap, and the line between
// them is the delivery delay. The x axis is linear, so gaps are gaps.
function timeline(events, anomalies) {
  const fs = events.map(evFields);
  const times = fs.flatMap((f) => [f.occurred, f.received]).filter((t) => t != null);
  if (!times.length) return h('div', { class: 'muted pad' }, 'No timed events');
  const t0 = Math.min(...times);
  const t1 = Math.max(...times);
  const span = Math.max(t1 - t0, 1000);
  const x = (t) => `${((t - t0) / span) * 100}%`;

  const lanes = [];
  const byKey = new Map();
  for (const f of fs) {
    const k = f.delivery || `${f.kind}|${f.occurred}|${f.id}`;
    let lane = byKey.get(k);
    if (!lane) {
      lane = { kind: f.kind, occurred: f.occurred, hits: [] };
      byKey.set(k, lane);
      lanes.push(lane);
    }
    if (lane.occurred == null) lane.occurred = f.occurred;
    lane.hits.push(f);
  }
  lanes.sort((a, b) => (a.occurred ?? a.hits[0].received ?? 0) - (b.occurred ?? b.hits[0].received ?? 0));
  const anomalous = new Set(anomalies.flatMap((a) => a.refs));
  const anomalousKinds = new Set(anomalies.map((a) => a.event).filter(Boolean));

  const step = niceStep(span, 6);
  const axis = h('div', { class: 'tl-axis' });
  for (let t = 0; t <= span; t += step) axis.append(h('span', { class: 'tl-tick', style: { left: x(t0 + t) } }, tickLabel(t)));
  tickFitter.observe(axis);

  let prev = null;
  const rows = lanes.map((lane) => {
    const track = h('div', { class: 'tl-track' });
    const recs = lane.hits.map((f) => f.received).filter((t) => t != null);
    if (lane.occurred != null && recs.length) {
      const a = Math.min(lane.occurred, ...recs);
      const b = Math.max(lane.occurred, ...recs);
      track.append(h('span', { class: 'tl-lag', style: { left: x(a), width: `${((b - a) / span) * 100}%` } }));
    }
    if (lane.occurred != null) {
      track.append(h('span', { class: 'tl-occ ' + (fmt.eventKind(lane.kind)?.cls || ''), style: { left: x(lane.occurred) }, title: `occurred ${fmt.fullTime(new Date(lane.occurred).toISOString())}` }));
    }
    lane.hits.forEach((f, i) => {
      if (f.received == null) return;
      const cls = ['tl-rec', fmt.statusClass(f.status)];
      if (f.dup || i > 0) cls.push('dup');
      if (f.queued) cls.push('queued');
      const title = `${i > 0 || f.dup ? 'duplicate ' : ''}received ${fmt.fullTime(new Date(f.received).toISOString())}` +
        (f.occurred != null ? ` (${fmt.delta(f.received - f.occurred)} after it occurred)` : '') + (f.status ? ` → ${f.status}` : '') + (f.queued ? ' · from the relay queue' : '');
      const el = f.id ? h('a', { class: cls.join(' '), href: `/requests/${encodeURIComponent(f.id)}`, 'data-nav': '', style: { left: x(f.received) }, title }) : h('span', { class: cls.join(' '), style: { left: x(f.received) }, title });
      track.append(el);
    });
    const firstRec = recs.length ? Math.min(...recs) : null;
    const lag = lane.occurred != null && firstRec != null ? firstRec - lane.occurred : null;
    const gap = prev != null && lane.occurred != null ? lane.occurred - prev : null;
    if (lane.occurred != null) prev = lane.occurred;
    const warn = lane.hits.some((f) => anomalous.has(f.id)) || anomalousKinds.has(lane.kind);
    const notes = [
      gap != null ? h('span', { class: 'tl-gap', title: 'time since the previous event occurred' }, fmt.delta(gap)) : h('span', { class: 'tl-gap' }, 'start'),
      lag != null ? h('span', {
        class: 'tl-lagtxt' + (lag > 5000 ? ' slow' : lag < -1000 ? ' skew' : ''),
        title: lag < 0 ? "received before it occurred: the sender's clock is ahead of this machine's, or the event was simulated" : 'delivery delay: received − occurred',
      }, `↳ ${lag < 0 ? fmt.delta(lag) : fmt.duration(lag)}`) : null,
      lane.hits.length > 1 ? h('span', { class: 'flag f-dup', title: `${lane.hits.length} copies of this delivery` }, `×${lane.hits.length}`) : null,
      warn ? h('span', { class: 'flag f-anom', title: 'see anomalies' }, icon('warn')) : null,
    ];
    return h('div', { class: 'tl-lane', dataset: { event: lane.kind || '' } },
      h('div', { class: 'tl-label' }, lane.kind ? eventBadge(lane.kind) : h('span', { class: 'muted' }, '?'),
        h('span', { class: 'mono small muted' }, lane.occurred != null ? fmt.timeOfDay(new Date(lane.occurred).toISOString()) : '')),
      track,
      h('div', { class: 'tl-notes' }, notes));
  });
  const legend = h('div', { class: 'tl-legend small muted' },
    h('span', null, h('span', { class: 'tl-occ k-other demo' }), ' occurred at the service'),
    h('span', null, h('span', { class: 'tl-rec s2 demo' }), ' received by calltap (colour = response)'),
    h('span', null, h('span', { class: 'tl-rec s2 dup demo' }), ' duplicate'),
    h('span', null, h('span', { class: 'tl-lag demo' }), ' delivery delay'),
    h('span', { class: 'spacer' }),
    h('span', null, `span ${fmt.duration(span)}`));
  return h('div', { class: 'timeline' }, h('div', { class: 'tl-lane tl-head' }, h('div'), axis, h('div')), rows, legend);
}
