// The requests view's left side: the filter bar and the live, windowed list
// of captures. Filter state lives in the page URL's query so a view can be
// bookmarked, shared and reloaded.

import { h, icon, clear, copyButton } from './dom.js';
import * as api from './api.js';
import * as fmt from './format.js';
import { VirtualList } from './vlist.js';

// FILTERS are the list API's filter parameters kept in the page URL.
export const FILTERS = ['event', 'call_id', 'route', 'status_class', 'q', 'since', 'until', 'source', 'duplicate'];

export function filtersFromURL() {
  const q = new URLSearchParams(location.search);
  const f = {};
  for (const k of FILTERS) {
    const v = q.get(k);
    if (v) f[k] = v;
  }
  return f;
}

export function filterQuery(f) {
  const q = new URLSearchParams();
  for (const k of FILTERS) if (f[k]) q.set(k, f[k]);
  const s = q.toString();
  return s ? '?' + s : '';
}

function statusClassOf(c) {
  if (c.response_status == null || c.response_status === 0) return 'none';
  return `${Math.floor(c.response_status / 100)}xx`;
}

// matches says whether a live capture belongs in the filtered list: true,
// false, or null when only the server can tell (full-text search).
function matches(c, f) {
  if (f.event && c.event !== f.event) return false;
  if (f.call_id && c.call_id !== f.call_id) return false;
  if (f.route && c.route !== f.route) return false;
  if (f.status_class && statusClassOf(c) !== f.status_class) return false;
  if (f.source && c.source !== f.source) return false;
  if (f.duplicate === 'true' && !c.duplicate_of) return false;
  if (f.duplicate === 'false' && c.duplicate_of) return false;
  const t = fmt.parseTime(c.created_at);
  if (f.since && t != null && t < fmt.parseTime(f.since)) return false;
  if (f.until && t != null && t > fmt.parseTime(f.until)) return false;
  if (f.q) return null;
  return true;
}

export function flagsOf(c) {
  const out = [];
  if (c.replay_of) out.push(['replay', 'replay', `Replay of ${c.replay_of}`]);
  // Both marks, as calltap requests prints them: a replay repeats a
  // payload id already stored, so the handler sees a duplicate too.
  if (c.duplicate_of) {
    out.push(['dup', 'dup', c.duplicate_of === c.replay_of
      ? `Same payload id as ${c.duplicate_of}, which it replays: to the handler, a duplicate delivery`
      : `Duplicate delivery of ${c.duplicate_of} (same payload id)`]);
  }
  if (c.keep) out.push(['kept', 'kept', 'Kept: retention (--retain, --max-store) never prunes it']);
  if (c.queued) out.push(['queued', 'queued', `Delivered from the relay's queue${c.arrived_at ? '; reached the relay ' + fmt.fullTime(c.arrived_at) : ''}`]);
  if (c.status === 'failed') out.push(['failed', 'failed', c.error ? `Failed: ${c.error}` : 'Delivery to the local handler failed']);
  // Not a failure: the agent was killed before it recorded the handler's
  // answer, which the sender may well have got.
  if (c.status === 'unknown') out.push(['answer unknown', 'unknown', c.error || 'The agent stopped before recording the handler\'s answer; the sender may have got it']);
  // Not a failure either: nothing was meant to answer it.
  if (c.status === 'stored') out.push(['stored only', 'stored', storedOnly(c)]);
  if (c.source && c.source !== 'tunnel' && c.source !== 'replay') out.push([c.source, 'src', `Source: ${c.source}`]);
  return out;
}

// storedOnly says why a capture went to no handler, naming its route.
export function storedOnly(c) {
  const why = c.route === 'filtered' ? ': --events left its kind out' : c.route === 'default' ? ': no route took it, and there is no --forward-to' : '';
  return `Stored only (route ${c.route || 'none'}${why}): calltap answered the sender 200 itself and sent it to no handler`;
}

export function statusCell(c) {
  if (c.response_status) return h('span', { class: 'st ' + fmt.statusClass(c.response_status) }, String(c.response_status));
  if (c.status === 'failed') return h('span', { class: 'st s5', title: c.error || 'failed' }, 'ERR');
  if (c.status === 'unknown') return h('span', { class: 'st sunknown', title: c.error || 'answer unknown' }, '?');
  if (c.status === 'stored') return h('span', { class: 'st sstored', title: storedOnly(c) }, 'stored');
  if (c.status === 'pending') return h('span', { class: 'st snone pending', title: 'waiting for the local handler' }, h('span', { class: 'dot' }));
  return h('span', { class: 'st snone' }, '—');
}

