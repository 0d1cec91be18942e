// Strata web UI: picks a service and time range, then shows the flame graph, top functions
// or a diff, all from the server's JSON API (/api/v1/...). No external resources.
'use strict';

const $ = (id) => document.getElementById(id);
const state = { view: 'flame', tree: null, zoom: null, services: [] };

function rangeParams() {
  const p = new URLSearchParams();
  const range = $('range').value;
  if (range === 'custom') {
    const from = Date.parse($('from').value), to = Date.parse($('to').value);
    if (isNaN(from)) throw new Error('pick a start time for the custom range');
    p.set('from_ms', from);
    if (!isNaN(to)) p.set('to_ms', to);
  } else {
    p.set('since_s', range);
  }
  return p;
}

// " (off-cpu)" / " (wall)" after sample counts; CPU, the default, says nothing.
const typeSuffix = () => ($('type').value === 'cpu' ? '' : ` (${$('type').value})`);

function filterParams() {
  const p = rangeParams();
  p.set('service', $('service').value);
  if ($('type').value !== 'cpu') p.set('type', $('type').value);
  for (const key of ['host', 'focus', 'ignore', 'select']) {
    const v = $(key).value.trim();
    if (v) p.set(key, v);
  }
  return p;
}

async function api(path, params) {
  // Against the origin, not the page's URL: a page opened as https://user:token@host/ (HTTP
  // Basic with the token) has credentials in its URL, which fetch() refuses to resolve
  // against; the browser sends the cached credentials with same-origin requests anyway.
  const url = new URL(path, window.location.origin);
  if (params) url.search = params.toString();
  const res = await fetch(url);
  const text = await res.text();
  let body;
  try { body = JSON.parse(text); } catch (e) { throw new Error(text || res.statusText); }
  if (!res.ok) throw new Error(body.error || res.statusText);
  return body;
}

function showError(e) {
  $('error').hidden = !e;
  $('error').textContent = e ? String(e.message || e) : '';
}

const fmt = (n) => Number(n).toLocaleString('en-US');
const pct = (part, total) => (total > 0 ? (100 * part / total).toFixed(2) : '0.00') + '%';
const signed = (v) => (v > 0 ? '+' : '') + v.toFixed(2);

function cell(text, cls) {
  const td = document.createElement('td');
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function fillTable(table, rows) {
  const body = table.querySelector('tbody');
  body.replaceChildren();
  for (const cells of rows) {
    const tr = document.createElement('tr');
    for (const td of cells) tr.appendChild(td);
    body.appendChild(tr);
  }
}

// ---- flame graph --------------------------------------------------------------------------

// Stable colour per function name, in the SVG export's palettes: warm for user code, orange
// for the kernel, aqua for JIT code, green for Python and Java (the node's "kind").
function color(name, kind) {
  let h = 2166136261;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 16777619) >>> 0;
  const v = (h & 0xff) / 255;
  if (kind === 'kernel') return `rgb(${190 + 65 * v | 0},${90 + 65 * v | 0},0)`;
  if (kind === 'jit') return `rgb(${50 + 60 * v | 0},${165 + 55 * v | 0},${165 + 55 * v | 0})`;
  if (kind === 'python' || kind === 'java') {
    return `rgb(${50 + 60 * v | 0},${180 + 60 * v | 0},${50 + 60 * v | 0})`;
  }
  return `rgb(${205 + (h >>> 16) % 50},${(h & 0xff) * 230 / 255 | 0},${((h >>> 8) & 0xff) * 55 / 255 | 0})`;
}

// Annotates the tree with parents so zooming can show the path to the root.
function link(node, parent) {
  node.parent = parent;
  for (const c of node.children) link(c, node);
}

// The search box's regular expression, or null when empty (or not a valid one: said below the
// flame graph).
function searchRegex() {
  const text = $('flame-search').value.trim();
  if (!text) return null;
  try { return new RegExp(text); } catch (e) { return undefined; }
}

// Samples under frames matching `re`, each stack counted once (at its outermost match).
function matchedSamples(node, re) {
  if (re.test(node.name)) return node.value || 0;
  return (node.children || []).reduce((sum, c) => sum + matchedSamples(c, re), 0);
}

