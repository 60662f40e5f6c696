// Showing request and response bodies: a lossless JSON parser (numbers keep
// their exact text, keys keep their order and repeats, errors carry a line
// and column), a collapsible syntax-coloured tree with contract annotations,
// and safe text and hex views for everything else.

import { h, icon } from './dom.js';

export class JSONSyntaxError extends Error {
  constructor(msg, text, pos) {
    let line = 1;
    let col = 1;
    for (let i = 0; i < pos && i < text.length; i++) {
      if (text.charCodeAt(i) === 10) {
        line++;
        col = 1;
      } else col++;
    }
    super(`${msg} at line ${line}, column ${col}`);
    this.pos = pos;
    this.line = line;
    this.col = col;
  }
}

// parse reads JSON text into a tree of nodes:
//   {t:'obj', entries:[{k, v}]}  {t:'arr', items:[…]}
//   {t:'str', v}  {t:'num', raw}  {t:'lit', raw}   (true, false, null)
export function parse(text) {
  let i = 0;
  const n = text.length;
  const fail = (msg) => {
    throw new JSONSyntaxError(msg, text, i);
  };
  const ws = () => {
    while (i < n) {
      const c = text.charCodeAt(i);
      if (c === 32 || c === 9 || c === 10 || c === 13) i++;
      else break;
    }
  };
  const str = () => {
    i++; // opening quote
    let out = '';
    let start = i;
    for (;;) {
      if (i >= n) fail('Unterminated string');
      const c = text.charCodeAt(i);
      if (c === 34) {
        out += text.slice(start, i);
        i++;
        return out;
      }
      if (c < 32) fail('Control character in string');
      if (c === 92) {
        out += text.slice(start, i);
        const e = text[i + 1];
        const simple = { '"': '"', '\\': '\\', '/': '/', b: '\b', f: '\f', n: '\n', r: '\r', t: '\t' }[e];
        if (simple !== undefined) {
          out += simple;
          i += 2;
        } else if (e === 'u') {
          const hex = text.slice(i + 2, i + 6);
          if (!/^[0-9a-fA-F]{4}$/.test(hex)) fail('Bad \\u escape');
          out += String.fromCharCode(parseInt(hex, 16));
          i += 6;
        } else {
          i++;
          fail('Bad escape');
        }
        start = i;
      } else i++;
    }
  };
  const value = (depth) => {
    if (depth > 500) fail('Nesting too deep');
    ws();
    if (i >= n) fail('Unexpected end of input');
    const c = text[i];
    if (c === '{') {
      i++;
      const entries = [];
      ws();
      if (text[i] === '}') {
        i++;
        return { t: 'obj', entries };
      }
      for (;;) {
        ws();
        if (text[i] !== '"') fail('Expected a "quoted" key');
        const k = str();
        ws();
        if (text[i] !== ':') fail("Expected ':' after key");
        i++;
        entries.push({ k, v: value(depth + 1) });
        ws();
        if (text[i] === ',') {
          i++;
          continue;
        }
        if (text[i] === '}') {
          i++;
          return { t: 'obj', entries };
        }
        fail("Expected ',' or '}'");
      }
    }
    if (c === '[') {
      i++;
      const items = [];
      ws();
      if (text[i] === ']') {
        i++;
        return { t: 'arr', items };
      }
      for (;;) {
        items.push(value(depth + 1));
        ws();
        if (text[i] === ',') {
          i++;
          continue;
        }
        if (text[i] === ']') {
          i++;
          return { t: 'arr', items };
        }
        fail("Expected ',' or ']'");
      }
    }
    if (c === '"') return { t: 'str', v: str() };
    const m = /^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(i, i + 400));
    if (m && m[0]) {
      i += m[0].length;
      return { t: 'num', raw: m[0] };
    }
    for (const lit of ['true', 'false', 'null']) {
      if (text.startsWith(lit, i)) {
        i += lit.length;
        return { t: 'lit', raw: lit };
      }
    }
    fail(`Unexpected '${c}'`);
  };
  const root = value(0);
  ws();
  if (i < n) fail('Unexpected text after the JSON value');
  return root;
}

// pretty prints a parsed tree with two-space indentation, keeping numbers
// exactly as written.
export function pretty(node, ind = '') {
  const next = ind + '  ';
  switch (node.t) {
    case 'obj':
      if (!node.entries.length) return '{}';
      return '{\n' + node.entries.map((e) => next + JSON.stringify(e.k) + ': ' + pretty(e.v, next)).join(',\n') + '\n' + ind + '}';
    case 'arr':
      if (!node.items.length) return '[]';
      return '[\n' + node.items.map((v) => next + pretty(v, next)).join(',\n') + '\n' + ind + ']';
    case 'str':
      return JSON.stringify(node.v);
    default:
      return node.raw;
  }
}

