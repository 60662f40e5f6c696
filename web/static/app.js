// The inspector's entry point: the layout, client-side routes (/,
// /requests/<id>, /calls, /calls/<call_id>), the live stream, the tunnel
// status bar and the keyboard.

import { h, icon, clear, copyButton, toast } from './dom.js';
import * as api from './api.js';
import { RequestList, filterQuery } from './list.js';
import { Detail } from './detail.js';
import { ReplayDialog, replayNow } from './replay.js';
import { CallsView } from './calls.js';

const STATE_TEXT = { connected: 'connected', reconnecting: 'reconnecting', offline: 'offline' };

class App {
  constructor(root) {
    this.root = root;
    this.tunnelInfo = null;
    this.streamState = 'connecting';
    const ctx = {
      navigate: (p, o) => this.navigate(p, o),
      tunnel: () => this.tunnelInfo,
      openReplay: (d) => this.replayDlg.open(d),
      replayNow: (id) => replayNow(ctx, id),
      listFilterQuery: () => filterQuery(this.requests.filters),
      focusList: () => this.activeList()?.el.focus({ preventScroll: true }),
      onReplayed: () => {},
      // onKept marks or unmarks the row of a capture in the list, which no
      // stream event tells about it.
      onKept: (id, keep) => {
        const row = this.requests.list.get(id);
        if (row) this.requests.list.upsert({ ...row, keep });
      },
      // onDeleted reloads the lists: the deleted rows may be anywhere in them.
      onDeleted: () => {
        this.requests.list.reset();
        if (this.calls.started) this.calls.list.reset();
      },
    };
    this.ctx = ctx;
    this.requests = new RequestList(ctx);
    this.detail = new Detail(ctx);
    this.calls = new CallsView(ctx);
    this.replayDlg = new ReplayDialog(ctx);
    this.helpDlg = this.buildHelp();

    this.reqView = this.split('requests', this.requests.el, this.detail.el);
    this.callView = this.split('calls', this.calls.listPane, this.calls.detail);
    this.navReq = h('a', { href: '/', 'data-nav': '', class: 'navlink', dataset: { view: 'requests' } }, icon('list'), 'Requests');
    this.navCalls = h('a', { href: '/calls', 'data-nav': '', class: 'navlink', dataset: { view: 'calls' } }, icon('phone'), 'Calls');
    this.status = h('div', { class: 'status', role: 'status' });
    const help = h('button', { class: 'btn btn-ghost btn-icon', type: 'button', title: 'Keyboard shortcuts (?)', 'aria-label': 'Keyboard shortcuts' }, icon('keyboard'));
    help.addEventListener('click', () => this.helpDlg.showModal());
    const header = h('header', { class: 'topbar' },
      h('a', { href: '/', 'data-nav': '', class: 'brand' }, h('img', { src: '/static/favicon.svg', alt: '', width: '20', height: '20' }), h('span', null, 'calltap')),
      h('nav', { class: 'views' }, this.navReq, this.navCalls, h('a', { href: '/help/', class: 'navlink', id: 'help-link', title: 'The reference: calltap help' }, 'Help')),
      h('span', { class: 'spacer' }),
      this.status,
      help);
    root.append(header, this.reqView, this.callView);
    this.renderStatus();

    document.addEventListener('click', (e) => this.onLinkClick(e));
    window.addEventListener('popstate', () => this.route());
    document.addEventListener('keydown', (e) => this.onKey(e));

    api.getTunnel().then((t) => this.setTunnel(t)).catch(() => this.renderStatus());
    this.stream = new api.Stream({
      onCapture: (c) => {
        this.requests.onCapture(c);
        this.detail.onCapture(c);
        this.calls.onCapture(c);
      },
      onTunnel: (t) => this.setTunnel(t),
      onMedia: (m) => this.calls.onMedia(m),
      onState: (s) => {
        this.streamState = s;
        this.renderStatus();
      },
      onResync: () => {
        // Events sent while the stream was down are lost: refetch.
        this.requests.resync();
        this.calls.resync();
        if (this.detail.id) this.detail.open(this.detail.id);
        api.getTunnel().then((t) => this.setTunnel(t)).catch(() => {});
      },
    });
    this.route();
  }