function renderFlame() {
  const re = searchRegex();
  renderFlameInto($('flame'), state.tree, state.zoom,
                  (node, depth) => depth === 0 ? 'rgb(235,200,120)' : color(node.function || node.name, node.kind),
                  re ? (node, depth) => depth > 0 && re.test(node.name) : null);
  $('flame-reset').hidden = !state.zoom || state.zoom === state.tree;
  state.total = state.tree ? state.tree.value : 0;
  if (re === undefined) {
    $('flame-details').textContent = 'The search is not a valid regular expression.';
  } else if (re && state.tree) {
    const n = state.tree.children.reduce((sum, c) => sum + matchedSamples(c, re), 0);
    $('flame-details').textContent =
        `Matched /${re.source}/: ${fmt(n)} samples, ${pct(n, state.tree.value)}`;
  }
  saveView();
}

// Draws `root` (zoomed to `zoom`, or whole) into `box`, each frame coloured by colorOf(node,
// depth), those where matches(node, depth) holds highlighted (the others dimmed); every
// frame's div carries its node (_node) for the pointer handlers.
function renderFlameInto(box, root, zoomed, colorOf, matches) {
  box.replaceChildren();
  if (!root || !root.value) {
    box.style.height = '40px';
    box.textContent = 'No samples in this range.';
    return;
  }
  const zoom = zoomed || root;
  const width = box.clientWidth || 1200, rowH = 18;
  const frag = document.createDocumentFragment();
  let maxDepth = 0;
  const place = (node, depth, x, w, ancestor) => {
    if (w < 0.5) return;
    maxDepth = Math.max(maxDepth, depth);
    const div = document.createElement('div');
    div.className = 'frame' + (ancestor ? ' ancestor' : '');
    div.style.left = x + 'px';
    div.style.top = depth * rowH + 'px';
    div.style.width = w + 'px';
    div.style.background = colorOf(node, depth);
    if (matches) div.classList.add(matches(node, depth) ? 'match' : 'unmatched');
    if (w > 24) div.textContent = node.name;
    div.title = '';
    div._node = node;
    frag.appendChild(div);
  };
  // Ancestors of the zoomed node span the full width.
  const chain = [];
  for (let n = zoom; n; n = n.parent) chain.unshift(n);
  chain.forEach((n, i) => { if (n !== zoom) place(n, i, 0, width, true); });
  const scale = width / zoom.value;
  const walk = (node, depth, x) => {
    place(node, depth, x, node.value * scale, false);
    let cx = x;
    for (const c of node.children) {
      if (c.value * scale >= 0.5) walk(c, depth + 1, cx);
      cx += c.value * scale;
    }
  };
  walk(zoom, chain.length - 1, 0);
  box.style.height = (maxDepth + 1) * rowH + 2 + 'px';
  box.appendChild(frag);
}

function frameText(node) {
  const mod = node.module ? '  ' + node.module : '';
  return `${node.name}  —  ${fmt(node.value)} samples, ${pct(node.value, state.tree.value)}` +
         ` (self ${fmt(node.self)})${mod}`;
}

$('flame').addEventListener('click', (e) => {
  const node = e.target._node;
  if (!node) return;
  state.zoom = node === state.zoom ? (node.parent || null) : node;
  renderFlame();
});
// The tooltip of a flame graph box: text(node) of the frame under the pointer.
function addTooltip(box, text) {
  box.addEventListener('mousemove', (e) => {
    const node = e.target._node, tip = $('tooltip');
    if (!node) { tip.hidden = true; return; }
    tip.textContent = text(node);
    tip.hidden = false;
    tip.style.left = Math.min(e.clientX + 12, window.innerWidth - tip.offsetWidth - 4) + 'px';
    tip.style.top = e.clientY + 14 + 'px';
  });
  box.addEventListener('mouseleave', () => { $('tooltip').hidden = true; });
}
addTooltip($('flame'), frameText);
$('flame').addEventListener('mousemove', (e) => {
  if (e.target._node) $('flame-details').textContent = frameText(e.target._node);
});
$('flame-reset').addEventListener('click', () => { state.zoom = null; renderFlame(); });
$('flame-search').addEventListener('input', () => { if (state.tree) renderFlame(); });
window.addEventListener('resize', () => {
  if (state.view === 'flame') renderFlame();
  drawTimeline();
});