// normPath turns a check's path ("$.call.call_id", "/call/call_id",
// "call.contact[0].phone") into the dotted form the tree uses.
export function normPath(p) {
  if (p == null) return '';
  return String(p)
    .replace(/^\$/, '')
    .replace(/\[(\d+)\]/g, '.$1')
    .replace(/\//g, '.')
    .replace(/^\.+/, '')
    .replace(/\.+$/, '');
}

function collectPaths(node, path, out) {
  out.add(path);
  if (node.t === 'obj') for (const e of node.entries) collectPaths(e.v, path ? path + '.' + e.k : e.k, out);
  else if (node.t === 'arr') node.items.forEach((v, i) => collectPaths(v, path ? path + '.' + i : String(i), out));
  return out;
}

// placeAnnotations maps each check to the deepest existing node on its path
// (a missing field is shown on its parent).
function placeAnnotations(root, checks) {
  const byPath = new Map();
  if (!checks || !checks.length) return byPath;
  const paths = collectPaths(root, '', new Set());
  for (const c of checks) {
    let p = normPath(c.path);
    while (p && !paths.has(p)) p = p.includes('.') ? p.slice(0, p.lastIndexOf('.')) : '';
    if (!byPath.has(p)) byPath.set(p, []);
    byPath.get(p).push(c);
  }
  return byPath;
}

function countNodes(node, limit) {
  let n = 0;
  const walk = (x) => {
    if (n > limit) return;
    n++;
    if (x.t === 'obj') x.entries.forEach((e) => walk(e.v));
    else if (x.t === 'arr') x.items.forEach(walk);
  };
  walk(node);
  return n;
}

export function severityClass(sev) {
  const s = String(sev || '').toLowerCase();
  if (s === 'error' || s === 'fail' || s === 'critical') return 'sev-error';
  if (s === 'info' || s === 'notice') return 'sev-info';
  return 'sev-warn';
}

export function annotation(c) {
  return h('span', { class: 'annot ' + severityClass(c.severity), title: [c.code, c.path].filter(Boolean).join(' · ') },
    icon(severityClass(c.severity) === 'sev-info' ? 'info' : 'warn'), c.message || c.code || 'check');
}

// tree renders a parsed JSON value as a collapsible tree. Large trees start
// collapsed below the first levels; children are built on first expansion,
// so a big payload costs nothing until it is opened. Nodes that hold an
// annotation, and their ancestors, start expanded.
export function tree(root, { checks } = {}) {
  const notes = placeAnnotations(root, checks);
  const hot = new Set();
  for (const p of notes.keys()) {
    let q = p;
    for (;;) {
      hot.add(q);
      if (!q) break;
      q = q.includes('.') ? q.slice(0, q.lastIndexOf('.')) : '';
    }
  }
  const total = countNodes(root, 5000);
  const openDepth = total < 400 ? 99 : total < 2000 ? 3 : 1;

  const el = h('div', { class: 'jtree mono' });
  el.appendChild(node(root, null, '', 0, true));
  return el;

  function node(v, key, path, depth, last) {
    const comma = last ? null : h('span', { class: 'jp' }, ',');
    const keyEl = key == null ? null : [h('span', { class: 'jk' }, JSON.stringify(key)), h('span', { class: 'jp' }, ': ')];
    const here = notes.get(path);
    const marks = here ? here.map(annotation) : null;
    if (v.t !== 'obj' && v.t !== 'arr') {
      return h('div', { class: 'jl' + (here ? ' annotated' : ''), dataset: { path } }, keyEl, scalar(v), comma, marks);
    }
    const isObj = v.t === 'obj';
    const kids = isObj ? v.entries : v.items;
    const [open, close] = isObj ? ['{', '}'] : ['[', ']'];
    if (!kids.length) {
      return h('div', { class: 'jl', dataset: { path } }, keyEl, h('span', { class: 'jb' }, open + close), comma, marks);
    }
    const wrap = h('div', { class: 'jn', dataset: { path } });
    const tog = h('button', { class: 'jtog', type: 'button', 'aria-label': 'toggle', tabindex: '-1' }, icon('chevron'));
    const summary = h('span', { class: 'jsum' }, isObj ? `${kids.length} ${kids.length === 1 ? 'key' : 'keys'}` : `${kids.length} ${kids.length === 1 ? 'item' : 'items'}`);
    const head = h('div', { class: 'jl jhead' + (here ? ' annotated' : '') }, tog, keyEl, h('span', { class: 'jb' }, open),
      h('span', { class: 'jellipsis' }, '…'), h('span', { class: 'jb jclose-inline' }, close), h('span', { class: 'jcomma-inline' }, comma ? ',' : ''),
      summary, marks);
    const body = h('div', { class: 'jc' });
    const foot = h('div', { class: 'jl jfoot' }, h('span', { class: 'jb' }, close), comma);
    wrap.append(head, body, foot);
    let built = false;
    const build = () => {
      if (built) return;
      built = true;
      kids.forEach((kid, i) => {
        const last2 = i === kids.length - 1;
        if (isObj) body.appendChild(node(kid.v, kid.k, path ? path + '.' + kid.k : kid.k, depth + 1, last2));
        else body.appendChild(node(kid, null, path ? path + '.' + i : String(i), depth + 1, last2));
      });
    };
    const setOpen = (o) => {
      if (o) build();
      wrap.classList.toggle('collapsed', !o);
    };
    wrap._setOpen = setOpen;
    setOpen(depth < openDepth || hot.has(path));
    head.addEventListener('click', (e) => {
      if (e.target.closest('a')) return;
      setOpen(wrap.classList.contains('collapsed'));
    });
    return wrap;
  }

  function scalar(v) {
    switch (v.t) {
      case 'str':
        return h('span', { class: 'js' }, JSON.stringify(v.v));
      case 'num':
        return h('span', { class: 'jnum' }, v.raw);
      default:
        return h('span', { class: v.raw === 'null' ? 'jnull' : 'jbool' }, v.raw);
    }
  }
}

// expandAll opens (or closes) every node of a tree element.
export function expandAll(treeEl, open) {
  // Opening builds children, which may hold more nodes: repeat until none
  // is left to change.
  for (let round = 0; round < 64; round++) {
    const todo = [...treeEl.querySelectorAll('.jn')].filter((n) => n.classList.contains('collapsed') === open);
    if (!todo.length) return;
    if (!open) {
      todo.forEach((n) => n._setOpen(false));
      return;
    }
    todo.forEach((n) => n._setOpen(true));
  }
}

// bytesOf decodes a body as sent by the API: base64 or UTF-8 text.
export function bytesOf(body, encoding) {
  if (body == null) return new Uint8Array(0);
  if (encoding === 'base64') {
    try {
      const bin = atob(body);
      const out = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
      return out;
    } catch {
      return new Uint8Array(0);
    }
  }
  return new TextEncoder().encode(body);
}

// textOf shows bytes as text; invalid UTF-8 becomes U+FFFD.
export function textOf(body, encoding) {
  if (encoding !== 'base64') return body ?? '';
  return new TextDecoder('utf-8', { fatal: false }).decode(bytesOf(body, encoding));
}

// isBinary guesses whether bytes are better shown as hex than as text.
export function isBinary(bytes) {
  const n = Math.min(bytes.length, 4096);
  let ctl = 0;
  for (let i = 0; i < n; i++) {
    const b = bytes[i];
    if (b === 0) return true;
    if (b < 32 && b !== 9 && b !== 10 && b !== 13) ctl++;
  }
  return n > 0 && ctl / n > 0.1;
}

const HEX_LIMIT = 64 * 1024;

// hexDump is the classic offset / hex / ASCII listing, as one text node.
export function hexDump(bytes) {
  const n = Math.min(bytes.length, HEX_LIMIT);
  const lines = [];
  for (let off = 0; off < n; off += 16) {
    let hex = '';
    let asc = '';
    for (let j = 0; j < 16; j++) {
      if (off + j < n) {
        const b = bytes[off + j];
        hex += b.toString(16).padStart(2, '0') + ' ';
        asc += b >= 32 && b < 127 ? String.fromCharCode(b) : '.';
      } else hex += '   ';
      if (j === 7) hex += ' ';
    }
    lines.push(off.toString(16).padStart(8, '0') + '  ' + hex + ' ' + asc);
  }
  const pre = h('pre', { class: 'hex mono' }, lines.join('\n'));
  if (bytes.length > n) return [pre, h('div', { class: 'muted trunc' }, `Showing the first ${n.toLocaleString()} of ${bytes.length.toLocaleString()} bytes. Download the body for all of it.`)];
  return pre;
}

const TEXT_LIMIT = 512 * 1024;

export function textView(text) {
  if (text.length <= TEXT_LIMIT) return h('pre', { class: 'raw mono' }, text);
  const pre = h('pre', { class: 'raw mono' }, text.slice(0, TEXT_LIMIT));
  const more = h('button', { class: 'btn btn-sm', type: 'button' }, `Show all ${text.length.toLocaleString()} characters`);
  more.addEventListener('click', () => {
    pre.textContent = text;
    more.remove();
  });
  return [pre, h('div', { class: 'trunc' }, more)];
}
