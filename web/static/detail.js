// The requests view's right side: one capture in full — request, response,
// contract checks as annotations, attempts and replays — with the replay,
// copy-as-curl and download actions.

import { h, icon, clear, append, copyButton, copyText, toast, confirmDialog } from './dom.js';
import * as api from './api.js';
import * as fmt from './format.js';
import * as json from './json.js';
import { flagsOf, statusCell, eventBadge, storedOnly } from './list.js';

// Headers a curl command or an edited replay must not copy: curl and the
// agent set them from the request they actually send.
export const HOP_HEADERS = new Set(['host', 'content-length', 'connection', 'transfer-encoding', 'keep-alive', 'upgrade', 'te', 'trailer', 'proxy-connection']);

function shq(s) {
  return "'" + String(s).replace(/'/g, "'\\''") + "'";
}

// publicURL is the address the sender used: the tunnel's public URL with
// the captured path and query. (The API's url field is the delivery
// target, as in the service's delivery record.)
export function publicURL(d, tunnel) {
  const q = d.query ? '?' + String(d.query).replace(/^\?/, '') : '';
  const base = tunnel && tunnel.public_url ? tunnel.public_url.replace(/\/$/, '') : '';
  if (!base && d.url) return d.url;
  return base + (d.path || '/') + q;
}

function localURL(d) {
  return d.target || d.url || null;
}

// curl builds a shell command that re-sends the capture to url.
export function curl(d, url) {
  const parts = [`curl -X ${d.method || 'POST'} ${shq(url)}`];
  for (const [n, v] of d.request_headers || []) {
    if (HOP_HEADERS.has(String(n).toLowerCase())) continue;
    parts.push(`-H ${shq(`${n}: ${v}`)}`);
  }
  if (d.body) {
    if (d.body_encoding === 'base64') {
      return `printf %s ${shq(d.body)} | base64 -d | ` + parts.join(' \\\n  ') + ' \\\n  --data-binary @-';
    }
    parts.push(`--data-raw ${shq(d.body)}`);
  }
  return parts.join(' \\\n  ');
}

function kv(rows) {
  return h('dl', { class: 'kv' }, rows.filter((r) => r && r[1] != null && r[1] !== '').map(([k, v]) => [h('dt', null, k), h('dd', null, v)]));
}

function headerTable(headers) {
  if (!headers || !headers.length) return h('div', { class: 'muted pad' }, 'No headers');
  return h('table', { class: 'htable' },
    h('tbody', null, headers.map(([n, v]) => h('tr', null, h('th', { class: 'mono' }, n), h('td', { class: 'mono' }, v)))));
}

function section(title, extra, body, open = true) {
  const d = h('details', { class: 'sect', open }, h('summary', null, icon('chevron', 'sect-chev'), h('span', { class: 'sect-title' }, title), extra ? h('span', { class: 'sect-extra' }, extra) : null), body);
  return d;
}

function headerValue(headers, name) {
  const n = name.toLowerCase();
  for (const [k, v] of headers || []) if (String(k).toLowerCase() === n) return v;
  return '';
}

// bodyView shows a body as a pretty JSON tree, raw text or hex, whichever
// fits, with a switch between them.
export function bodyView({ body, encoding, headers, checks, downloadURL, label = 'Body' }) {
  const bytes = json.bytesOf(body, encoding);
  if (!bytes.length) return section(label, h('span', { class: 'muted' }, 'empty'), h('div', { class: 'muted pad' }, 'No body'));
  const text = json.textOf(body, encoding);
  let ast = null;
  const ctype = headerValue(headers, 'content-type');
  if (bytes.length < 8 * 1024 * 1024 && (/json/i.test(ctype) || /^\s*[[{]/.test(text.slice(0, 64)))) {
    try {
      ast = json.parse(text);
    } catch {
      ast = null;
    }
  }
  const binary = !ast && (encoding === 'base64' && json.isBinary(bytes));
  const modes = ast ? ['pretty', 'raw', 'hex'] : ['raw', 'hex'];
  let mode = ast ? 'pretty' : binary ? 'hex' : 'raw';
  const content = h('div', { class: 'body-content' });
  const tools = h('span', { class: 'body-tools' });
  const seg = h('span', { class: 'seg', role: 'tablist' });
  const btns = {};
  for (const m of modes) {
    btns[m] = h('button', { type: 'button', class: 'seg-btn', role: 'tab', dataset: { mode: m } }, { pretty: 'Pretty', raw: 'Raw', hex: 'Hex' }[m]);
    btns[m].addEventListener('click', (e) => {
      e.preventDefault();
      mode = m;
      draw();
    });
    seg.appendChild(btns[m]);
  }
  let treeEl = null;
  const expand = h('button', { type: 'button', class: 'btn btn-ghost btn-sm', title: 'Expand all' }, 'Expand');
  const collapse = h('button', { type: 'button', class: 'btn btn-ghost btn-sm', title: 'Collapse all' }, 'Collapse');
  expand.addEventListener('click', () => treeEl && json.expandAll(treeEl, true));
  collapse.addEventListener('click', () => treeEl && json.expandAll(treeEl, false));
  const copy = copyButton(() => (mode === 'pretty' && ast ? json.pretty(ast) : text), '', 'Copy body');
  const dl = downloadURL ? h('a', { class: 'btn btn-ghost btn-sm', href: downloadURL, download: '', title: 'Download the raw body' }, icon('download')) : null;
  append(tools, [expand, collapse, seg, copy, dl]);

  function draw() {
    for (const [m, b] of Object.entries(btns)) b.classList.toggle('on', m === mode);
    expand.hidden = collapse.hidden = mode !== 'pretty';
    clear(content);
    if (mode === 'pretty') {
      treeEl = json.tree(ast, { checks });
      content.appendChild(treeEl);
    } else if (mode === 'raw') {
      content.append(...[json.textView(text)].flat());
    } else {
      content.append(...[json.hexDump(bytes)].flat());
    }
  }
  draw();
  const meta = [fmt.size(bytes.length), ctype ? ctype.split(';')[0] : null, encoding === 'base64' ? 'binary' : null].filter(Boolean).join(' · ');
  const s = section(label, h('span', { class: 'muted' }, meta), content);
  s.querySelector('summary').appendChild(tools);
  tools.addEventListener('click', (e) => e.stopPropagation());
  return s;
}

let lastTab = 'request';

export class Detail {
  // app: {navigate, tunnel, openReplay(detail), replayNow(id), listFilterQuery()}
  constructor(app) {
    this.app = app;
    this.el = h('section', { class: 'pane detail-pane', 'aria-label': 'Request detail' });
    this.id = null;
    this.data = null;
    this.showEmpty();
  }

  showEmpty() {
    this.id = null;
    this.data = null;
    clear(this.el, h('div', { class: 'detail-empty' },
      h('div', { class: 'empty-title' }, 'Select a request'),
      h('div', { class: 'keys' },
        ...[['j', 'k'], ['Enter'], ['r'], ['e'], ['/'], ['?']].map((ks, i) => h('div', { class: 'keyrow' },
          h('span', null, ks.map((k) => h('kbd', null, k))),
          h('span', { class: 'muted' }, ['move', 'open', 'replay', 'edit and replay', 'search', 'all shortcuts'][i]))))));
  }

  async open(id) {
    if (!id) return this.showEmpty();
    const same = id === this.id;
    this.id = id;
    if (!same) {
      this.data = null;
      clear(this.el, h('div', { class: 'detail-loading' }, h('div', { class: 'spinner' })));
    }
    this.ctl?.abort();
    const ctl = (this.ctl = new AbortController());
    try {
      const d = await api.getCapture(id, ctl.signal);
      if (this.id !== id) return;
      this.data = d;
      this.render(same);
    } catch (e) {
      if (e.name === 'AbortError' || this.id !== id) return;
      clear(this.el, h('div', { class: 'detail-empty' },
        h('div', { class: 'empty-title' }, e.httpStatus === 404 ? 'Request not found' : 'Could not load the request'),
        h('div', { class: 'muted' }, e.message)));
    }
  }

  // refresh reloads the open capture when the stream says it changed (its
  // response arrived, or it got a replay).
  onCapture(c) {
    if (!this.id) return;
    if (c.id === this.id || c.replay_of === this.id) {
      clearTimeout(this.refreshTimer);
      this.refreshTimer = setTimeout(() => this.open(this.id), 80);
    }
  }

  render(keepScroll) {
    const d = this.data;
    const scroll = keepScroll ? this.el.querySelector('.detail-body')?.scrollTop : 0;
    const tunnel = this.app.tunnel();
    const full = publicURL(d, tunnel);
    const local = localURL(d);

    const replayBtn = h('button', { class: 'btn btn-primary btn-sm act-replay', type: 'button', title: 'Replay unchanged (r)' }, icon('replay'), 'Replay');
    replayBtn.addEventListener('click', () => this.app.replayNow(d.id));
    const editBtn = h('button', { class: 'btn btn-sm act-edit', type: 'button', title: 'Edit and replay (e)' }, icon('edit'), 'Edit & replay');
    editBtn.addEventListener('click', () => this.app.openReplay(d));
    const curlBtn = h('button', { class: 'btn btn-sm act-curl', type: 'button', title: 'Copy a curl command that sends this request to the public URL' }, icon('copy'), 'curl');
    curlBtn.addEventListener('click', async () => {
      const ok = await copyText(curl(d, full));
      toast(ok ? 'Copied curl command' : 'Could not copy', ok ? 'ok' : 'error', 1800);
    });
    const curlLocal = local ? h('button', { class: 'btn btn-sm act-curl-local', type: 'button', title: 'Copy a curl command that sends this request straight to the local handler' }, icon('copy'), 'curl → local') : null;
    curlLocal?.addEventListener('click', async () => {
      const ok = await copyText(curl(d, local));
      toast(ok ? 'Copied curl command for the local handler' : 'Could not copy', ok ? 'ok' : 'error', 1800);
    });
    const dl = h('a', { class: 'btn btn-sm act-download', href: api.bodyURL(d.id), download: '', title: 'Download the request body' }, icon('download'), 'Body');
    const close = h('button', { class: 'btn btn-ghost btn-sm btn-icon', type: 'button', title: 'Close (Esc)', 'aria-label': 'Close' }, icon('x'));
    close.addEventListener('click', () => this.app.navigate('/' + this.app.listFilterQuery()));
    // Keep: retention never prunes it. Delete: gone with its body, search
    // entry and saved media, after a confirm.
    const keepBtn = h('button', { class: 'btn btn-sm act-keep', type: 'button', 'aria-pressed': d.keep ? 'true' : 'false',
      title: d.keep ? 'Kept: retention never prunes it (click to unmark)' : 'Keep: retention never prunes it' }, d.keep ? 'Kept' : 'Keep');
    keepBtn.addEventListener('click', async () => {
      try {
        await api.setKeep(d.id, !d.keep);
        d.keep = !d.keep;
        this.app.onKept(d.id, d.keep);
        this.render(true);
      } catch (err) {
        toast(`Could not change the mark: ${err.message}`, 'error');
      }
    });
    const delBtn = h('button', { class: 'btn btn-sm btn-danger act-delete', type: 'button', title: 'Delete this request from the store' }, 'Delete');
    delBtn.addEventListener('click', async () => {
      if (!(await confirmDialog('Delete this request?', `${d.method} ${d.path} will be gone from the store, search, calls and exports, with its body and saved media.`))) return;
      try {
        await api.deleteCapture(d.id);
        toast('Deleted', 'ok', 1500);
        this.app.onDeleted();
        this.app.navigate('/' + this.app.listFilterQuery());
      } catch (err) {
        toast(`Could not delete: ${err.message}`, 'error');
      }
    });

    const links = [];
    if (d.replay_of) links.push(h('span', { class: 'rel' }, 'replay of ', this.link(d.replay_of)));
    if (d.duplicate_of) links.push(h('span', { class: 'rel' }, 'duplicate of ', this.link(d.duplicate_of)));
    const route = d.route ? h('span', { class: 'rel d-route' }, 'route ', routeLink(d.route)) : null;

    const head = h('header', { class: 'd-head' },
      h('div', { class: 'd-line' },
        statusCell(d),
        h('span', { class: 'd-method m-' + String(d.method || '').toLowerCase() }, d.method),
        h('span', { class: 'd-path mono', title: full }, (d.path || '/') + (d.query ? '?' + String(d.query).replace(/^\?/, '') : '')),
        h('span', { class: 'spacer' }),
        close),
      h('div', { class: 'd-meta' },
        d.event ? eventBadge(d.event) : null,
        h('span', { title: fmt.fullTime(d.created_at) }, fmt.clock(d.created_at)),
        d.duration_ms != null ? h('span', null, fmt.duration(d.duration_ms)) : null,
        h('span', null, fmt.size(d.size ?? json.bytesOf(d.body, d.body_encoding).length)),
        route,
        // replay and duplicate are said by the links after them
        flagsOf(d).filter(([, cls]) => cls !== 'replay' && cls !== 'dup').map(([label, cls, title]) => h('span', { class: 'flag f-' + cls, title }, label)),
        links),
      h('div', { class: 'd-actions' }, replayBtn, editBtn, curlBtn, curlLocal, dl, keepBtn, delBtn));

    const checks = Array.isArray(d.checks) ? d.checks : [];
    const attempts = Array.isArray(d.attempt_log) ? d.attempt_log : [];
    const replays = Array.isArray(d.replays) ? d.replays : [];
    const tabs = [
      ['request', 'Request', checks.length ? h('span', { class: 'tab-badge ' + worst(checks) }, String(checks.length)) : null],
      ['response', 'Response', d.response_status ? h('span', { class: 'tab-dot ' + fmt.statusClass(d.response_status) }) : null],
      ['history', 'History', attempts.length + replays.length ? h('span', { class: 'tab-count' }, String(attempts.length + replays.length)) : null],
    ];
    const nav = h('nav', { class: 'tabs', role: 'tablist' });
    const body = h('div', { class: 'detail-body' });
    const show = (name) => {
      lastTab = name;
      for (const b of nav.children) b.classList.toggle('on', b.dataset.tab === name);
      clear(body);
      body.appendChild(name === 'response' ? this.responseTab(d) : name === 'history' ? this.historyTab(d, attempts, replays) : this.requestTab(d, full, local, checks));
    };
    for (const [name, label, badge] of tabs) {
      const b = h('button', { type: 'button', class: 'tab', role: 'tab', dataset: { tab: name } }, label, badge);
      b.addEventListener('click', () => show(name));
      nav.appendChild(b);
    }
    clear(this.el, head, nav, body);
    show(lastTab);
    if (keepScroll && scroll) body.scrollTop = scroll;
  }

  link(id) {
    return h('a', { href: `/requests/${encodeURIComponent(id)}`, 'data-nav': '', class: 'mono idlink', title: id }, fmt.shortId(id));
  }

  requestTab(d, full, local, checks) {
    const wrap = h('div', { class: 'tab-request' });
    const callLink = d.call_id ? h('span', null, h('a', { href: `/calls/${encodeURIComponent(d.call_id)}`, 'data-nav': '', class: 'mono' }, d.call_id), ' ',
      h('a', { href: `/?call_id=${encodeURIComponent(d.call_id)}`, 'data-nav': '', class: 'muted small' }, 'filter')) : null;
    wrap.append(section('General', null, kv([
      // Replays and triggers never passed through the public URL.
      ['URL', !d.source || d.source === 'tunnel' ? h('span', { class: 'mono wrap' }, full, ' ', copyButton(full, '', 'Copy URL')) : null],
      ['Forwarded to', local ? h('span', { class: 'mono wrap' }, local) : null],
      ['Received', fmt.fullTime(d.created_at)],
      ['At relay', d.arrived_at && d.arrived_at !== d.created_at ? fmt.fullTime(d.arrived_at) + (d.queued ? '  (queued while offline)' : '') : null],
      ['Event', d.event ? eventBadge(d.event) : null],
      ['Call', callLink],
      ['Route', d.route ? routeLink(d.route) : null],
      ['Delivery id', d.delivery_id ? h('span', { class: 'mono' }, d.delivery_id) : null],
      ['Source', d.source],
      ['Capture id', h('span', { class: 'mono' }, d.id, ' ', copyButton(d.id, '', 'Copy id'))],
    ])));
    if (checks.length) {
      const rank = { 'sev-error': 0, 'sev-warn': 1, 'sev-info': 2 };
      checks = [...checks].sort((a, b) => rank[json.severityClass(a.severity)] - rank[json.severityClass(b.severity)]);
      wrap.append(section('Contract checks', h('span', { class: 'muted' }, `${checks.length} finding${checks.length === 1 ? '' : 's'} · annotations, not rejections`),
        h('ul', { class: 'checks' }, checks.map((c) => h('li', { class: 'check ' + json.severityClass(c.severity) },
          icon(json.severityClass(c.severity) === 'sev-info' ? 'info' : 'warn'),
          h('span', { class: 'check-msg' }, c.message || ''),
          c.path ? h('code', { class: 'check-path mono' }, c.path) : null,
          c.code ? h('span', { class: 'check-code mono' }, c.code) : null)))));
    }
    const hs = d.request_headers || [];
    wrap.append(section('Headers', h('span', { class: 'muted' }, String(hs.length)), headerTable(hs)));
    wrap.append(bodyView({ body: d.body, encoding: d.body_encoding, headers: hs, checks, downloadURL: api.bodyURL(d.id) }));
    return wrap;
  }

  responseTab(d) {
    const wrap = h('div', { class: 'tab-response' });
    if (d.status === 'stored') {
      // Not pending and not a failure: no handler was meant to answer.
      wrap.append(section('Status', null, kv([
        ['Status', h('span', { class: 'st sstored' }, 'stored only')],
        ['Route', d.route ? routeLink(d.route) : null],
      ])));
      wrap.append(h('div', { class: 'muted pad' }, storedOnly(d), d.route ? ` (Calltap-Stored-Only: ${d.route}).` : '.'));
      return wrap;
    }
    if (!d.response_status && !d.error) {
      wrap.append(h('div', { class: 'muted pad' }, d.status === 'pending' ? 'Waiting for the local handler…' : 'No response recorded.'));
      return wrap;
    }
    if (d.status === 'unknown') {
      // Not a failure: what the handler answered, and whether the sender
      // got it, was never recorded.
      wrap.append(section('Status', null, kv([
        ['Status', h('span', { class: 'st sunknown' }, 'answer unknown')],
        ['Forwarded to', d.target ? h('span', { class: 'mono wrap' }, d.target) : null],
      ])));
      wrap.append(h('div', { class: 'unknownbox' }, icon('warn'), h('span', null, d.error || 'The agent stopped before recording the handler\'s answer; the sender may have got it.')));
      return wrap;
    }
    wrap.append(section('Status', null, kv([
      ['Status', d.response_status ? h('span', { class: 'st ' + fmt.statusClass(d.response_status) }, String(d.response_status)) : h('span', { class: 'st s5' }, 'no response')],
      ['Duration', d.duration_ms != null ? fmt.duration(d.duration_ms) : null],
      ['Delivered', d.delivered_at ? fmt.fullTime(d.delivered_at) : null],
      ['Attempts', d.max_attempts > 1 ? `${d.attempts} of ${d.max_attempts}` : d.attempts > 1 ? String(d.attempts) : null],
      ['Forwarded to', d.target ? h('span', { class: 'mono wrap' }, d.target) : null],
    ])));
    if (d.error) wrap.append(h('div', { class: 'errbox' }, icon('warn'), h('span', { class: 'mono' }, d.error)));
    const hs = d.response_headers || [];
    wrap.append(section('Headers', h('span', { class: 'muted' }, String(hs.length)), headerTable(hs)));
    wrap.append(bodyView({ body: d.response_body, encoding: d.response_body_encoding, headers: hs, label: 'Body' }));
    return wrap;
  }

  historyTab(d, attempts, replays) {
    const wrap = h('div', { class: 'tab-history' });
    if (d.replay_of || d.duplicate_of) {
      wrap.append(section('Origin', null, kv([
        ['Replay of', d.replay_of ? this.link(d.replay_of) : null],
        ['Duplicate of', d.duplicate_of ? this.link(d.duplicate_of) : null],
      ])));
    }
    wrap.append(section('Attempts', h('span', { class: 'muted' }, d.max_attempts > 1 ? `${attempts.length} of up to ${d.max_attempts}` : String(attempts.length)),
      attempts.length ? h('table', { class: 'grid' },
        h('thead', null, h('tr', null, ['#', 'At', 'Status', 'Duration', 'Error'].map((t) => h('th', null, t)))),
        h('tbody', null, attempts.map((a) => h('tr', null,
          h('td', null, String(a.n ?? '')),
          h('td', { class: 'mono', title: fmt.fullTime(a.at) }, fmt.clock(a.at)),
          h('td', null, a.response_status ? h('span', { class: 'st ' + fmt.statusClass(a.response_status) }, String(a.response_status)) : h('span', { class: 'muted' }, '—')),
          h('td', { class: 'mono' }, a.duration_ms != null ? fmt.duration(a.duration_ms) : ''),
          h('td', { class: 'mono err-text' }, a.error || '')))))
        : h('div', { class: 'muted pad' }, 'No attempts recorded.')));
    wrap.append(section('Replays', h('span', { class: 'muted' }, String(replays.length)),
      replays.length ? h('table', { class: 'grid' },
        h('thead', null, h('tr', null, ['Time', 'Id', 'Status', 'Duration', 'Flags'].map((t) => h('th', null, t)))),
        h('tbody', null, replays.map((r) => h('tr', null,
          h('td', { class: 'mono', title: fmt.fullTime(r.created_at) }, fmt.clock(r.created_at)),
          h('td', null, this.link(r.id)),
          h('td', null, statusCell(r)),
          h('td', { class: 'mono' }, r.duration_ms != null ? fmt.duration(r.duration_ms) : ''),
          h('td', null, flagsOf(r).filter(([l]) => l !== 'replay').map(([label, cls, title]) => h('span', { class: 'flag f-' + cls, title }, label)))))))
        : h('div', { class: 'muted pad' }, 'Not replayed yet. Press r to replay.')));
    return wrap;
  }
}

// routeLink is a route's name, linking to the list of what it took.
function routeLink(route) {
  return h('a', { href: `/?route=${encodeURIComponent(route)}`, 'data-nav': '', class: 'mono', title: `Show only route ${route}` }, route);
}

function worst(checks) {
  const sev = checks.map((c) => json.severityClass(c.severity));
  return sev.includes('sev-error') ? 'sev-error' : sev.includes('sev-warn') ? 'sev-warn' : 'sev-info';
}