async function loadFlame() {
  const p = filterParams();
  if ($('lines').checked) p.set('lines', '1');
  const tree = await api('/api/v1/flamegraph', p);
  link(tree, null);
  state.tree = tree;
  // A shared link's zoom: the frame at the end of its path of names, if the tree has it.
  state.zoom = state.pendingZoom ? nodeAtPath(tree, state.pendingZoom) : null;
  state.pendingZoom = null;
  const sel = $('select').value.trim();
  $('summary').textContent = `${$('service').value}${sel ? ' {' + sel + '}' : ''}: ` +
      `${fmt(tree.value || 0)} samples${typeSuffix()}`;
  renderFlame();
}

// The names from the root's child down to `node`, and back.
function pathOf(node) {
  const names = [];
  for (let n = node; n && n.parent; n = n.parent) names.unshift(n.name);
  return names;
}
function nodeAtPath(tree, names) {
  let node = tree;
  for (const name of names) {
    node = (node.children || []).find((c) => c.name === name);
    if (!node) return null;
  }
  return node === tree ? null : node;
}

// A frame of the JSON API, marked " [k]" for kernel code and " [j]" for JIT code (as the CLI).
const functionText = (f) =>
  f.function + ({ FRAME_KERNEL: ' [k]', FRAME_JIT: ' [j]', FRAME_JAVA: ' [j]' }[f.kind] || '');

// ---- top ----------------------------------------------------------------------------------

// With Lines, the API's language_self: each sample at its innermost Python or Java frame's line.
const languageSelf = () => $('lines').checked && $('language-self').checked;

// A source line of the API (Frame with file and line), as "function file:line [inlined]".
const lineText = (f) => f.function + (f.file ? ` ${f.file}${f.line ? ':' + f.line : ''}` : '') +
    (f.inlined ? ' [inlined]' : '');

async function loadTop() {
  const p = filterParams();
  p.set('limit', 100);
  if ($('lines').checked) {
    // Self samples per leaf line, its inline chain outermost first.
    p.set('by', 'line');
    if (languageSelf()) p.set('language_self', '1');
    const r = await api('/api/v1/top', p);
    const total = Number(r.total_samples);
    $('summary').textContent = `${$('service').value}: ${fmt(total)} samples by line` +
        (Number(r.unresolved_samples) ? `, ${fmt(r.unresolved_samples)} without lines` : '') +
        (languageSelf() ? '; Python and Java lines with the native code they call' : '');
    fillTable($('top-table'), r.lines.map((l) => [
      cell(fmt(l.self), 'num'), cell(pct(l.self, total), 'num'), cell('', 'num'), cell('', 'num'),
      cell([...l.frames].reverse().map(lineText).join(' > '), 'fn'),
      cell(l.frames.length ? l.frames[0].module : '')]));
    return;
  }
  const r = await api('/api/v1/top', p);
  const total = Number(r.total_samples);
  $('summary').textContent = `${$('service').value}: ${fmt(total)} samples${typeSuffix()}` +
      (r.archs.length ? ` (${r.archs.join(', ')})` : '');
  fillTable($('top-table'), r.functions.map((f) => [
    cell(fmt(f.self), 'num'), cell(pct(f.self, total), 'num'), cell(fmt(f.total), 'num'),
    cell(pct(f.total, total), 'num'), cell(functionText(f.function), 'fn'), cell(f.function.module)]));
}

// ---- diff ---------------------------------------------------------------------------------

