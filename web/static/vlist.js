// A windowed list over a paged, newest-first collection of the API. Only the
// rows in view (plus a few) exist in the DOM, and only the pages in view are
// fetched, so a store of 100,000 captures scrolls as fast as one of ten.
//
// Rows are kept by their position counted from the oldest end ("rev"):
// with newest first, new rows arrive at the top and every index shifts, but
// the distance from the bottom of a row stays put. A page fetched at offset
// o with total count c places row i at rev c-1-(o+i).

import { h } from './dom.js';

export class VirtualList {
  // opts: rowHeight, pageSize, fetchPage(offset, limit, signal) →
  // {count, results}, createRow() → element, fillRow(el, item|undefined),
  // key(item), onOpen(item), empty() → element shown when there are no
  // rows, onCount(n).
  constructor(opts) {
    this.o = { rowHeight: 30, pageSize: 100, key: (x) => x.id, ...opts };
    this.rh = this.o.rowHeight;
    this.el = h('div', { class: 'vlist', tabindex: '0', role: 'listbox' });
    this.spacer = h('div', { class: 'vlist-spacer' });
    this.emptyEl = h('div', { class: 'vlist-empty', hidden: true });
    this.el.append(this.spacer, this.emptyEl);
    this.pool = [];
    this.fresh = new Map(); // key → time it arrived live, for a brief highlight
    this.cursor = -1;
    this.selectedKey = null;
    this.gen = 0;
    this.clearData();

    this.el.addEventListener('scroll', () => this.schedule(), { passive: true });
    new ResizeObserver(() => this.schedule()).observe(this.el);
    this.el.addEventListener('click', (e) => {
      const row = e.target.closest('.vrow');
      if (!row || e.target.closest('a,button')) return;
      const i = Number(row.dataset.index);
      const item = this.itemAt(i);
      if (!item) return;
      this.cursor = i;
      this.o.onOpen?.(item);
      this.schedule();
    });
  }

  clearData() {
    this.byRev = new Map(); // rev → item
    this.revOf = new Map(); // key → rev
    this.total = 0;
    this.loaded = false;
    this.error = null;
    this.inflight = new Map(); // page index → AbortController
  }

  // reset drops everything and loads from the top, for a new filter.
  reset() {
    for (const c of this.inflight.values()) c.abort();
    this.gen++;
    this.clearData();
    this.cursor = -1;
    this.el.scrollTop = 0;
    this.loadPage(0);
    this.schedule();
  }

  itemAt(i) {
    return i >= 0 && i < this.total ? this.byRev.get(this.total - 1 - i) : undefined;
  }

  indexOf(key) {
    const rev = this.revOf.get(key);
    return rev == null ? -1 : this.total - 1 - rev;
  }

  get(key) {
    const rev = this.revOf.get(key);
    return rev == null ? undefined : this.byRev.get(rev);
  }

  place(rev, item) {
    const k = this.o.key(item);
    const old = this.revOf.get(k);
    if (old != null && old !== rev && this.o.key(this.byRev.get(old) || {}) === k) this.byRev.delete(old);
    const prev = this.byRev.get(rev);
    if (prev && this.o.key(prev) !== k && this.revOf.get(this.o.key(prev)) === rev) this.revOf.delete(this.o.key(prev));
    this.byRev.set(rev, item);
    this.revOf.set(k, rev);
  }

  // setTotal changes the row count. Growth means rows were added at the
  // top; when the user has scrolled down the view is shifted with them so
  // what they are reading does not move.
  setTotal(n) {
    const d = n - this.total;
    if (!d) return;
    this.total = n;
    this.spacer.style.height = `${n * this.rh}px`;
    if (d > 0) {
      if (this.cursor >= 0) this.cursor += d;
      if (this.el.scrollTop > 0) this.el.scrollTop += d * this.rh;
    }
  }

  // get is the row it holds under key, if any.
  get(key) {
    const rev = this.revOf.get(key);
    return rev == null ? undefined : this.byRev.get(rev);
  }

  // upsert replaces a row it holds; it returns false for an unknown key.
  upsert(item) {
    const rev = this.revOf.get(this.o.key(item));
    if (rev == null) return false;
    this.byRev.set(rev, item);
    this.schedule();
    return true;
  }

  // prepend adds a row that is newer than every other at the top.
  prepend(item) {
    if (this.upsert(item)) return;
    this.setTotal(this.total + 1);
    this.place(this.total - 1, item);
    this.fresh.set(this.o.key(item), performance.now());
    this.loaded = true;
    this.o.onCount?.(this.total);
    this.schedule();
  }

  // refreshHead refetches the first page, coalescing bursts; the server is
  // the judge of which new rows belong in a filtered list.
  refreshHead() {
    clearTimeout(this.headTimer);
    this.headTimer = setTimeout(() => this.loadPage(0, true), 120);
  }

