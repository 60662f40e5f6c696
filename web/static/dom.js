// Building DOM safely. Everything that comes from a capture is attacker
// controlled, so text only ever reaches the page as text nodes; there is
// deliberately no way to pass HTML through these helpers.

// h builds an element. props: class, text, dataset, style (an object applied
// through the CSSOM, which the CSP allows), on<event> functions, and plain
// attributes. Children are nodes, strings (made text nodes), arrays, or
// null/false (skipped).
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  setProps(el, props);
  append(el, children);
  return el;
}

function setProps(el, props) {
  if (!props) return;
  for (const [k, v] of Object.entries(props)) {
    if (v == null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = String(v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'style') Object.assign(el.style, v);
    else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'value' || k === 'checked' || k === 'disabled' || k === 'selected') el[k] = v;
    else if (k === 'href') el.setAttribute('href', v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
}

export function append(el, children) {
  for (const c of children) {
    if (c == null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
  return el;
}

// clear replaces every child of el with children (none: empties it).
// Unlike el.append, it skips null and flattens arrays, so the helpers'
// children never turn into the text "null".
export function clear(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

// safeURL returns u when it is an absolute http(s) URL and null otherwise,
// so a payload's "recording_url": "javascript:…" never becomes a link.
export function safeURL(u) {
  if (typeof u !== 'string') return null;
  try {
    const p = new URL(u);
    return p.protocol === 'http:' || p.protocol === 'https:' ? p.href : null;
  } catch {
    return null;
  }
}

// extLink is a link to a URL taken from a payload, opened in a new tab
// without a referrer; an unsafe URL is shown as plain text.
export function extLink(u, label) {
  const href = safeURL(u);
  if (!href) return h('span', { class: 'mono unsafe-url', title: 'not an http(s) link; shown as text' }, String(u ?? ''));
  return h('a', { href, target: '_blank', rel: 'noopener noreferrer', class: 'ext' }, label ?? href);
}

const SVG = 'http://www.w3.org/2000/svg';
const ICONS = {
  copy: 'M9 9h10v10H9zM5 15V5h10',
  replay: 'M4 12a8 8 0 1 0 2.3-5.6M4 4v4.5h4.5',
  edit: 'M4 20h4L19 9l-4-4L4 16v4zM14 6l4 4',
  download: 'M12 4v11m0 0-4-4m4 4 4-4M5 20h14',
  search: 'M11 18a7 7 0 1 1 0-14 7 7 0 0 1 0 14zm5-2 4.5 4.5',
  x: 'M6 6l12 12M18 6 6 18',
  link: 'M10 14a4 4 0 0 0 5.7 0l3-3a4 4 0 0 0-5.7-5.7l-1 1M14 10a4 4 0 0 0-5.7 0l-3 3a4 4 0 0 0 5.7 5.7l1-1',
  chevron: 'M9 6l6 6-6 6',
  warn: 'M12 4 2.5 20h19L12 4zm0 6v5m0 2.5v.5',
  info: 'M12 21a9 9 0 1 1 0-18 9 9 0 0 1 0 18zm0-10v6m0-9v.5',
  clock: 'M12 21a9 9 0 1 1 0-18 9 9 0 0 1 0 18zm0-14v5l3 2',
  dup: 'M8 8V4h12v12h-4M4 8h12v12H4z',
  keyboard: 'M3 6h18v12H3zM7 10h.01M11 10h.01M15 10h.01M7 14h10',
  phone: 'M5 4h4l2 5-2.5 1.5a11 11 0 0 0 5 5L15 13l5 2v4a2 2 0 0 1-2 2A16 16 0 0 1 3 6a2 2 0 0 1 2-2',
  list: 'M8 6h12M8 12h12M8 18h12M4 6h.01M4 12h.01M4 18h.01',
  send: 'M4 12 20 4l-6 16-3-7-7-1z',
};

// icon returns a small stroked SVG icon by name.
export function icon(name, cls) {
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('viewBox', '0 0 24 24');
  svg.setAttribute('aria-hidden', 'true');
  svg.setAttribute('class', 'icon' + (cls ? ' ' + cls : ''));
  const p = document.createElementNS(SVG, 'path');
  p.setAttribute('d', ICONS[name] || '');
  svg.appendChild(p);
  return svg;
}

// copyText puts text on the clipboard. The async clipboard needs a secure
// context (127.0.0.1 is one) and focus; the textarea fallback covers the
// rest.
export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    const ta = h('textarea', { class: 'offscreen', readonly: true });
    ta.value = text;
    document.body.appendChild(ta);
    ta.select();
    let ok = false;
    try {
      ok = document.execCommand('copy');
    } catch {
      ok = false;
    }
    ta.remove();
    return ok;
  }
}

let toastBox;

// toast shows a short notice in the corner. body may hold nodes (links).
export function toast(body, kind = 'info', ms = 3500) {
  if (!toastBox) {
    toastBox = h('div', { class: 'toasts', role: 'status', 'aria-live': 'polite' });
    document.body.appendChild(toastBox);
  }
  const t = h('div', { class: 'toast toast-' + kind }, body);
  toastBox.appendChild(t);
  setTimeout(() => {
    t.classList.add('out');
    setTimeout(() => t.remove(), 250);
  }, ms);
  return t;
}

// copyButton is a small button that copies text() and confirms.
export function copyButton(text, label = 'Copy', title) {
  const b = h('button', { class: 'btn btn-ghost btn-sm', type: 'button', title: title || label }, icon('copy'), label ? h('span', null, label) : null);
  b.addEventListener('click', async (e) => {
    e.stopPropagation();
    const ok = await copyText(typeof text === 'function' ? text() : text);
    b.classList.add(ok ? 'copied' : 'copy-failed');
    setTimeout(() => b.classList.remove('copied', 'copy-failed'), 1200);
    if (!ok) toast('Could not copy to the clipboard', 'error');
  });
  return b;
}

// confirmDialog asks a yes/no question in a modal <dialog> (the page's
// own, not window.confirm, which a browser may suppress) and resolves to
// true when the person picks ok. title and text are set as text.
export function confirmDialog(title, text, ok = 'Delete') {
  return new Promise((resolve) => {
    const yes = h('button', { type: 'submit', class: 'btn btn-danger btn-sm act-confirm', value: 'yes' }, ok);
    const no = h('button', { type: 'submit', class: 'btn btn-sm act-cancel', value: 'no' }, 'Cancel');
    const dlg = h('dialog', { class: 'dlg confirm-dlg', 'aria-label': title },
      h('form', { method: 'dialog', class: 'dlg-form' },
        h('h2', { class: 'dlg-title' }, title),
        h('p', null, text),
        h('div', { class: 'dlg-actions' }, no, yes)));
    dlg.addEventListener('close', () => {
      resolve(dlg.returnValue === 'yes');
      dlg.remove();
    });
    document.body.appendChild(dlg);
    dlg.showModal();
    no.focus();
  });
}