async function loadDiff() {
  const p = filterParams();
  p.set('limit', 50);
  if ($('diff-base').value === 'service') {
    if (!$('diff-service').value) throw new Error('pick the service to compare against');
    p.set('base_service', $('diff-service').value);
  } else if ($('diff-base').value === 'select') {
    // The same range of the targets this selector picks ("did the deploy make it slower?").
    p.set('base_select', $('diff-select').value.trim());
  } else if ($('diff-base').value === 'range') {
    const from = Date.parse($('diff-from').value), to = Date.parse($('diff-to').value);
    if (isNaN(from) || isNaN(to)) throw new Error('pick the start and end of the earlier range');
    p.set('base_from_ms', from);
    p.set('base_to_ms', to);
  }
  const byLine = $('lines').checked;
  if (byLine) p.set('by', 'line');
  if (languageSelf()) p.set('language_self', '1');
  const r = await api('/api/v1/diff', p);
  const bt = Number(r.base_total_samples), t = Number(r.total_samples);
  $('summary').textContent = `base ${fmt(bt)} samples, compared ${fmt(t)} samples` +
      (byLine && !languageSelf() ? ' with a leaf address' : '');
  // Leaf addresses are kept per host and window; lines of the stacks take every filter.
  $('diff-lines-scope').textContent = languageSelf() ? 'every filter applies'
                                                     : 'the ranges and host apply';
  const deltaCell = (v) => cell(signed(v), 'num ' + (v > 0 ? 'up' : v < 0 ? 'down' : ''));
  $('diff-by-function').hidden = byLine;
  $('diff-by-line').hidden = !byLine;
  if (byLine) {
    // Each line with its inline chain, outermost first, as in Top.
    fillTable($('diff-lines'), (r.lines || []).map((l) => [
      deltaCell(l.self_delta_pct), cell(pct(l.base_self, bt), 'num'), cell(pct(l.self, t), 'num'),
      cell([...l.frames].reverse().map(lineText).join(' > '), 'fn')]));
    return;
  }
  fillTable($('diff-functions'), r.functions.map((f) => [
    deltaCell(f.self_delta_pct), cell(pct(f.base_self, bt), 'num'), cell(pct(f.self, t), 'num'),
    deltaCell(f.total_delta_pct), cell(f.function.function, 'fn')]));
  fillTable($('diff-paths'), r.paths.map((x) => [
    deltaCell(x.delta_pct), cell(pct(x.base_samples, bt), 'num'), cell(pct(x.samples, t), 'num'),
    cell((x.truncated ? '[truncated] > ' : '') + x.frames.map((f) => f.function).join(' > '), 'fn')]));
}

// ---- stack quality ------------------------------------------------------------------------

async function loadQuality() {
  const r = await api('/api/v1/quality', filterParams());
  $('summary').textContent = `${$('service').value}: ${fmt(r.samples)} samples`;
  const rows = [
    ['Complete stacks', `${r.complete_pct.toFixed(2)}% (${fmt(r.truncated_samples)} truncated)`],
    ['Depth', `mean ${r.mean_depth.toFixed(1)}, max ${r.max_depth}; truncated mean ` +
      `${r.mean_truncated_depth.toFixed(1)}, max ${r.max_truncated_depth}`],
    ['Unnamed frames', `${fmt(r.unnamed_frames)} of ${fmt(r.frames)} (${pct(r.unnamed_frames, r.frames)})`],
    ['Agents (the whole service)',
      `${fmt(r.agent_stacks)} stacks, ${fmt(r.agent_truncated)} truncated, ` +
      `${fmt(r.verify_failures)} verification failures, JIT frames ${fmt(r.jit_frames_cfi)} by rules ` +
      `and ${fmt(r.jit_frames_fp)} by frame pointers, ${fmt(r.lost_samples)} samples lost`],
  ];
  if (r.frames_by_kind && r.frames_by_kind.length) {
    rows.push(['Frames by kind', r.frames_by_kind.map((k) => `${k.kind} ${fmt(k.frames)}` +
      (Number(k.unnamed_frames || 0) ? ` (${fmt(k.unnamed_frames)} unnamed)` : '')).join(', ')]);
  }
  if (r.python_frames || r.python_stale) {
    rows.push(['Python', `${fmt(r.python_frames || 0)} frames read from interpreters, ` +
      `${fmt(r.python_stale || 0)} stacks whose Python frames changed before they were read`]);
  }
  $('quality-summary').replaceChildren(...rows.flatMap(([k, v]) => {
    const dt = document.createElement('dt'), dd = document.createElement('dd');
    dt.textContent = k;
    dd.textContent = v;
    return [dt, dd];
  }));
  fillTable($('quality-binaries'), r.binaries.map((b) => [
    cell(fmt(b.frames), 'num'), cell(fmt(b.unnamed_frames), 'num'),
    cell(pct(b.unnamed_frames, b.frames), 'num'), cell(fmt(b.truncated_here), 'num'),
    cell(b.kind || ''), cell(b.module, 'fn'), cell(b.build_id || '-', 'fn'), cell(b.hint)]));
}