export function eventBadge(ev) {
  const k = fmt.eventKind(ev);
  if (!k) return h('span', { class: 'badge k-none' }, '—');
  return h('span', { class: 'badge ' + k.cls, title: ev }, k.label);
}

export class RequestList {
  // app: {navigate(path), selectedId(), tunnel()}
  constructor(app) {
    this.app = app;
    this.filters = filtersFromURL();
    this.countEl = h('span', { class: 'count' });
    this.list = new VirtualList({
      rowHeight: 30,
      pageSize: 100,
      fetchPage: async (offset, limit, signal) => {
        const page = await api.listCaptures({ ...this.filters, limit, offset }, signal);
        if ((page.results || []).some((c) => c.route)) this.showRoutes();
        return page;
      },
      createRow: () => this.createRow(),
      fillRow: (el, c) => this.fillRow(el, c),
      key: (c) => c.id,
      onOpen: (c) => app.navigate(`/requests/${encodeURIComponent(c.id)}${filterQuery(this.filters)}`),
      onCount: (n) => {
        this.countEl.textContent = `${fmt.num(n)} ${n === 1 ? 'request' : 'requests'}`;
      },
      empty: () => this.emptyState(),
    });
    this.el = h('section', { class: 'pane list-pane', 'aria-label': 'Captured requests' },
      this.filterBar(),
      h('div', { class: 'lhead req' },
        h('span', null, 'Time'), h('span', null, 'Request'), h('span', null, 'Event'),
        h('span', null, 'Call'), h('span', { class: 'h-route' }, 'Route'), h('span', { class: 'r' }, 'Status'), h('span', { class: 'r' }, 'Duration'), h('span', null, 'Flags')),
      this.list.el,
      h('div', { class: 'lfoot' }, this.countEl, h('span', { class: 'spacer' }), h('span', { class: 'muted' }, 'newest first')));
    this.list.el.addEventListener('click', (e) => {
      const b = e.target.closest('.callpill');
      if (b) this.set('call_id', b.dataset.call);
      const r = e.target.closest('.routepill');
      if (r) this.set('route', r.dataset.route);
    });
    if (this.filters.route) this.showRoutes();
    this.list.reset();
  }

  // showRoutes shows the Route column, once a capture has a route (or the
  // list is filtered by one): without a route file, the list stays as it
  // always was. It stays shown until the page is reloaded, so that rows do
  // not shift as the list scrolls.
  showRoutes() {
    this.el.classList.add('routed');
  }

