// Replaying captures: one-click replay and the edit-and-replay dialog
// (method, path, headers, body with its JSON checked before sending, another
// target URL, and the service's retry schedule).

import { h, icon, clear, toast } from './dom.js';
import * as api from './api.js';
import * as json from './json.js';
import { HOP_HEADERS } from './detail.js';

const METHODS = ['POST', 'GET', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS'];

// replayNow re-sends a capture unchanged and reports the result with a link
// to the new capture.
export async function replayNow(app, id) {
  try {
    const r = await api.replay({ id });
    toast(resultBody(app, r), 'ok');
    return r;
  } catch (e) {
    toast(`Replay failed: ${e.message}`, 'error', 6000);
    return null;
  }
}

function resultBody(app, r) {
  const a = h('a', { href: `/requests/${encodeURIComponent(r.id)}`, 'data-nav': '', class: 'mono' }, String(r.id).slice(0, 8));
  return h('span', null, icon('replay'), r.queued ? 'Replay queued → ' : 'Replayed → ', a, r.status ? h('span', { class: 'muted' }, ` (${r.status})`) : null);
}

// parseHeaders reads "Name: value" lines. Repeated names stay repeated.
export function parseHeaders(text) {
  const out = [];
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i].replace(/\r$/, '');
    if (!line.trim()) continue;
    const c = line.indexOf(':');
    if (c <= 0) throw new Error(`Header line ${i + 1} needs "Name: value"`);
    const name = line.slice(0, c).trim();
    if (!/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/.test(name)) throw new Error(`Header line ${i + 1}: "${name}" is not a valid header name`);
    out.push([name, line.slice(c + 1).trim()]);
  }
  return out;
}

export class ReplayDialog {
  constructor(app) {
    this.app = app;
    this.el = h('dialog', { class: 'dlg replay-dlg', 'aria-label': 'Edit and replay' });
    this.el.addEventListener('close', () => this.app.focusList?.());
    document.body.appendChild(this.el);
  }