// ---- regressions --------------------------------------------------------------------------

const stateNames = { REGRESSED: 'REGRESSED', IMPROVED: 'improved', UNCHANGED: 'unchanged',
                     NOT_ENOUGH_DATA: 'not enough data' };

// "version 1 → 2", or "phase change (version 2)": one release before and after a change of
// its hottest contexts.
function comparedText(v) {
  if (v.kind === 'PHASE') return v.label ? `phase change (${v.label} ${v.candidate})` : 'phase change';
  return `${v.label} ${v.baseline} → ${v.candidate}`;
}

// What the comparison took as units: hosts, or one host's windows (a phase change, or a
// release of a service that runs on one host).
function unitsText(v) {
  const units = `${v.baseline_units || 0}/${v.candidate_units || 0}`;
  return v.window_s ? `${units} of ${v.window_s}s` : `${units} hosts`;
}

// The releases (and phase changes) the server compared by itself; the chosen one's
// differential flame graph: the
// candidate's tree, each frame red where its share of the samples grew against the baseline,
// blue where it shrank (white: unchanged; full colour at 5 points).
async function loadRegressions() {
  const r = await api('/api/v1/regressions', new URLSearchParams({ service: $('service').value }));
  const verdicts = r.verdicts || [];
  $('summary').textContent = `${$('service').value}: ${verdicts.length} release` +
      `${verdicts.length === 1 ? '' : 's'} or phase change${verdicts.length === 1 ? '' : 's'}` +
      ' compared with the time before';
  state.verdicts = verdicts;
  fillTable($('regressions-table'), verdicts.map((v, i) => {
    const top = (v.functions || [])[0];
    const row = [
      cell(new Date(Number(v.first_seen_ms)).toISOString().replace('.000', '')),
      cell(comparedText(v)),
      cell(stateNames[v.state] + (v.final ? '' : ' (so far)'),
           v.state === 'REGRESSED' ? 'up' : v.state === 'IMPROVED' ? 'down' : ''),
      cell(unitsText(v), 'num'),
      cell(v.min_detectable ? v.min_detectable.toFixed(2) + ' pt' : '-', 'num'),
      cell(top ? `${top.name} ${signed(top.delta)} pt [${signed(top.ci_low)}, ${signed(top.ci_high)}]`
               : '-', 'fn')];
    row[1].dataset.index = i;
    return row;
  }));
  const chosen = verdicts.findIndex((v) => v.state === 'REGRESSED');
  await showRegression(chosen >= 0 ? chosen : 0);
}

// The Diff tab by line for a verdict (its which_lines request): two releases' selectors over
// one range that covers both of theirs, or one selection's two ranges (a phase change).
function whichLinesParams(v) {
  const d = v.which_lines, f = d.filter, b = d.base;
  const p = new URLSearchParams({ service: f.service, view: 'diff', lines: '1' });
  if (d.language_self) p.set('language_self', '1');
  const selector = f.selector || '', baseSelector = b.selector || '';
  if (selector) p.set('select', selector);
  const ms = (r, key) => Number((r.range || {})[key] || 0);
  if (baseSelector !== selector) {
    p.set('base_select', baseSelector);
    p.set('from_ms', Math.min(ms(f, 'from_ms'), ms(b, 'from_ms')));
    p.set('to_ms', Math.max(ms(f, 'to_ms'), ms(b, 'to_ms')));
  } else {
    p.set('from_ms', ms(f, 'from_ms'));
    p.set('to_ms', ms(f, 'to_ms'));
    p.set('base_from_ms', ms(b, 'from_ms'));
    p.set('base_to_ms', ms(b, 'to_ms'));
  }
  return p;
}