  async loadPage(p, force) {
    if (this.inflight.has(p)) {
      if (!force) return;
      this.inflight.get(p).abort();
    }
    const ctl = new AbortController();
    this.inflight.set(p, ctl);
    const gen = this.gen;
    const offset = p * this.o.pageSize;
    try {
      const page = await this.o.fetchPage(offset, this.o.pageSize, ctl.signal);
      if (gen !== this.gen) return;
      const c = Number(page.count) || 0;
      const before = new Set(p === 0 && this.loaded ? this.revOf.keys() : []);
      if (c < this.total) {
        // Rows went away or a live row was counted that the filter does
        // not hold: positions are no longer trustworthy, start over.
        this.byRev.clear();
        this.revOf.clear();
        this.total = c;
        this.spacer.style.height = `${c * this.rh}px`;
      } else this.setTotal(c);
      (page.results || []).forEach((item, i) => {
        const k = this.o.key(item);
        if (p === 0 && this.loaded && !before.has(k)) this.fresh.set(k, performance.now());
        this.place(c - 1 - (offset + i), item);
      });
      this.loaded = true;
      this.error = null;
      this.o.onCount?.(this.total);
    } catch (e) {
      if (e.name === 'AbortError') return;
      if (gen === this.gen) this.error = e;
    } finally {
      if (this.inflight.get(p) === ctl) this.inflight.delete(p);
    }
    if (gen === this.gen) this.schedule();
  }

  schedule() {
    if (this.raf) return;
    this.raf = requestAnimationFrame(() => {
      this.raf = 0;
      this.render();
    });
  }

  render() {
    const rh = this.rh;
    const height = this.el.clientHeight || 600;
    const first = Math.floor(this.el.scrollTop / rh);
    const visible = Math.ceil(height / rh) + 1;
    const start = Math.max(0, first - 8);
    const end = Math.min(this.total, first + visible + 8);
    this.spacer.style.height = `${this.total * rh}px`;

    const now = performance.now();
    for (const [k, t] of this.fresh) if (now - t > 2500) this.fresh.delete(k);

    const need = end - start;
    while (this.pool.length < need) {
      const row = this.o.createRow();
      row.classList.add('vrow');
      row.setAttribute('role', 'option');
      row.style.height = `${rh}px`;
      this.pool.push(row);
      this.el.appendChild(row);
    }
    const missing = new Set();
    for (let k = 0; k < this.pool.length; k++) {
      const row = this.pool[k];
      const i = start + k;
      if (i >= end) {
        // A spare row forgets its item: a deleted one must not linger in
        // the DOM, hidden or not.
        row.hidden = true;
        if (row.dataset.key !== undefined) {
          delete row.dataset.key;
          row._item = undefined;
          this.o.fillRow(row, undefined);
        }
        continue;
      }
      row.hidden = false;
      row.style.transform = `translateY(${i * rh}px)`;
      row.dataset.index = String(i);
      const item = this.itemAt(i);
      if (!item) missing.add(Math.floor(i / this.o.pageSize));
      const key = item ? this.o.key(item) : '';
      if (row.dataset.key !== key || row._item !== item) {
        row.dataset.key = key;
        row._item = item;
        row.classList.toggle('skeleton', !item);
        this.o.fillRow(row, item);
      }
      row.classList.toggle('cursor', i === this.cursor);
      row.classList.toggle('selected', !!item && key === this.selectedKey);
      row.classList.toggle('fresh', !!item && this.fresh.has(key));
      row.setAttribute('aria-selected', String(!!item && key === this.selectedKey));
    }
    if (this.fresh.size) setTimeout(() => this.schedule(), 500);

    const isEmpty = this.loaded && this.total === 0;
    this.emptyEl.hidden = !(isEmpty || (this.error && !this.total));
    if (!this.emptyEl.hidden) {
      this.emptyEl.replaceChildren(this.error && !this.total
        ? h('div', { class: 'empty-msg error-text' }, this.error.message)
        : this.o.empty?.() || h('div', { class: 'empty-msg' }, 'Nothing here'));
    }

    // Fetch what is in view once scrolling settles, so dragging the
    // scrollbar across 1,000 pages fetches only where it stops.
    if (missing.size) {
      clearTimeout(this.pageTimer);
      this.pageTimer = setTimeout(() => {
        for (const p of missing) this.loadPage(p);
      }, this.loaded ? 60 : 0);
    }
  }

  // moveCursor moves the keyboard cursor by d rows and keeps it in view.
  moveCursor(d) {
    if (!this.total) return;
    if (this.cursor < 0) {
      const sel = this.selectedKey ? this.indexOf(this.selectedKey) : -1;
      this.cursor = sel >= 0 ? sel : Math.floor(this.el.scrollTop / this.rh) - (d > 0 ? 1 : 0);
    }
    this.cursor = Math.max(0, Math.min(this.total - 1, this.cursor + d));
    this.scrollTo(this.cursor);
    this.schedule();
  }

  scrollTo(i) {
    const top = i * this.rh;
    const bottom = top + this.rh;
    if (top < this.el.scrollTop) this.el.scrollTop = top;
    else if (bottom > this.el.scrollTop + this.el.clientHeight) this.el.scrollTop = bottom - this.el.clientHeight;
  }

  cursorItem() {
    return this.itemAt(this.cursor);
  }

  select(key) {
    this.selectedKey = key;
    const i = key ? this.indexOf(key) : -1;
    if (i >= 0) this.cursor = i;
    this.schedule();
  }
}
