// The sweep explorer's script (vta.sweep.html): DATA is the page's data, Plotly the embedded plotly.js.
const PALETTE = ['#1f77b4','#ff7f0e','#2ca02c','#d62728','#9467bd','#8c564b','#e377c2','#7f7f7f','#bcbd22',
                 '#17becf','#393b79','#637939','#8c6d31','#843c39','#7b4173'];
const params = Object.keys(DATA.params);
const state = {model: DATA.models[DATA.models.length - 1], metric: Object.keys(DATA.metrics)[0],
               colour: params.length ? params[0] : '', filters: {}};
params.forEach(p => state.filters[p] = new Set(DATA.params[p]));

function fmt(v) {
  if (v === null || v === undefined) return '-';
  if (typeof v !== 'number') return String(v);
  if (Number.isInteger(v)) return v.toLocaleString('en-US');
  const a = Math.abs(v);
  if (a >= 1000) return v.toLocaleString('en-US', {maximumFractionDigits: 0});
  return Number(v.toPrecision(4)).toString();
}
function esc(s) { return String(s).replace(/[&<>"]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c])); }

function controls() {
  const el = document.getElementById('controls');
  let h = '<p>model <select id="c-model">' + DATA.models.map(m => `<option${m === state.model ? ' selected' : ''}>${esc(m)}</option>`).join('') + '</select> ';
  h += 'objective <select id="c-metric">' + Object.entries(DATA.metrics).map(([k, m]) => `<option value="${k}"${k === state.metric ? ' selected' : ''}>${esc(m.label)}</option>`).join('') + '</select> ';
  h += 'colour by <select id="c-colour">' + params.map(p => `<option${p === state.colour ? ' selected' : ''}>${esc(p)}</option>`).join('') + '</select></p>';
  h += '<p>show: ' + params.map(p => `<span class="filter"><b>${esc(p)}</b> ` + DATA.params[p].map(v =>
      `<label><input type="checkbox" data-p="${esc(p)}" value="${esc(v)}" checked>${esc(v)}</label>`).join(' ') + '</span>').join(' &nbsp; ') + '</p>';
  el.innerHTML = h;
  document.getElementById('c-model').onchange = e => { state.model = e.target.value; draw(); };
  document.getElementById('c-metric').onchange = e => { state.metric = e.target.value; draw(); };
  const c = document.getElementById('c-colour'); if (c) c.onchange = e => { state.colour = e.target.value; draw(); };
  el.querySelectorAll('input[type=checkbox]').forEach(box => box.onchange = e => {
    const s = state.filters[e.target.dataset.p];
    if (e.target.checked) s.add(e.target.value); else s.delete(e.target.value);
    draw();
  });
}

function shown() {
  return DATA.points.filter(p => p.model === state.model && params.every(k => state.filters[k].has(p.params[k])));
}

function frontier(pts, x, y, maximize) {
  const sign = maximize ? -1 : 1;
  const ok = pts.filter(p => p.figures[x] != null && p.figures[y] != null);
  ok.sort((a, b) => (a.figures[x] - b.figures[x]) || sign * (a.figures[y] - b.figures[y]));
  const out = []; let best = null;
  for (const p of ok) { const v = sign * p.figures[y]; if (best === null || v < best) { out.push(p); best = v; } }
  return out;
}

function axisType(values) {
  const v = values.filter(x => x > 0);
  if (!v.length) return 'linear';
  return Math.max(...v) / Math.min(...v) > 20 ? 'log' : 'linear';
}

function hover(p, k, n) {
  let h = `<b>${esc(p.design)}</b><br>model ${esc(p.model)}`;
  if (n > 1) h += `<br>${k + 1} of ${n} designs with these same figures (spread along the area axis)`;
  for (const [name, v] of Object.entries(p.params)) h += `<br>${esc(name)} = ${esc(v)}`;
  for (const [col, label] of Object.entries(DATA.figures)) if (p.figures[col] != null) h += `<br>${esc(label)}: ${fmt(p.figures[col])}`;
  return h;
}

function draw() {
  const m = DATA.metrics[state.metric], x = DATA.area.column, y = m.column;
  const pts = shown().filter(p => p.figures[x] != null && p.figures[y] != null);
  const groups = {};
  pts.forEach(p => { const key = p.figures[x] + '|' + p.figures[y]; (groups[key] = groups[key] || []).push(p); });
  const pos = new Map();
  Object.values(groups).forEach(g => g.forEach((p, k) => pos.set(p, {k: k, n: g.length,
      x: p.figures[x] * (1 + 0.012 * (k - (g.length - 1) / 2))})));
  const traces = [];
  const values = state.colour ? DATA.params[state.colour] : [''];
  values.forEach((v, i) => {
    const sel = pts.filter(p => !state.colour || p.params[state.colour] === v);
    if (!sel.length) return;
    traces.push({type: 'scatter', mode: 'markers', name: state.colour ? `${state.colour} = ${v}` : 'designs',
      x: sel.map(p => pos.get(p).x), y: sel.map(p => p.figures[y]),
      marker: {size: 9, color: PALETTE[i % PALETTE.length], line: {width: 0.5, color: '#333'}},
      text: sel.map(p => hover(p, pos.get(p).k, pos.get(p).n)), hoverinfo: 'text', customdata: sel.map(p => DATA.points.indexOf(p))});
  });
  const front = frontier(pts, x, y, m.maximize);
  if (state.selected && pts.includes(state.selected)) {  // the clicked design, ringed
    const q = state.selected;
    traces.push({type: 'scatter', mode: 'markers', name: 'clicked: ' + q.design, x: [pos.get(q).x],
      y: [q.figures[y]], marker: {size: 20, symbol: 'circle-open', color: '#000', line: {width: 2.5}},
      hoverinfo: 'skip'});
  }
  traces.push({type: 'scatter', mode: 'lines+markers', name: `Pareto front (${front.length} of ${pts.length})`,
    x: front.map(p => p.figures[x]), y: front.map(p => p.figures[y]), line: {shape: 'hv', color: '#d62728', width: 1.5},
    marker: {size: 13, color: 'rgba(0,0,0,0)', line: {width: 2, color: '#d62728'}}, hoverinfo: 'skip'});
  const layout = {title: {text: `${m.label} against area: ${state.model}`}, hovermode: 'closest',
    xaxis: {title: {text: DATA.area.label}, type: axisType(pts.map(p => p.figures[x]))},
    yaxis: {title: {text: m.label}, type: axisType(pts.map(p => p.figures[y]))}, legend: {orientation: 'v'},
    margin: {t: 50}};
  Plotly.react('fig-pareto', traces, layout, {displaylogo: false, responsive: true});
  const coincident = Object.values(groups).filter(g => g.length > 1).length;
  document.getElementById('shown').textContent = `${pts.length} designs shown` + (coincident ?
      `; ${coincident} groups of designs share identical figures (spread slightly along the area axis; the hover counts them)` : '') +
      '. Axes are logarithmic only where the values span more than 20x.';
  designsTable(pts, front);
}

function designsTable(pts, front) {
  const onFront = new Set(front);
  const cols = Object.keys(DATA.figures).filter(c => pts.some(p => p.figures[c] != null));
  let h = '<table id="designs-table"><thead><tr><th onclick="sortTable(this)">design</th><th onclick="sortTable(this)">front</th>' +
    params.map(p => `<th onclick="sortTable(this)">${esc(p)}</th>`).join('') +
    cols.map(c => `<th onclick="sortTable(this)">${esc(DATA.figures[c])}</th>`).join('') + '</tr></thead><tbody>';
  for (const p of pts) {
    h += `<tr><td>${esc(p.design)}</td><td>${onFront.has(p) ? 'yes' : ''}</td>` + params.map(k => `<td>${esc(p.params[k])}</td>`).join('') +
      cols.map(c => { const v = p.figures[c]; return typeof v === 'number' ? `<td class="num" data-v="${v}">${fmt(v)}</td>` : `<td>${esc(fmt(v))}</td>`; }).join('') + '</tr>';
  }
  document.getElementById('designs').innerHTML = h + '</tbody></table>';
}

function detail(p) {
  if (state.selected !== p) { state.selected = p; draw(); }
  let h = `<p><b>${esc(p.design)}</b> on ${esc(p.model)}</p><table><tbody>` +
    Object.entries(p.params).map(([k, v]) => `<tr><td>${esc(k)}</td><td>${esc(v)}</td></tr>`).join('') +
    Object.entries(DATA.figures).filter(([c]) => p.figures[c] != null).map(([c, l]) => `<tr><td>${esc(l)}</td><td class="num">${fmt(p.figures[c])}</td></tr>`).join('') +
    '</tbody></table>';
  if (!p.layers.length) {
    h += `<p class="note">${p.model === DATA.suite ? 'The per-layer breakdown is per model: choose one model above.' : 'No per-layer breakdown was recorded for this point (a database from before it was).'}</p>`;
    document.getElementById('detail').innerHTML = h;
    return;
  }
  h += '<div id="fig-detail" style="height:380px"></div><table id="detail-layers"><thead><tr>' +
    ['layer', 'op', 'where', 'MACs', 'cycles', 'bound', 'CPU us (estimate)', 'energy uJ'].map(c => `<th onclick="sortTable(this)">${c}</th>`).join('') + '</tr></thead><tbody>';
  for (const l of p.layers) {
    h += `<tr><td>${esc(l.layer)}</td><td>${esc(l.op)}</td><td>${l.where === 'accel' ? 'accelerator' : 'CPU'}</td>` +
      [l.macs, l.cycles, l.bound, l.cpu_us, l.energy_uj].map(v => typeof v === 'number' ? `<td class="num" data-v="${v}">${fmt(v)}</td>` : `<td>${esc(v == null ? '-' : v)}</td>`).join('') + '</tr>';
  }
  document.getElementById('detail').innerHTML = h + '</tbody></table>';
  const acc = p.layers.filter(l => l.where === 'accel'), cpu = p.layers.filter(l => l.where !== 'accel');
  const clock = p.figures.clock_mhz || null;
  Plotly.newPlot('fig-detail', [
    {type: 'bar', name: 'accelerator: cycles', x: acc.map(l => l.layer), y: acc.map(l => l.cycles), marker: {color: '#1f77b4'},
     text: acc.map(l => `bound by ${l.bound}`), textposition: 'none', hovertemplate: '%{x}: %{y:,} cycles, %{text}<extra></extra>'},
    {type: 'bar', name: 'CPU: estimated us', x: cpu.map(l => l.layer), y: cpu.map(l => l.cpu_us), yaxis: 'y2', marker: {color: '#7f7f7f'},
     hovertemplate: '%{x}: %{y:.3g} us on the CPU (the partitioner\'s estimate)<extra></extra>'}],
    {title: {text: 'per layer: accelerator cycles (cycle model or tsim) and CPU time (estimate)'}, barmode: 'group',
     xaxis: {categoryorder: 'array', categoryarray: p.layers.map(l => l.layer), tickangle: -60},
     yaxis: {title: {text: 'cycles'}}, yaxis2: {title: {text: 'CPU us'}, overlaying: 'y', side: 'right'},
     margin: {b: 110}, legend: {orientation: 'h', y: 1.12}}, {displaylogo: false, responsive: true});
}

controls();
draw();
const linked = new URLSearchParams(location.hash.slice(1));  // #design=NAME&model=MODEL opens that design's detail
if (linked.get('design')) {
  const p = DATA.points.find(q => q.design === linked.get('design') && (!linked.get('model') || q.model === linked.get('model')));
  if (p) {
    state.model = p.model;
    controls();
    draw();
    detail(p);
  }
}
document.getElementById('fig-pareto').on('plotly_click', ev => {
  const pt = ev.points[0];
  if (pt && pt.customdata !== undefined) detail(DATA.points[pt.customdata]);
});