async function showRegression(index) {
  const v = (state.verdicts || [])[index];
  const box = $('regression-flame');
  $('regression-lines').hidden = !(v && v.which_lines);
  if (v && v.which_lines) $('regression-lines').href = `?${whichLinesParams(v)}`;
  if (!v) {
    box.replaceChildren();
    $('regression-title').textContent = 'No release of this service was compared yet.';
    return;
  }
  const tree = (select, from, to) => api('/api/v1/flamegraph', new URLSearchParams({
    service: v.service, select, from_ms: from, to_ms: to, format: 'json' }));
  // The ranges the server compared (a phase change: one release before and after it).
  const select = (value) => (v.label ? `${v.label}=${value}` : '');
  const [base, cand] = await Promise.all([
    tree(select(v.baseline), Number(v.baseline_from_ms), Number(v.baseline_to_ms)),
    tree(select(v.candidate), Number(v.candidate_from_ms), Number(v.candidate_to_ms))]);
  // Baseline shares by path of names.
  const baseShare = new Map();
  const indexBase = (node, path) => {
    const p = path + '\u0000' + node.name;
    baseShare.set(p, (node.value || 0) / (base.value || 1));
    for (const c of node.children || []) indexBase(c, p);
  };
  indexBase(base, '');
  const annotate = (node, path) => {
    node.path = path + '\u0000' + node.name;
    node.delta = 100 * ((node.value || 0) / (cand.value || 1) - (baseShare.get(node.path) || 0));
    for (const c of node.children || []) annotate(c, node.path);
  };
  annotate(cand, '');
  link(cand, null);
  state.regressionTree = cand;
  $('regression-title').textContent =
      `${v.service} ${comparedText(v)}: ${stateNames[v.state]}` +
      ` (${fmt(v.baseline_samples)} and ${fmt(v.candidate_samples)} samples). ` +
      'Red: a larger share of the CPU than before, blue: smaller.';
  renderFlameInto(box, cand, null, (node, depth) => {
    if (depth === 0) return 'rgb(235,200,120)';
    const t = Math.min(1, Math.abs(node.delta) / 5), keep = Math.round(255 * (1 - t));
    return node.delta >= 0 ? `rgb(255,${keep},${keep})` : `rgb(${keep},${keep},255)`;
  });
}

$('regressions-table').addEventListener('click', (e) => {
  const row = e.target.closest('tr');
  if (!row || !row.cells[1] || row.cells[1].dataset.index === undefined) return;
  showRegression(Number(row.cells[1].dataset.index)).catch(showError);
});
addTooltip($('regression-flame'), (node) =>
  `${node.name}  —  ${pct(node.value, state.regressionTree.value)} of the ` +
  `candidate's samples, ${signed(node.delta)} points against the baseline`);

// ---- sandwich -----------------------------------------------------------------------------

// One function's callers and callees from a flame graph tree: `callees` is every subtree
// rooted at the function merged (by name, level by level), `callers` the paths above it
// turned upside down (its callers as its children, theirs below them). A stack through it
// counts once, at its outermost call, so recursion does not count twice.
function sandwichOf(tree, name) {
  const make = () => ({ name, value: 0, self: 0, children: [] });
  const callees = make(), callers = make();
  const childOf = (node, from) => {
    let c = node.children.find((x) => x.name === from.name);
    if (!c) {
      c = { name: from.name, kind: from.kind, module: from.module, value: 0, self: 0, children: [] };
      node.children.push(c);
    }
    return c;
  };
  const merge = (into, node) => {
    for (const c of node.children || []) {
      const m = childOf(into, c);
      m.value += c.value || 0;
      m.self += c.self || 0;
      merge(m, c);
    }
  };
  const above = [];  // the frames from the root's child down to the node walked
  const walk = (node) => {
    if (node.name === name) {
      callees.value += node.value || 0;
      callees.self += node.self || 0;
      merge(callees, node);
      callers.value += node.value || 0;
      let at = callers;
      for (let i = above.length - 1; i >= 0; i--) {
        at = childOf(at, above[i]);
        at.value += node.value || 0;
      }
      return;
    }
    above.push(node);
    for (const c of node.children || []) walk(c);
    above.pop();
  };
  for (const c of tree.children || []) walk(c);
  const sort = (node) => {
    node.children.sort((a, b) => b.value - a.value);
    node.children.forEach(sort);
  };
  sort(callees);
  sort(callers);
  link(callees, null);
  link(callers, null);
  return { callers, callees };
}