  filterBar() {
    const f = this.filters;
    const sel = (name, label, options) => {
      const s = h('select', { class: 'f-' + name, 'aria-label': label, title: label },
        options.map(([v, t]) => h('option', { value: v }, t)));
      s.value = f[name] || '';
      s.addEventListener('change', () => this.set(name, s.value));
      this.inputs[name] = s;
      return s;
    };
    this.inputs = {};
    const search = h('input', { class: 'f-q', type: 'search', placeholder: 'Search bodies…  /', 'aria-label': 'Search bodies', spellcheck: 'false', value: f.q || '' });
    search.addEventListener('input', () => {
      clearTimeout(this.qTimer);
      this.qTimer = setTimeout(() => this.set('q', search.value.trim()), 250);
    });
    search.addEventListener('keydown', (e) => {
      if (e.key === 'Enter') {
        clearTimeout(this.qTimer);
        this.set('q', search.value.trim());
      }
    });
    this.inputs.q = search;
    this.searchEl = search;
    const callId = h('input', { class: 'f-call_id mono', type: 'text', placeholder: 'call id', 'aria-label': 'Call id', spellcheck: 'false', value: f.call_id || '' });
    callId.addEventListener('change', () => this.set('call_id', callId.value.trim()));
    this.inputs.call_id = callId;
    const route = h('input', { class: 'f-route mono', type: 'text', placeholder: 'route', 'aria-label': 'Route', title: 'Route (--routes): a route\'s name, default or filtered', spellcheck: 'false', value: f.route || '' });
    route.addEventListener('change', () => this.set('route', route.value.trim()));
    this.inputs.route = route;
    const time = (name, label) => {
      const i = h('input', { class: 'f-' + name, type: 'datetime-local', step: '1', 'aria-label': label, title: label, value: fmt.toLocalInput(f[name]) });
      i.addEventListener('change', () => this.set(name, fmt.fromLocalInput(i.value)));
      this.inputs[name] = { get value() { return fmt.fromLocalInput(i.value); }, set value(v) { i.value = fmt.toLocalInput(v); }, el: i };
      return h('label', { class: 'pop-row' }, h('span', { class: 'muted' }, label), i);
    };
    this.clearBtn = h('button', { class: 'btn btn-ghost btn-sm f-clear', type: 'button', title: 'Clear all filters' }, icon('x'), 'Clear');
    this.clearBtn.addEventListener('click', () => this.setAll({}));
    this.exportLinks = ['jsonl', 'har'].map((format) =>
      h('a', { class: 'btn btn-ghost btn-sm act-export-' + format, href: '#', download: '', title: `Export what the filters select as ${format === 'har' ? 'HAR' : 'JSON Lines'}${format === 'jsonl' ? ' (x)' : ''}` },
        icon('download'), format === 'har' ? 'HAR' : 'Export'));
    for (const [i, format] of ['jsonl', 'har'].entries()) {
      // The link follows the filters as they change.
      this.exportLinks[i].addEventListener('mousedown', () => (this.exportLinks[i].href = api.exportURL(this.filters, format)));
      this.exportLinks[i].addEventListener('focus', () => (this.exportLinks[i].href = api.exportURL(this.filters, format)));
    }
    const bar = h('div', { class: 'filters' },
      h('div', { class: 'frow' },
        h('label', { class: 'search' }, icon('search'), search),
        sel('event', 'Event kind', [['', 'All events'], ...fmt.EVENT_KINDS.map(([k]) => [k, k])]),
        sel('status_class', 'Response status', [['', 'Any status'], ['2xx', '2xx'], ['3xx', '3xx'], ['4xx', '4xx'], ['5xx', '5xx'], ['none', 'No response']])),
      h('div', { class: 'frow' },
        callId,
        route,
        this.rangePicker(time),
        sel('source', 'Source', [['', 'Any source'], ['tunnel', 'tunnel'], ['replay', 'replay'], ['trigger', 'trigger'], ['backfill', 'backfill']]),
        sel('duplicate', 'Duplicate deliveries', [['', 'Duplicates'], ['false', 'No duplicates'], ['true', 'Only duplicates']]),
        this.clearBtn, ...this.exportLinks));
    this.updateClear();
    return bar;
  }

  // exportNow downloads what the filters select, as JSON Lines.
  exportNow() {
    const a = this.exportLinks[0];
    a.href = api.exportURL(this.filters, 'jsonl');
    a.click();
  }

  // rangePicker is the time range: a small popover with since and until
  // and a few presets, behind a button that says what is chosen.
  rangePicker(time) {
    this.rangeLabel = h('span', null);
    const presets = h('div', { class: 'pop-presets' }, h('span', { class: 'muted small' }, 'Last'), [['5 min', 5], ['1 hour', 60], ['24 hours', 1440]].map(([label, min]) => {
      const b = h('button', { type: 'button', class: 'btn btn-sm' }, label);
      b.addEventListener('click', () => {
        const f = { ...this.filters, since: new Date(Date.now() - min * 60000).toISOString() };
        delete f.until;
        this.setAll(f);
        pop.open = false;
      });
      return b;
    }));
    const any = h('button', { type: 'button', class: 'btn btn-ghost btn-sm' }, 'Any time');
    any.addEventListener('click', () => {
      const f = { ...this.filters };
      delete f.since;
      delete f.until;
      this.setAll(f);
      pop.open = false;
    });
    const pop = h('details', { class: 'popover f-range' },
      h('summary', { class: 'btn btn-sm', title: 'Time range' }, icon('clock'), this.rangeLabel),
      h('div', { class: 'pop' }, time('since', 'Since'), time('until', 'Until'), presets, h('div', { class: 'pop-foot' }, any)));
    document.addEventListener('click', (e) => {
      if (pop.open && !pop.contains(e.target)) pop.open = false;
    });
    return pop;
  }

  updateClear() {
    this.clearBtn.hidden = !FILTERS.some((k) => this.filters[k]);
    const { since, until } = this.filters;
    if (this.rangeLabel) {
      this.rangeLabel.textContent = since && until ? `${fmt.clock(since)} → ${fmt.clock(until)}` : since ? `since ${fmt.clock(since)}` : until ? `until ${fmt.clock(until)}` : 'Any time';
      this.rangeLabel.parentElement.classList.toggle('on', !!(since || until));
    }
  }

  set(name, value) {
    const f = { ...this.filters };
    if (value) f[name] = value;
    else delete f[name];
    this.setAll(f);
  }