  open(d) {
    this.d = d;
    const tunnel = this.app.tunnel() || {};
    const binary = d.body_encoding === 'base64';
    const method = h('select', { class: 'r-method' }, [...new Set([d.method || 'POST', ...METHODS])].map((m) => h('option', { value: m }, m)));
    method.value = d.method || 'POST';
    const path = h('input', { class: 'r-path mono', type: 'text', spellcheck: 'false', value: (d.path || '/') + (d.query ? '?' + String(d.query).replace(/^\?/, '') : '') });
    const kept = (d.request_headers || []).filter(([n]) => !HOP_HEADERS.has(String(n).toLowerCase()));
    const headers = h('textarea', { class: 'r-headers mono', rows: String(Math.min(8, Math.max(3, kept.length + 1))), spellcheck: 'false' });
    headers.value = kept.map(([n, v]) => `${n}: ${v}`).join('\n');
    const body = h('textarea', { class: 'r-body mono', rows: '14', spellcheck: 'false', disabled: binary });
    let original = '';
    if (binary) body.value = `(binary body, ${json.bytesOf(d.body, 'base64').length} bytes; re-sent unchanged)`;
    else {
      original = d.body || '';
      try {
        body.value = json.pretty(json.parse(original));
      } catch {
        body.value = original;
      }
    }
    const initialBody = body.value;
    const bodyStatus = h('div', { class: 'r-body-status' });
    const noCheck = h('input', { type: 'checkbox', class: 'r-nocheck' });
    const fmtBtn = h('button', { type: 'button', class: 'btn btn-ghost btn-sm', disabled: binary }, 'Format JSON');

    const toLocal = h('input', { type: 'radio', name: 'r-target', value: 'local', checked: true });
    const toOther = h('input', { type: 'radio', name: 'r-target', value: 'other', class: 'r-to-other' });
    const toURL = h('input', { type: 'url', class: 'r-to mono', placeholder: 'http://127.0.0.1:3000/webhooks', spellcheck: 'false', disabled: true });
    const retry = h('input', { type: 'checkbox', class: 'r-retry' });
    const scale = h('input', { type: 'number', class: 'r-scale', min: '0.001', step: 'any', value: '1', disabled: true, title: 'Time scale: 0.01 runs the 42-minute schedule in 25 s' });
    const err = h('div', { class: 'r-error errbox', hidden: true });
    const send = h('button', { type: 'submit', class: 'btn btn-primary r-send' }, icon('send'), 'Send replay');
    const cancel = h('button', { type: 'button', class: 'btn r-cancel' }, 'Cancel');

    const wantsJSON = () => {
      if (binary || noCheck.checked) return false;
      try {
        const ct = parseHeaders(headers.value).find(([n]) => n.toLowerCase() === 'content-type');
        if (ct) return /json/i.test(ct[1]);
      } catch {
        // header errors are reported on their own
      }
      return /^\s*[[{]/.test(original);
    };
    const validate = () => {
      let ok = true;
      clear(bodyStatus);
      bodyStatus.className = 'r-body-status';
      try {
        parseHeaders(headers.value);
        headers.classList.remove('invalid');
      } catch (e) {
        headers.classList.add('invalid');
        bodyStatus.append(h('span', { class: 'bad' }, icon('warn'), e.message));
        ok = false;
      }
      if (wantsJSON() && ok) {
        try {
          json.parse(body.value);
          bodyStatus.append(h('span', { class: 'good' }, '✓ valid JSON'));
          body.classList.remove('invalid');
        } catch (e) {
          bodyStatus.append(h('span', { class: 'bad' }, icon('warn'), e.message));
          body.classList.add('invalid');
          ok = false;
        }
      } else body.classList.remove('invalid');
      send.disabled = !ok;
      return ok;
    };
    body.addEventListener('input', validate);
    headers.addEventListener('input', validate);
    noCheck.addEventListener('change', validate);
    fmtBtn.addEventListener('click', () => {
      try {
        body.value = json.pretty(json.parse(body.value));
      } catch {
        // validate() shows where
      }
      validate();
    });
    body.addEventListener('keydown', (e) => {
      // Tab indents inside the body instead of leaving it.
      if (e.key === 'Tab' && !e.shiftKey) {
        e.preventDefault();
        body.setRangeText('  ', body.selectionStart, body.selectionEnd, 'end');
        validate();
      }
    });
    for (const r of [toLocal, toOther]) r.addEventListener('change', () => {
      toURL.disabled = !toOther.checked;
      if (toOther.checked) toURL.focus();
    });
    retry.addEventListener('change', () => {
      scale.disabled = !retry.checked;
    });
    cancel.addEventListener('click', () => this.el.close());

    const form = h('form', { class: 'dlg-form', method: 'dialog', novalidate: true },
      h('header', { class: 'dlg-head' }, h('h2', null, icon('edit'), 'Edit and replay'), h('span', { class: 'muted mono small' }, String(d.id).slice(0, 8)),
        h('span', { class: 'spacer' }), h('button', { type: 'button', class: 'btn btn-ghost btn-icon r-x', 'aria-label': 'Close' }, icon('x'))),
      h('div', { class: 'dlg-body' },
        h('div', { class: 'r-line' }, method, path),
        h('fieldset', { class: 'r-target' },
          h('legend', null, 'Send to'),
          h('label', null, toLocal, 'Local handler ', h('span', { class: 'mono muted' }, tunnel.forward_to || d.target || '')),
          h('label', { class: 'r-other' }, toOther, 'Another URL', toURL)),
        h('label', { class: 'r-label' }, 'Headers ', h('span', { class: 'muted small' }, 'one "Name: value" per line; Host and Content-Length are set when sending')),
        headers,
        h('div', { class: 'r-label' }, h('span', null, 'Body'), h('span', { class: 'spacer' }), fmtBtn),
        body,
        h('div', { class: 'r-under' }, bodyStatus, h('span', { class: 'spacer' }), h('label', { class: 'small muted' }, noCheck, "don't check JSON")),
        h('fieldset', { class: 'r-retryset' },
          h('label', null, retry, 'Retry like the service ', h('span', { class: 'muted small' }, 'network errors, time-outs, 408, 429 and 5xx; after 0, 30 s, 2 min, 8 min, 32 min')),
          h('label', { class: 'r-scale-l small' }, 'time scale ', scale)),
        err),
      h('footer', { class: 'dlg-foot' }, h('span', { class: 'muted small' }, h('kbd', null, 'Ctrl'), '+', h('kbd', null, 'Enter'), ' to send · ', h('kbd', null, 'Esc'), ' to close'),
        h('span', { class: 'spacer' }), cancel, send));
    form.querySelector('.r-x').addEventListener('click', () => this.el.close());
    form.addEventListener('keydown', (e) => {
      if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) {
        e.preventDefault();
        form.requestSubmit();
      }
    });
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      if (!validate()) return;
      err.hidden = true;
      const req = { id: d.id, method: method.value, path: path.value.trim() || '/', headers: parseHeaders(headers.value) };
      // Pretty-printing for the editor alone is not an edit: unchanged, the
      // original bytes go out.
      if (!binary) req.body = body.value === initialBody ? original : body.value;
      if (toOther.checked) {
        const u = toURL.value.trim();
        if (!/^https?:\/\//i.test(u)) {
          err.hidden = false;
          err.replaceChildren(icon('warn'), 'Enter an http:// or https:// URL to send to');
          toURL.focus();
          return;
        }
        req.to = u;
      }
      if (retry.checked) {
        req.retry = 'service';
        const s = Number(scale.value);
        if (s > 0 && s !== 1) req.time_scale = s;
      }
      send.disabled = true;
      try {
        const r = await api.replay(req);
        this.el.close();
        toast(resultBody(this.app, r), 'ok');
        this.app.onReplayed?.(r);
      } catch (ex) {
        err.hidden = false;
        err.replaceChildren(icon('warn'), h('span', null, `Replay failed: ${ex.message}`));
      } finally {
        send.disabled = false;
      }
    });
    clear(this.el, form);
    validate();
    this.el.showModal();
    body.disabled ? path.focus() : body.focus();
    if (!body.disabled) body.setSelectionRange(0, 0);
    body.scrollTop = 0;
  }
}