async function loadSandwich() {
  const name = $('sandwich-function').value.trim();
  if (!name) {
    $('summary').textContent = 'Pick a function (or click one in Top functions).';
    $('sandwich-callers').replaceChildren();
    $('sandwich-callees').replaceChildren();
    return;
  }
  const tree = await api('/api/v1/flamegraph', filterParams());
  link(tree, null);
  state.tree = tree;
  const { callers, callees } = sandwichOf(tree, name);
  $('summary').textContent = `${name}: ${fmt(callees.value)} samples, ` +
      `${pct(callees.value, tree.value || 0)} of ${$('service').value}${typeSuffix()}`;
  const colorOf = (node, depth) => (depth === 0 ? 'rgb(235,200,120)' : color(node.name, node.kind));
  $('sandwich-callers-title').textContent = `Callers of ${name} (its caller below it, theirs below them)`;
  $('sandwich-callees-title').textContent = `Callees of ${name}`;
  renderFlameInto($('sandwich-callers'), callers, null, colorOf);
  renderFlameInto($('sandwich-callees'), callees, null, colorOf);
}

for (const box of [$('sandwich-callers'), $('sandwich-callees')]) addTooltip(box, frameText);
$('sandwich-form').addEventListener('submit', (e) => { e.preventDefault(); refresh(); });
// A function of Top functions opens its sandwich.
$('top-table').addEventListener('click', (e) => {
  const td = e.target.closest('td.fn');
  if (!td || $('lines').checked) return;
  $('sandwich-function').value = td.textContent.replace(/ \[[kj]\]$/, '');
  selectView('sandwich');
});

// ---- wiring -------------------------------------------------------------------------------

// The whole view as URL parameters, written to the page's address (replaced, not pushed) and
// to the Link anchor, so that a copied address opens the same view; init() reads them back.
function viewParams() {
  let p;
  try { p = filterParams(); } catch (e) { p = new URLSearchParams({ service: $('service').value }); }
  p.set('view', state.view);
  if ($('lines').checked) p.set('lines', '1');
  if (languageSelf()) p.set('language_self', '1');
  if (state.view === 'diff' && $('diff-base').value === 'select') {
    p.set('base_select', $('diff-select').value.trim());
  } else if (state.view === 'diff' && $('diff-base').value === 'service') {
    p.set('base_service', $('diff-service').value);
  } else if (state.view === 'diff' && $('diff-base').value === 'range') {
    const from = Date.parse($('diff-from').value), to = Date.parse($('diff-to').value);
    if (!isNaN(from)) p.set('base_from_ms', from);
    if (!isNaN(to)) p.set('base_to_ms', to);
  }
  if (state.view === 'sandwich' && $('sandwich-function').value.trim()) {
    p.set('function', $('sandwich-function').value.trim());
  }
  const search = $('flame-search').value.trim();
  if (search) p.set('search', search);
  if ($('timeline-group').value) p.set('group_by', $('timeline-group').value);
  if (state.view === 'flame' && state.zoom && state.zoom !== state.tree) {
    p.set('zoom', pathOf(state.zoom).join('\n'));
  }
  return p;
}
function saveView() {
  const url = `${location.pathname}?${viewParams()}`;
  history.replaceState(null, '', url);
  $('share').href = url;
}

const loaders = { flame: loadFlame, top: loadTop, diff: loadDiff, quality: loadQuality,
                  regressions: loadRegressions, sandwich: loadSandwich };

async function refresh() {
  if (!$('service').value) {
    showError(new Error('No service has reported samples yet.'));
    return;
  }
  try {
    showError(null);
    // The timeline beside every view but the regressions list (which has ranges of its own).
    $('timeline').hidden = state.view === 'regressions';
    await Promise.all([loaders[state.view](),
                       state.view === 'regressions' ? null : loadTimeline()]);
    document.body.dataset.loaded = state.view;
    saveView();
  } catch (e) {
    showError(e);
  }
}

function selectView(view) {
  state.view = view;
  for (const b of document.querySelectorAll('nav .tab')) {
    b.classList.toggle('active', b.dataset.view === view);
  }
  for (const v of Object.keys(loaders)) $('view-' + v).hidden = v !== view;
  refresh();
}

