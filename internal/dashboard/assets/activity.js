// apiary's dashboard: the overview's activity sections, the recent
// requests and each node's load over the last hour, and the models'
// Unload. Loaded before app.js, whose helpers (h, chart, call,
// confirmAction, …) these call when the page draws.
'use strict';

// requestsSection lists the recent requests ("request/SEQ" items), the
// newest first.
function requestsSection() {
  const reqs = of('request/').sort((a, b) => b.seq - a.seq);
  if (!reqs.length) return h('p', { class: 'muted', id: 'requests-none', text: 'No request yet: they are listed here as they end.' });
  const opt = (v, f) => (v === undefined || v === null ? '' : f ? f(v) : String(v));
  return h('div', {}, cacheSummary(reqs), h('div', { class: 'scroll tall' }, h('table', { id: 'requests' },
    h('thead', {}, h('tr', {}, ['time', 'model', 'worker', 'endpoint', 'status', 'prompt', 'completion', 'cached', 'first token', 'tok/s', 'total', 'route'].map((t, i) =>
      h('th', { class: (i === 3 || i >= 10 ? 'hide-narrow' : null), text: t })))),
    h('tbody', {}, reqs.map(r => h('tr', { 'data-request': r.seq, 'data-status': r.status, 'data-model': r.model, 'data-route': r.route || '' },
      h('td', { title: r.at, text: new Date(r.at).toLocaleTimeString() }),
      h('td', { text: r.model }),
      h('td', {}, r.worker ? h('a', { class: 'mono', href: '#/worker/' + r.worker, text: r.worker }) : '–'),
      h('td', { class: 'hide-narrow mono', text: r.endpoint + (r.stream ? ' (stream)' : '') }),
      h('td', { class: 'num', text: r.status }),
      h('td', { class: 'num', 'data-col': 'prompt', text: opt(r.prompt_tokens) }),
      h('td', { class: 'num', 'data-col': 'completion', text: opt(r.completion_tokens) }),
      h('td', { class: 'num', 'data-col': 'cached', text: opt(r.cached_tokens) }),
      h('td', { class: 'num', 'data-col': 'ttft', text: opt(r.ttft_ms, v => Math.round(v) + ' ms') }),
      h('td', { class: 'num', 'data-col': 'tps', text: opt(r.tokens_per_s, v => v.toFixed(1)) }),
      h('td', { class: 'num hide-narrow', text: Math.round(r.duration_ms) + ' ms' }),
      h('td', { class: 'hide-narrow', 'data-col': 'route', text: r.route || '' })))))));
}

// cacheSummary is each model's prompt cache over the listed requests: the
// share of their prompt tokens the workers' caches held, and how many of
// the prefix routes found a worker holding the request's prefix (the
// queen's --routing prefix; the same figures, over the queen's life, are
// apiary_queen_cached_prompt_tokens_total over apiary_queen_prompt_tokens_total
// and apiary_queen_prefix_routes_total in /metrics).
function cacheSummary(reqs) {
  const by = {};
  for (const r of reqs) {
    const m = by[r.model] || (by[r.model] = { n: 0, prompt: 0, cached: 0, hits: 0, routes: 0 });
    m.n++;
    if (r.prompt_tokens) { m.prompt += r.prompt_tokens; m.cached += r.cached_tokens || 0; }
    if (r.route === 'prefix hit' || r.route === 'prefix miss') { m.routes++; if (r.route === 'prefix hit') m.hits++; }
  }
  const pct = (a, b) => (b ? Math.round(100 * a / b) + ' %' : '–');
  return h('table', { id: 'cache-summary' },
    h('thead', {}, h('tr', {}, ['model', 'requests', 'prompt tokens', 'cached', 'prefix routes that hit'].map(t => h('th', { text: t })))),
    h('tbody', {}, Object.keys(by).sort().map(name => {
      const m = by[name];
      return h('tr', { 'data-model': name },
        h('td', { text: name }), h('td', { class: 'num', 'data-col': 'requests', text: m.n }),
        h('td', { class: 'num', 'data-col': 'prompt', text: m.prompt }),
        h('td', { class: 'num', 'data-col': 'cached', title: m.cached + ' of ' + m.prompt + ' prompt tokens', text: pct(m.cached, m.prompt) }),
        h('td', { class: 'num', 'data-col': 'hits', text: m.routes ? m.hits + ' of ' + m.routes + ' (' + pct(m.hits, m.routes) + ')' : '–' }));
    })));
}

// nodesSection draws each pool's node ("node/POOL" items): CPU, memory,
// and each device's memory and utilisation, over the last hour.
function nodesSection() {
  const nodes = of('node/').sort((a, b) => a.pool.localeCompare(b.pool));
  if (!nodes.length) return h('p', { class: 'muted', id: 'nodes-none', text: 'No node has reported its load yet (hives send it every 10 s).' });
  const gib = v => (v === null || v === undefined ? null : v / (1 << 30));
  return h('div', { id: 'nodes' }, nodes.map(n => [
    h('h3', { class: 'muted', text: n.pool + (n.node_id ? ' · node ' + n.node_id : '') }),
    h('div', { class: 'charts', 'data-node': n.pool },
      chart('CPU', n.cpu_percent, '%', 0, 100, 'cpu'),
      chart('memory used' + (n.mem_total_bytes ? ' of ' + bytes(n.mem_total_bytes) : ''), (n.mem_used_bytes || []).map(gib), 'GiB', 1, gib(n.mem_total_bytes), 'mem'),
      (n.gpus || []).map(g => [
        chart((g.name || 'device ' + g.id) + ' memory of ' + bytes(g.total_bytes), (g.used_bytes || []).map(gib), 'GiB', 1, gib(g.total_bytes), 'gpu-mem-' + g.id),
        (g.util_percent || []).some(v => v !== null) ? chart((g.name || 'device ' + g.id) + ' utilisation', g.util_percent, '%', 0, 100, 'gpu-util-' + g.id) : null]))]));
}

// unloadModel asks for a reason (a default is filled in) and unloads the
// model: its workers drain and stop; a refusal (pinned, min_workers)
// stays in the dialog.
function unloadModel(name) {
  confirmAction('Unload ' + name + '?', 'Its workers finish what they serve, then stop; the next request loads it again.', reason =>
    call('POST', '/api/admin/models/' + encodeURIComponent(name) + '/unload', { reason }), 'unloaded from the dashboard');
}