  // split lays out a list pane and a detail pane with a draggable divider;
  // the width is remembered per view.
  split(name, left, right) {
    const key = `calltap.split.${name}`;
    const grip = h('div', { class: 'grip', role: 'separator', 'aria-orientation': 'vertical', title: 'Drag to resize' });
    const el = h('main', { class: 'split', dataset: { view: name } }, left, grip, right);
    const saved = Number(localStorage.getItem(key));
    if (saved > 15 && saved < 85) el.style.setProperty('--left', `${saved}%`);
    grip.addEventListener('pointerdown', (e) => {
      e.preventDefault();
      grip.setPointerCapture(e.pointerId);
      const box = el.getBoundingClientRect();
      const move = (ev) => {
        const pct = Math.max(20, Math.min(80, ((ev.clientX - box.left) / box.width) * 100));
        el.style.setProperty('--left', `${pct.toFixed(1)}%`);
        localStorage.setItem(key, pct.toFixed(1));
      };
      const up = () => {
        grip.removeEventListener('pointermove', move);
        grip.removeEventListener('pointerup', up);
      };
      grip.addEventListener('pointermove', move);
      grip.addEventListener('pointerup', up);
    });
    return el;
  }

  buildHelp() {
    const rows = [
      [['j', '↓'], 'next row'], [['k', '↑'], 'previous row'], [['Enter'], 'open the row'], [['r'], 'replay the selected request, or the open call'], [['x'], 'export what the filters select'],
      [['e'], 'edit and replay'], [['/'], 'search'], [['g', 'r'], 'requests'], [['g', 'c'], 'calls'], [['Esc'], 'close dialog / detail'], [['?'], 'this help'],
    ];
    const dlg = h('dialog', { class: 'dlg help-dlg', 'aria-label': 'Keyboard shortcuts' },
      h('div', { class: 'dlg-head' }, h('h2', null, icon('keyboard'), 'Keyboard'), h('span', { class: 'spacer' }),
        h('button', { type: 'button', class: 'btn btn-ghost btn-icon help-x', 'aria-label': 'Close' }, icon('x'))),
      h('div', { class: 'dlg-body keys' }, rows.map(([ks, what]) => h('div', { class: 'keyrow' }, h('span', null, ks.map((k) => h('kbd', null, k))), h('span', { class: 'muted' }, what)))));
    dlg.addEventListener('click', (e) => {
      if (e.target === dlg || e.target.closest('.help-x')) dlg.close();
    });
    document.body.appendChild(dlg);
    return dlg;
  }

  setTunnel(t) {
    this.tunnelInfo = { ...(this.tunnelInfo || {}), ...t };
    this.renderStatus();
    if (!this.requests.list.total) this.requests.list.schedule();
  }

  renderStatus() {
    const t = this.tunnelInfo || {};
    let state = t.state || 'offline';
    if (this.streamState === 'offline') state = 'inspector-offline';
    const label = state === 'inspector-offline' ? 'inspector unreachable' : STATE_TEXT[state] || state;
    const pill = h('span', { class: 'state st-' + state, title: this.streamState === 'live' ? 'live updates on' : `live updates: ${this.streamState}` }, h('span', { class: 'dot' }), label);
    const items = [pill];
    if (t.public_url) {
      items.push(h('span', { class: 'tunnel-url' },
        h('span', { class: 'mono', title: 'Public tunnel URL' }, t.public_url),
        copyButton(t.public_url, '', 'Copy the public URL')));
    }
    if (t.forward_to) items.push(h('span', { class: 'arrow muted' }, '→'), h('span', { class: 'mono fwd', title: 'Local target' }, t.forward_to));
    if (t.queued) items.push(h('span', { class: 'flag f-queued', title: 'Requests waiting in the relay to be delivered' }, `${t.queued} queued`));
    if (t.rejected) items.push(h('span', { class: 'flag f-failed', title: 'Requests refused by --require-header' }, `${t.rejected} rejected`));
    clear(this.status, ...items);
    document.title = state === 'connected' || !t.state ? 'calltap' : `calltap · ${label}`;
  }

  activeList() {
    return this.view === 'calls' ? this.calls.list : this.requests.list;
  }