for (const b of document.querySelectorAll('nav .tab')) {
  b.addEventListener('click', () => selectView(b.dataset.view));
}
$('filters').addEventListener('submit', (e) => { e.preventDefault(); refresh(); });
$('diff-form').addEventListener('submit', (e) => { e.preventDefault(); refresh(); });
function showDiffBase() {
  $('diff-service').hidden = $('diff-base').value !== 'service';
  $('diff-select').hidden = $('diff-base').value !== 'select';
  $('diff-range').hidden = $('diff-base').value !== 'range';
}
$('diff-base').addEventListener('change', showDiffBase);

// Suggestions for the label filter: key=value of the service's label sets.
async function loadLabelHints() {
  const hints = $('label-hints');
  hints.replaceChildren();
  if (!$('service').value) return;
  try {
    const r = await api('/api/v1/labels', new URLSearchParams({ service: $('service').value }));
    for (const l of r.labels) {
      for (const v of l.values) hints.appendChild(new Option(`${l.key}=${v}`));
    }
    document.body.dataset.labels = r.labels.map((l) => l.key).join(',');
    const group = $('timeline-group'), chosen = group.value;
    group.replaceChildren(new Option('nothing', ''), new Option('host', 'host'),
                          ...r.labels.map((l) => new Option(l.key, l.key)));
    group.value = state.pendingGroup || chosen;
    state.pendingGroup = null;
  } catch (e) {
    // Hints are a convenience: the filter works without them.
  }
}
$('range').addEventListener('change', () => {
  $('custom-range').hidden = $('range').value !== 'custom';
});
$('service').addEventListener('change', () => { loadLabelHints(); refresh(); });
$('type').addEventListener('change', refresh);
$('lines').addEventListener('change', () => {
  $('language-self').disabled = !$('lines').checked;
  refresh();
});
$('language-self').addEventListener('change', refresh);

async function init() {
  try {
    const r = await api('/api/v1/services');
    state.services = r.services;
    const params = new URLSearchParams(location.search);
    for (const sel of [$('service'), $('diff-service')]) {
      sel.replaceChildren(...r.services.map((s) => new Option(s.name, s.name)));
    }
    if (params.get('service')) $('service').value = params.get('service');
    for (const key of ['host', 'focus', 'ignore', 'select']) {
      if (params.get(key)) $(key).value = params.get(key);
    }
    if (params.get('search')) $('flame-search').value = params.get('search');
    if (params.get('group_by')) {
      state.pendingGroup = params.get('group_by');
      $('timeline-group').value = params.get('group_by');
    }
    if (params.get('function')) $('sandwich-function').value = params.get('function');
    if (params.get('zoom')) state.pendingZoom = params.get('zoom').split('\n');
    if (params.get('from_ms')) {
      setCustomRange(Number(params.get('from_ms')),
                     params.get('to_ms') ? Number(params.get('to_ms')) : undefined);
    }
    if (params.get('base_service') !== null) {
      $('diff-base').value = 'service';
      $('diff-service').value = params.get('base_service');
    }
    if (['cpu', 'off-cpu', 'wall'].includes(params.get('type'))) $('type').value = params.get('type');
    $('lines').checked = params.get('lines') === '1';
    $('language-self').checked = params.get('language_self') === '1';
    $('language-self').disabled = !$('lines').checked;
    if (params.get('base_select') !== null) {
      $('diff-base').value = 'select';
      $('diff-select').value = params.get('base_select');
    } else if (params.get('base_from_ms')) {
      $('diff-base').value = 'range';
      $('diff-from').value = localTime(Number(params.get('base_from_ms')));
      const to = params.get('base_to_ms');
      if (to) $('diff-to').value = localTime(Number(to));
    }
    showDiffBase();
    await loadLabelHints();
    if (params.get('since_s')) {
      const opt = [...$('range').options].find((o) => o.value === params.get('since_s'));
      if (opt) $('range').value = opt.value;
    }
    selectView(params.get('view') in loaders ? params.get('view') : 'flame');
  } catch (e) {
    showError(e);
  }
}
// After every script of the page has run (timeline.js comes after this one).
document.addEventListener('DOMContentLoaded', init);
