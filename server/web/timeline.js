// Strata web UI: the timeline above the views (app.js loads the rest). Loaded after app.js,
// whose helpers it uses; app.js calls loadTimeline() and drawTimeline().
'use strict';

// Samples per interval of the selection (/api/v1/series), stacked by a label or the host when
// chosen. Dragging across it sets a custom range and reloads the view.
const palette = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1',
                 '#ff9da7', '#9c755f', '#bab0ac', '#8cd17d'];
const svgNs = 'http://www.w3.org/2000/svg';

function svgElement(name, attrs) {
  const e = document.createElementNS(svgNs, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

// datetime-local wants local time without a zone.
const localTime = (ms) => new Date(ms - new Date(ms).getTimezoneOffset() * 60000)
    .toISOString().slice(0, 19);

function setCustomRange(fromMs, toMs) {
  $('range').value = 'custom';
  $('custom-range').hidden = false;
  $('from').value = localTime(fromMs);
  if (toMs !== undefined) $('to').value = localTime(toMs);
}

async function loadTimeline() {
  const p = filterParams();
  const group = $('timeline-group').value;
  if (group) p.set('group_by', group);
  const r = await api('/api/v1/series', p);
  state.timeline = r;
  drawTimeline();
}

// The chart's width in pixels (an <svg>'s clientWidth can be 0).
const chartWidth = () => $('timeline-chart').getBoundingClientRect().width;

function drawTimeline() {
  const r = state.timeline, chart = $('timeline-chart');
  chart.replaceChildren();
  $('timeline-legend').replaceChildren();
  if (!r) return;
  const series = r.series || [];
  const n = series.reduce((m, s) => Math.max(m, (s.counts || []).length), 0);
  const width = chartWidth() || 1000, height = 90;
  chart.setAttribute('viewBox', `0 0 ${width} ${height}`);
  const totals = new Array(n).fill(0);
  for (const s of series) (s.counts || []).forEach((c, i) => { totals[i] += Number(c); });
  const max = Math.max(1, ...totals);
  const w = width / Math.max(1, n);
  const base = new Array(n).fill(0);
  series.forEach((s, k) => {
    const fill = palette[k % palette.length];
    (s.counts || []).forEach((c, i) => {
      const h = Number(c) / max * (height - 4);
      if (h <= 0) return;
      base[i] += h;
      chart.appendChild(svgElement('rect', { x: i * w, y: height - base[i],
                                             width: Math.max(1, w - 1), height: h, fill,
                                             class: 'bar' }));
    });
    if ($('timeline-group').value) {
      const item = document.createElement('span');
      const swatch = document.createElement('i');
      swatch.style.background = fill;
      item.append(swatch, (s.other ? 'other' : (s.value || '(none)')) + ` ${fmt(s.total)}`);
      $('timeline-legend').appendChild(item);
    }
  });
  const step = Number(r.step_ms), from = Number(r.from_ms);
  $('timeline-details').textContent = `${fmt(r.total_samples || 0)} samples, ` +
      `${step >= 60000 ? step / 60000 + ' min' : step / 1000 + ' s'} intervals`;
  chart.dataset.intervals = n;
  chart.dataset.fromMs = from;
  chart.dataset.stepMs = step;
}

// The interval boundary nearest to x (pixels from the chart's left edge).
function timelineTimeAt(x) {
  const chart = $('timeline-chart');
  const n = Number(chart.dataset.intervals), step = Number(chart.dataset.stepMs);
  const i = Math.round(Math.min(Math.max(x / chartWidth(), 0), 1) * n);
  return Number(chart.dataset.fromMs) + i * step;
}

$('timeline-chart').addEventListener('mousedown', (e) => {
  if (!state.timeline) return;
  const chart = $('timeline-chart'), left = chart.getBoundingClientRect().left;
  const start = e.clientX - left;
  const box = svgElement('rect', { class: 'selection', x: start, y: 0, width: 0, height: 90 });
  chart.appendChild(box);
  const move = (m) => {
    const x = Math.min(Math.max(m.clientX - left, 0), chartWidth());
    box.setAttribute('x', Math.min(start, x));
    box.setAttribute('width', Math.abs(x - start));
  };
  const up = (m) => {
    window.removeEventListener('mousemove', move);
    window.removeEventListener('mouseup', up);
    const a = timelineTimeAt(start), b = timelineTimeAt(m.clientX - left);
    if (a === b) { box.remove(); return; }
    setCustomRange(Math.min(a, b), Math.max(a, b));
    refresh();
  };
  window.addEventListener('mousemove', move);
  window.addEventListener('mouseup', up);
  e.preventDefault();
});
$('timeline-chart').addEventListener('mousemove', (e) => {
  const r = state.timeline;
  if (!r || !r.series) return;
  const chart = $('timeline-chart');
  const n = Number(chart.dataset.intervals);
  const i = Math.floor((e.clientX - chart.getBoundingClientRect().left) / chartWidth() * n);
  if (i < 0 || i >= n) return;
  const at = new Date(Number(r.from_ms) + i * Number(r.step_ms)).toLocaleString();
  const sum = r.series.reduce((t, s) => t + Number((s.counts || [])[i] || 0), 0);
  $('timeline-details').textContent = `${at}: ${fmt(sum)} samples`;
});
$('timeline-group').addEventListener('change', () => {
  refresh();
});