  onLinkClick(e) {
    if (e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    const a = e.target.closest('a[data-nav]');
    if (!a) return;
    e.preventDefault();
    const u = new URL(a.href, location.href);
    let to = u.pathname + u.search;
    // The view tabs keep each view's filters.
    if (a === this.navReq || (a.classList.contains('brand'))) to = '/' + filterQuery(this.requests.filters);
    if (a === this.navCalls) to = '/calls' + this.calls.query();
    this.navigate(to);
  }

  navigate(path, { replace } = {}) {
    if (path === location.pathname + location.search) return this.route();
    if (replace) history.replaceState(null, '', path);
    else history.pushState(null, '', path);
    this.route();
  }

  // route shows what the URL names.
  route() {
    const parts = location.pathname.split('/').filter(Boolean).map(decodeURIComponent);
    const view = parts[0] === 'calls' ? 'calls' : 'requests';
    this.view = view;
    this.reqView.hidden = view !== 'requests';
    this.callView.hidden = view !== 'calls';
    this.navReq.classList.toggle('on', view === 'requests');
    this.navCalls.classList.toggle('on', view === 'calls');
    if (view === 'calls') {
      this.calls.syncFromURL();
      this.calls.start();
      const id = parts[1] || null;
      this.callView.classList.toggle('has-detail', !!id);
      this.calls.open(id);
    } else {
      this.requests.syncFromURL();
      const id = parts[0] === 'requests' && parts[1] ? parts[1] : null;
      this.reqView.classList.toggle('has-detail', !!id);
      this.requests.list.select(id);
      if (id !== this.detail.id) this.detail.open(id);
    }
  }

  selectedCaptureId() {
    const cur = this.requests.list.cursorItem();
    return cur ? cur.id : this.detail.id;
  }

  onKey(e) {
    if (e.defaultPrevented) return;
    if (document.querySelector('dialog[open]')) return; // dialogs handle their own keys; Esc closes them natively
    const t = e.target;
    const typing = t instanceof HTMLElement && (t.matches('input, textarea, select') || t.isContentEditable);
    if (typing) {
      if (e.key === 'Escape') t.blur();
      return;
    }
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    const list = this.activeList();
    if (this.pendingG) {
      this.pendingG = false;
      if (e.key === 'r') return this.navigate('/' + filterQuery(this.requests.filters));
      if (e.key === 'c') return this.navigate('/calls' + this.calls.query());
    }
    switch (e.key) {
      case 'j':
      case 'ArrowDown':
        e.preventDefault();
        list.moveCursor(1);
        break;
      case 'k':
      case 'ArrowUp':
        e.preventDefault();
        list.moveCursor(-1);
        break;
      case 'Enter': {
        const item = list.cursorItem();
        if (item) {
          e.preventDefault();
          list.o.onOpen(item);
        }
        break;
      }
      case 'r':
        if (this.view === 'requests') {
          const id = this.selectedCaptureId();
          if (id) this.ctx.replayNow(id);
          else toast('Select a request to replay', 'info', 1500);
        } else if (this.view === 'calls' && this.calls.callId && this.calls.replayCall) {
          this.calls.replayCall();
        }
        break;
      case 'x':
        if (this.view === 'requests') this.requests.exportNow();
        break;
      case 'e':
        if (this.view === 'requests') this.editSelected();
        break;
      case '/':
        e.preventDefault();
        if (this.view !== 'requests') this.navigate('/' + filterQuery(this.requests.filters));
        this.requests.focusSearch();
        break;
      case '?':
        this.helpDlg.showModal();
        break;
      case 'g':
        this.pendingG = true;
        setTimeout(() => (this.pendingG = false), 800);
        break;
      case 'Escape':
        if (this.view === 'requests' && this.detail.id) this.navigate('/' + filterQuery(this.requests.filters));
        else if (this.view === 'calls' && this.calls.callId) this.navigate('/calls' + this.calls.query());
        break;
    }
  }

  async editSelected() {
    const id = this.selectedCaptureId();
    if (!id) return toast('Select a request to edit and replay', 'info', 1500);
    try {
      const d = this.detail.data && this.detail.data.id === id ? this.detail.data : await api.getCapture(id);
      this.replayDlg.open(d);
    } catch (err) {
      toast(`Could not load ${id}: ${err.message}`, 'error');
    }
  }
}

new App(document.getElementById('app'));