  // setAll applies a whole filter set: into the URL (replacing the history
  // entry, so typing in search does not pile up entries), the inputs, and
  // the list.
  setAll(f) {
    const same = FILTERS.every((k) => (f[k] || '') === (this.filters[k] || ''));
    this.filters = { ...f };
    if (f.route) this.showRoutes();
    for (const k of FILTERS) {
      const i = this.inputs[k];
      if (i && i.value !== (f[k] || '') && document.activeElement !== i) i.value = f[k] || '';
    }
    this.updateClear();
    const want = filterQuery(this.filters);
    if (location.search !== want) history.replaceState(history.state, '', location.pathname + want);
    if (!same) this.list.reset();
  }

  // syncFromURL adopts the URL's filters after navigation (back/forward).
  syncFromURL() {
    this.setAll(filtersFromURL());
  }

  focusSearch() {
    this.searchEl.focus();
    this.searchEl.select();
  }

  createRow() {
    const row = h('div', { class: 'req' });
    row.c = {
      time: h('span', { class: 'c-time mono' }),
      path: h('span', { class: 'c-path mono' }),
      event: h('span', { class: 'c-event' }),
      call: h('span', { class: 'c-call' }),
      route: h('span', { class: 'c-route' }),
      status: h('span', { class: 'c-status r' }),
      dur: h('span', { class: 'c-dur r mono' }),
      flags: h('span', { class: 'c-flags' }),
    };
    row.append(...Object.values(row.c));
    return row;
  }

  fillRow(row, c) {
    const x = row.c;
    if (!c) {
      for (const el of Object.values(x)) clear(el);
      row.title = '';
      return;
    }
    x.time.textContent = fmt.clock(c.created_at);
    x.time.title = fmt.fullTime(c.created_at);
    clear(x.path, h('span', { class: 'c-method m-' + String(c.method || '').toLowerCase() }, c.method || ''), h('span', null, c.path || '/'), c.query ? h('span', { class: 'q' }, '?' + c.query.replace(/^\?/, '')) : null);
    x.path.title = `${c.method} ${c.path || '/'}${c.query ? '?' + c.query.replace(/^\?/, '') : ''}`;
    clear(x.event, c.event ? eventBadge(c.event) : h('span', { class: 'muted' }, ''));
    // The call id is a button: it filters the list to that call (the row
    // itself opens the capture).
    clear(x.call, c.call_id ? h('button', { type: 'button', class: 'callpill mono', title: `Show only call ${c.call_id}`, dataset: { call: c.call_id } }, fmt.shortId(c.call_id)) : null);
    clear(x.route, c.route ? h('button', { type: 'button', class: 'routepill mono', title: `Show only route ${c.route}`, dataset: { route: c.route } }, c.route) : null);
    clear(x.status, statusCell(c));
    x.dur.textContent = c.duration_ms != null ? fmt.duration(c.duration_ms) : '';
    clear(x.flags, flagsOf(c).map(([label, cls, title]) => h('span', { class: 'flag f-' + cls, title }, label)));
  }

  emptyState() {
    if (FILTERS.some((k) => this.filters[k])) {
      const b = h('button', { class: 'btn btn-sm', type: 'button' }, 'Clear filters');
      b.addEventListener('click', () => this.setAll({}));
      return h('div', { class: 'empty-msg' }, h('div', { class: 'empty-title' }, 'No requests match these filters'), b);
    }
    const t = this.app.tunnel() || {};
    const url = t.public_url || '';
    const sample = `curl -X POST ${url ? "'" + url + "/webhooks'" : '<public url>'} -H 'Content-Type: application/json' -d '{"hello":"calltap"}'`;
    return h('div', { class: 'empty-msg' },
      h('div', { class: 'empty-title' }, 'Waiting for requests'),
      h('div', { class: 'muted' }, 'Anything sent to your public URL shows up here as it arrives.'),
      url ? h('div', { class: 'empty-code' }, h('code', { class: 'mono' }, sample), copyButton(sample, '', 'Copy command')) : null);
  }

  // onCapture takes a capture from the live stream.
  onCapture(c) {
    if (c.route) this.showRoutes();
    if (this.list.upsert(c)) return;
    const m = matches(c, this.filters);
    if (m === false) return;
    const top = this.list.itemAt(0);
    const newer = !top || (fmt.parseTime(c.created_at) ?? 0) >= (fmt.parseTime(top.created_at) ?? 0);
    // A row older than the top is either an update of a row not loaded yet
    // or one that lost a race with a sibling saved at the same moment; the
    // server knows where it goes.
    if (m === true && newer && this.list.loaded) this.list.prepend(c);
    else this.list.refreshHead();
  }

  resync() {
    this.list.refreshHead();
  }
}
