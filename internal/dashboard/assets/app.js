// apiary's dashboard: one page, no library. It follows the queen's state
// through /api/admin/ui/events (server-sent events read with fetch, so
// that the admin token goes in the Authorization header, never in a URL)
// and calls the queen's admin endpoints for the rest.
'use strict';

// deviceOf names a worker's device: "cpu 0", "cuda 1", or for a worker
// split over several GPUs all of them ("cuda 0,1"); a worker that is a
// Kubernetes Pod adds its node ("cpu 3 on node-1").
function deviceOf(r) {
  const on = r.node ? ' on ' + r.node : '';
  if (r.gpu_devices && r.gpu_devices.length > 1) return (r.device_kind || 'gpu') + ' ' + r.gpu_devices.join(',') + on;
  return r.gpu_device === undefined || r.gpu_device === null ? '–' : (r.device_kind || 'device') + ' ' + r.gpu_device + on;
}

const KEY_ADMIN = 'apiary.adminToken';
const KEY_API = 'apiary.apiToken';

const state = {
  items: new Map(), // the queen's snapshot: "pool/ID", "worker/ID", "model/NAME", "stats", "queen", "beats"
  beatsCame: 0, // performance.now() when the "beats" item last came
  seq: 0,
  stream: null, // AbortController of the event stream
  signedOut: false,
  view: null, // the page shown: {name, arg, update}
};

// ---- small helpers ----

function h(tag, props, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k.startsWith('data-') || k.startsWith('aria-') || k === 'href' || k === 'type' || k === 'for' || k === 'name' || k === 'placeholder' || k === 'autocomplete' || k === 'id' || k === 'title' || k === 'role' || k === 'list') el.setAttribute(k, v === true ? '' : v);
    else el[k] = v;
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === undefined || kid === null || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

const svgNS = 'http://www.w3.org/2000/svg';
function svg(tag, attrs, ...kids) {
  const el = document.createElementNS(svgNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  for (const kid of kids) el.append(kid);
  return el;
}

function bytes(n) {
  if (n === undefined || n === null) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n : n.toFixed(n < 10 ? 1 : 0)) + ' ' + units[i];
}

function ago(t) {
  if (!t) return '–';
  return agoSeconds(Math.round((Date.now() - new Date(t).getTime()) / 1000));
}

function agoSeconds(s) {
  if (s < 0) return 'now';
  if (s < 60) return s + 's ago';
  if (s < 3600) return Math.round(s / 60) + 'm ago';
  if (s < 86400) return Math.round(s / 3600) + 'h ago';
  return Math.round(s / 86400) + 'd ago';
}

// beatAgo is how long ago a pool's or a worker's (kind 'pools' or
// 'workers') last heartbeat was, by the queen's clock: the "beats" item's
// time minus the beat, plus the time since the item came (the browser's
// clock may be off; `apiary pools ls` floors to the second as this does).
// Without a beat there, t by this browser's clock.
function beatAgo(kind, id, t) {
  const b = state.items.get('beats');
  const at = b && b[kind] && b[kind][id];
  if (!at) return ago(t);
  return agoSeconds(Math.max(0, Math.floor((Date.parse(b.at) - Date.parse(at) + performance.now() - state.beatsCame) / 1000)));
}

// refreshBeats rewrites the heartbeat ages on the page, in place.
function refreshBeats() {
  for (const el of document.querySelectorAll('[data-beat-kind]')) {
    el.textContent = (el.dataset.beatPrefix || '') + beatAgo(el.dataset.beatKind, el.dataset.beatId, el.dataset.beatAt);
  }
}
setInterval(refreshBeats, 1000);

function time(t) { return t ? new Date(t).toLocaleString() : '–'; }

function num(v, digits) {
  if (v === null || v === undefined || Number.isNaN(v)) return '–';
  return v.toFixed(digits === undefined ? 1 : digits);
}

function badge(s) { return h('span', { class: 'badge', 'data-s': s, text: s }); }

function of(prefix) {
  const out = [];
  for (const [k, v] of state.items) if (k.startsWith(prefix)) out.push(v);
  return out;
}

// ---- the queen's API ----

function authHeaders(token) {
  const t = token === undefined ? sessionStorage.getItem(KEY_ADMIN) : token;
  return t ? { Authorization: 'Bearer ' + t } : {};
}

class APIError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

async function errorOf(resp) {
  let code = '', msg = resp.status + ' ' + resp.statusText;
  try {
    const body = await resp.json();
    if (body && body.error) { code = body.error.code || ''; msg = body.error.message || msg; }
  } catch (e) { /* not JSON */ }
  return new APIError(resp.status, code, msg);
}

async function call(method, path, body) {
  const headers = authHeaders();
  const init = { method, headers, cache: 'no-store' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  if (resp.status === 401) { signIn(); throw await errorOf(resp); }
  if (!resp.ok) throw await errorOf(resp);
  return resp.status === 204 ? null : resp.json();
}

// readSSE calls onEvent with the data of each event of a fetch response,
// until the body ends or the signal aborts.
async function readSSE(resp, onEvent) {
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const data = ev.split('\n').filter(l => l.startsWith('data:')).map(l => l.slice(5).replace(/^ /, '')).join('\n');
      if (data) onEvent(data);
    }
  }
}

// ---- the live state ----

function setConn(s, text) {
  const el = document.getElementById('conn');
  el.dataset.state = s;
  el.textContent = text || s;
}

async function follow() {
  if (state.stream) state.stream.abort();
  const ctl = new AbortController();
  state.stream = ctl;
  let wait = 500;
  while (!ctl.signal.aborted) {
    try {
      setConn('connecting');
      const resp = await fetch('/api/admin/ui/events', { headers: authHeaders(), signal: ctl.signal, cache: 'no-store' });
      if (resp.status === 401) { signIn(); return; }
      if (!resp.ok) throw await errorOf(resp);
      wait = 500;
      await readSSE(resp, data => apply(JSON.parse(data)));
    } catch (e) {
      if (ctl.signal.aborted) return;
      setConn('reconnecting', 'reconnecting: ' + e.message);
    }
    if (ctl.signal.aborted) return;
    setConn('reconnecting');
    await new Promise(r => setTimeout(r, wait));
    wait = Math.min(wait * 2, 5000);
  }
}

let pending = false;
function apply(msg) {
  if (msg.full) state.items.clear();
  for (const [k, v] of Object.entries(msg.set || {})) state.items.set(k, v);
  for (const k of msg.del || []) state.items.delete(k);
  state.seq = msg.seq;
  setConn('live');
  document.body.dataset.seq = String(msg.seq);
  const set = Object.keys(msg.set || {});
  if (set.includes('beats')) state.beatsCame = performance.now();
  if (!msg.full && set.length === 1 && set[0] === 'beats' && !(msg.del || []).length) {
    refreshBeats(); // only the heartbeats' times changed
    return;
  }
  if (!pending) {
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      if (state.view && state.view.update) state.view.update();
      // When the first state was drawn, in ms since the page was asked for.
      if (!document.body.dataset.firstRender) document.body.dataset.firstRender = String(Math.round(performance.now()));
    });
  }
}

// ---- sign-in ----

function signIn(message) {
  if (state.stream) { state.stream.abort(); state.stream = null; }
  state.items.clear();
  state.signedOut = true;
  state.view = null;
  setConn('signed-out', 'signed out');
  document.getElementById('signout').hidden = true;
  const admin = h('input', { type: 'password', id: 'admin-token', autocomplete: 'off', placeholder: 'APIARY_ADMIN_TOKEN' });
  const apiTok = h('input', { type: 'password', id: 'api-token', autocomplete: 'off', placeholder: 'APIARY_API_TOKEN (optional)' });
  const err = h('div', { class: 'error', id: 'signin-error', text: message || '' });
  const form = h('form', { class: 'login', id: 'signin', onsubmit: async ev => {
    ev.preventDefault();
    err.textContent = '';
    const t = admin.value.trim();
    try {
      const resp = await fetch('/api/admin/ui/snapshot', { headers: authHeaders(t), cache: 'no-store' });
      if (!resp.ok) throw await errorOf(resp);
    } catch (e) { err.textContent = e.message; return; }
    sessionStorage.setItem(KEY_ADMIN, t);
    if (apiTok.value.trim()) sessionStorage.setItem(KEY_API, apiTok.value.trim());
    state.signedOut = false;
    start();
  } },
  h('b', { text: 'This queen needs its admin token' }),
  h('label', {}, 'Admin token', admin),
  h('label', {}, 'API token, for the playground (optional)', apiTok),
  h('span', { class: 'muted', text: 'Kept in this browser tab only (sessionStorage), sent as the bearer token.' }),
  h('button', { class: 'primary', type: 'submit', id: 'signin-submit', text: 'Sign in' }),
  err);
  document.getElementById('main').replaceChildren(form);
  admin.focus();
}

// ---- confirmation ----

// confirmAction asks before an action; with a reason (the admin API
// requires one for the audit log) the action gets what was typed.
function confirmAction(title, detail, run, defaultReason) {
  const modal = document.getElementById('modal');
  const reason = h('input', { id: 'confirm-reason', placeholder: 'reason (for the audit log)', autocomplete: 'off', value: defaultReason || '' });
  const err = h('div', { class: 'error', id: 'confirm-error' });
  const ok = h('button', { class: 'danger', type: 'submit', id: 'confirm-ok', text: 'Confirm' });
  const close = () => { modal.hidden = true; modal.replaceChildren(); };
  const form = h('form', { class: 'box', onsubmit: async ev => {
    ev.preventDefault();
    if (!reason.value.trim()) { err.textContent = 'A reason is required.'; return; }
    ok.disabled = true;
    try { await run(reason.value.trim()); close(); } catch (e) { err.textContent = e.message; ok.disabled = false; }
  } },
  h('b', { text: title }), h('span', { class: 'muted', text: detail }), reason, err,
  h('div', { class: 'buttons' }, h('button', { type: 'button', id: 'confirm-cancel', text: 'Cancel', onclick: close }), ok));
  modal.replaceChildren(form);
  modal.hidden = false;
  reason.focus();
}

function stopWorker(id) {
  confirmAction('Stop worker ' + id + '?', 'It drains (finishes its requests), then stops.', reason =>
    call('POST', '/api/admin/workers', { action: 'stop', lifecycle_id: id, drain: true, reason }));
}

function startWorker(model, pool) {
  confirmAction('Start a worker of ' + model + '?', pool ? 'On pool ' + pool + '.' : 'The queen places it.', reason =>
    call('POST', '/api/admin/workers', { action: 'start', model, pool_id: pool || undefined, reason }));
}

function drainPool(id, drain) {
  confirmAction((drain ? 'Drain' : 'Undrain') + ' pool ' + id + '?',
    drain ? 'Nothing new is placed there; its running workers serve on until they stop or idle out.' : 'It takes new workers again.',
    reason => call('POST', '/v2/pools/' + encodeURIComponent(id) + (drain ? '/drain' : '/undrain'), { reason }));
}

// ---- overview ----

const STATES = ['STARTING', 'RUNNING', 'DRAINING', 'STOPPED', 'FAILED'];

// chart draws values as a line; top, when given, is the top of its
// scale (else the largest value), graph names it (data-graph).
function chart(title, values, unit, digits, top, graph) {
  const vals = values || [];
  const nums = vals.filter(v => v !== null && v !== undefined);
  const last = nums.length ? nums[nums.length - 1] : null;
  const maxV = top || Math.max(1e-9, ...nums);
  const n = Math.max(vals.length, 2);
  const pts = [];
  vals.forEach((v, i) => { if (v !== null && v !== undefined) pts.push((i / (n - 1) * 100).toFixed(2) + ',' + (38 - v / maxV * 36).toFixed(2)); });
  if (pts.length === 1) pts.push('100,' + pts[0].split(',')[1]); // one sample: a level line
  return h('div', { class: 'chart', 'data-graph': graph, 'data-points': String(nums.length) },
    h('div', { class: 't' }, h('span', { text: title }), h('b', { text: last === null ? '–' : num(last, digits) + ' ' + unit })),
    svg('svg', { viewBox: '0 0 100 40', preserveAspectRatio: 'none', role: 'img', 'aria-label': title },
      svg('polyline', { points: pts.join(' ') })));
}

function sum(arr) { return (arr || []).reduce((a, b) => a + (b || 0), 0); }

function overview() {
  const main = document.getElementById('main');
  const update = () => {
    const queen = state.items.get('queen') || {};
    const pools = of('pool/').sort((a, b) => a.id.localeCompare(b.id));
    const workers = of('worker/').sort((a, b) => (b.created_at || '').localeCompare(a.created_at || ''));
    const models = of('model/').sort((a, b) => a.name.localeCompare(b.name));
    const stats = state.items.get('stats') || { models: {} };
    const counts = Object.fromEntries(STATES.map(s => [s, 0]));
    for (const w of workers) counts[w.status] = (counts[w.status] || 0) + 1;
    const queued = sum(models.map(m => m.queued));
    const lastOf = key => sum(Object.values(stats.models || {}).map(s => { const a = s[key] || []; return a.length ? a[a.length - 1] : 0; }));

    const tiles = h('div', { class: 'tiles' },
      h('div', { class: 'tile' }, h('div', { class: 'v', id: 'tile-pools', text: pools.filter(p => p.status === 'healthy').length + ' / ' + pools.length }), h('div', { class: 'k', text: 'pools healthy' })),
      STATES.map(s => h('div', { class: 'tile' }, h('div', { class: 'v', 'data-count': s, text: counts[s] }), h('div', { class: 'k', text: 'workers ' + s.toLowerCase() + (s === 'STOPPED' || s === 'FAILED' ? ' (recent)' : '') }))),
      h('div', { class: 'tile' }, h('div', { class: 'v', text: queued }), h('div', { class: 'k', text: 'requests queued' })),
      h('div', { class: 'tile' }, h('div', { class: 'v', text: num(lastOf('requests_per_s'), 2) }), h('div', { class: 'k', text: 'requests/s (last ' + (stats.step_s || 5) + 's)' })),
      h('div', { class: 'tile' }, h('div', { class: 'v', text: num(lastOf('tokens_per_s'), 1) }), h('div', { class: 'k', text: 'tokens/s (streamed)' })));

    const poolCards = pools.length ? h('div', { class: 'cards' }, pools.map(p => h('div', { class: 'card', 'data-pool': p.id, 'data-status': p.status },
      h('div', { class: 'head' }, h('b', { text: p.id }), badge(p.status),
        h('span', { class: 'muted' }, 'node ' + (p.node_id || '–') + ' · ',
          h('span', { 'data-beat-kind': 'pools', 'data-beat-id': p.id, 'data-beat-at': p.last_heartbeat_at || '', 'data-beat-prefix': 'beat ', text: 'beat ' + beatAgo('pools', p.id, p.last_heartbeat_at) })),
        p.status === 'offline' ? null : (p.drained
          ? h('button', { type: 'button', 'data-action': 'undrain', onclick: () => drainPool(p.id, false), text: 'Undrain' })
          : h('button', { type: 'button', class: 'danger', 'data-action': 'drain', onclick: () => drainPool(p.id, true), text: 'Drain' }))),
      (p.devices || []).map(d => {
        const used = d.total_vram_bytes - d.free_vram_bytes;
        const pct = d.total_vram_bytes ? Math.min(100, used / d.total_vram_bytes * 100) : 0;
        const bar = h('span');
        bar.style.width = pct.toFixed(1) + '%';
        return h('div', { class: 'dev', 'data-device': d.id },
          h('div', { class: 'line' }, h('span', {}, (d.kind || '') + ' ' + d.id + ' ', h('span', { class: 'muted', text: d.name || '' })),
            badge(d.usable ? 'usable' : 'unusable')),
          h('div', { class: 'bar', title: pct.toFixed(0) + '% used' }, bar),
          h('div', { class: 'line muted' }, h('span', { text: bytes(used) + ' used' }), h('span', { text: bytes(d.free_vram_bytes) + ' free of ' + bytes(d.total_vram_bytes) })),
          d.why ? h('div', { class: 'line muted', text: d.why }) : null,
          (d.workers || []).length ? h('div', { class: 'line muted', text: 'workers: ' + d.workers.join(', ') }) : null);
      }),
      h('div', { class: 'line', 'data-loaded': '' }, h('span', { class: 'muted', text: 'loaded' + (p.max_loaded ? ' (at most ' + p.max_loaded + ')' : '') + ': ' }),
        h('span', { text: (p.loaded || []).length ? p.loaded.map(l => l.model + ' ' + (l.last_used_at ? 'used ' + ago(l.last_used_at) : 'unused') + ' (' + l.status + ')').join(', ') : 'nothing' })),
      (p.evictions || []).length ? h('div', { class: 'line muted', 'data-evictions': '' },
        'evicted: ' + p.evictions.slice(0, 3).map(e => (e.model_name || e.model) + ' for ' + (e.for_name || e.for) + ' ' + ago(e.at)).join(', ')) : null))) : h('p', { class: 'muted', text: 'No pool has registered: start a hive that points here, e.g. apiary hive --queen ' + location.origin + ' (or apiary nodes add NAME --ssh HOST to have the queen start one over SSH).' });

    const workerTable = workers.length ? h('div', { class: 'scroll' }, h('table', { id: 'workers' },
      h('thead', {}, h('tr', {}, ['lifecycle id', 'model', 'pool', 'device', 'state', 'reason', 'memory', 'created', ''].map((t, i) => h('th', { class: i === 5 || i === 7 ? 'hide-narrow' : null, text: t })))),
      h('tbody', {}, workers.map(w => h('tr', { 'data-worker': w.id, 'data-status': w.status },
        h('td', {}, h('a', { class: 'mono', href: '#/worker/' + w.id, text: w.id })),
        h('td', { text: w.model_name ? w.model_name + ' (' + w.model_ref + ')' : w.model_ref }), h('td', { text: w.pool_id }),
        h('td', { 'data-col': 'device', text: deviceOf(w) }),
        h('td', {}, badge(w.status), w.strikes && w.strikes.degraded ? h('span', { class: 'muted', text: ' degraded' }) : null),
        h('td', { class: 'hide-narrow', text: w.reason || '' }),
        h('td', { class: 'num', text: w.vram_bytes ? bytes(w.vram_bytes) : '–' }),
        h('td', { class: 'hide-narrow', text: ago(w.created_at) }),
        h('td', {}, ['STARTING', 'RUNNING'].includes(w.status) ? h('button', { type: 'button', class: 'danger', 'data-action': 'stop', onclick: () => stopWorker(w.id), text: 'Stop' }) : null)))))) : h('p', { class: 'muted', text: 'No worker yet: a request, a replica setting or Start places one.' });

    const modelTable = models.length ? h('div', { class: 'scroll' }, h('table', { id: 'models' },
      h('thead', {}, h('tr', {}, ['model', 'aliases', 'runs on', 'workers', 'queued', 'waiting since', 'min/max', ''].map(t => h('th', { text: t })))),
      h('tbody', {}, models.map(m => h('tr', { 'data-model': m.name },
        h('td', {}, h('b', { text: m.name }), m.ref && m.ref !== m.name ? h('div', { class: 'muted mono', text: m.ref }) : null),
        h('td', { text: (m.aliases || []).join(', ') || '–' }),
        h('td', {}, (m.running_on || []).length ? m.running_on.join(', ') : h('span', { class: 'muted', text: 'nowhere' }),
          (m.available_on || []).length ? h('div', { class: 'muted', text: 'file on: ' + m.available_on.join(', ') }) : null),
        h('td', { text: Object.entries(m.workers || {}).map(([s, n]) => n + ' ' + s.toLowerCase()).join(', ') || '0' }),
        h('td', { class: 'num', 'data-queued': m.queued || 0, text: m.queued || 0 }),
        h('td', { text: m.oldest_wait ? ago(m.oldest_wait) : '–' }),
        h('td', { text: (m.min_workers === undefined ? '–' : m.min_workers) + ' / ' + (m.max_workers === undefined ? '–' : m.max_workers) }),
        h('td', {}, h('button', { type: 'button', 'data-action': 'start', onclick: () => startWorker(m.name), text: 'Start' }),
          (m.running_on || []).length ? [' ', h('button', { type: 'button', class: 'danger', 'data-action': 'unload', onclick: () => unloadModel(m.name), text: 'Unload' })] : null)))))) : h('p', { class: 'muted', text: 'No model known: no hive has listed one and the model config names none.' });

    const charts = Object.keys(stats.models || {}).sort().map(name => {
      const s = stats.models[name];
      return [h('h3', { class: 'muted', text: name }), h('div', { class: 'charts' },
        chart('requests/s', s.requests_per_s, '/s', 2), chart('tokens/s', s.tokens_per_s, '/s', 1),
        chart('time to first token', s.ttft_ms, 'ms', 0), chart('inter-token latency', s.itl_ms, 'ms', 1))];
    });

    main.replaceChildren(
      h('h2', { text: 'Cluster' + (queen.version ? ' · apiary ' + queen.version : '') }), tiles,
      h('h2', { text: 'Pools' }), poolCards,
      h('h2', { text: 'Workers' }), workerTable,
      h('h2', { text: 'Models' }), modelTable,
      h('h2', { text: 'Recent requests' }), requestsSection(),
      h('h2', { text: 'Nodes, last hour' }), nodesSection(),
      h('h2', { text: 'Last ' + Math.round((stats.step_s || 5) * (stats.buckets || 120) / 60) + ' minutes, per ' + (stats.step_s || 5) + ' s' }),
      charts.length ? h('div', { id: 'rates' }, charts) : h('p', { class: 'muted', text: 'No request yet.' }));
  };
  return { name: 'overview', update };
}

// ---- a worker ----

function worker(id) {
  const main = document.getElementById('main');
  const live = h('div', { id: 'worker-live' });
  const placement = h('div', { id: 'worker-placement', class: 'muted', text: 'reading the audit log…' });
  const history = h('div', { id: 'worker-history' });
  const log = h('pre', { class: 'log', id: 'worker-log', text: '' });
  const logState = h('span', { class: 'muted', id: 'worker-log-state', text: 'connecting…' });
  main.replaceChildren(h('p', {}, h('a', { href: '#/', text: '← overview' })), h('h2', { text: 'Worker ' + id }), live,
    h('h2', { text: 'Placement' }), placement, h('h2', { text: 'History' }), history,
    h('h2', {}, 'Log ', logState), log);

  let row = null, lastStatus = null;
  const logCtl = new AbortController();

  const showRow = r => {
    if (!r) return;
    row = r;
    const dl = h('dl', { class: 'kv', 'data-worker': r.id, 'data-status': r.status });
    const add = (k, v) => dl.append(h('dt', { text: k }), h('dd', {}, v));
    add('state', [badge(r.status), ' ', r.reason || '']);
    add('model', r.model_name ? r.model_name + ' (' + r.model_ref + ')' : r.model_ref);
    add('pool', r.pool_id + (r.worker_id ? ' · hive worker ' + r.worker_id : ''));
    add('device', deviceOf(r));
    if (r.pod) add('pod', r.pod);
    add('memory', r.vram_bytes ? bytes(r.vram_bytes) : '–');
    add('owner', r.owner || '–');
    add('pid', r.pid || '–');
    add('uri', r.uri || '–');
    add('created', time(r.created_at));
    add('started', time(r.started_at));
    add('ready', time(r.ready_at));
    add('stopped', time(r.stopped_at));
    add('exit code', r.exit_code === undefined || r.exit_code === null ? '–' : r.exit_code);
    add('last heartbeat', h('span', { 'data-beat-kind': 'workers', 'data-beat-id': r.id, 'data-beat-at': r.last_heartbeat_at || '', text: beatAgo('workers', r.id, r.last_heartbeat_at) }));
    if (r.strikes) add('strikes', r.strikes.failures + ' of ' + r.strikes.limit + (r.strikes.degraded ? ' (degraded)' : '') + (r.strikes.last_error ? ': ' + r.strikes.last_error : ''));
    const actions = h('div', {});
    if (['STARTING', 'RUNNING'].includes(r.status)) actions.append(h('button', { type: 'button', class: 'danger', 'data-action': 'stop', onclick: () => stopWorker(r.id), text: 'Stop' }));
    live.replaceChildren(dl, actions);
    if (r.status !== lastStatus) { lastStatus = r.status; readHistory(); }
  };

  const readHistory = async () => {
    try {
      const a = await call('GET', '/api/admin/audit?limit=200&target=' + encodeURIComponent(id));
      const entries = (a.entries || []).slice().reverse();
      history.replaceChildren(h('div', { class: 'scroll' }, h('table', {},
        h('thead', {}, h('tr', {}, ['time', 'actor', 'action', 'change', 'reason'].map(t => h('th', { text: t })))),
        h('tbody', {}, entries.map(e => h('tr', { 'data-action': e.action },
          h('td', { text: time(e.ts) }), h('td', { text: e.actor }), h('td', { class: 'mono', text: e.action }),
          h('td', { text: e.metadata && e.metadata.from ? e.metadata.from + ' → ' + e.metadata.to : '' }),
          h('td', { text: e.reason || '' })))))));
      const start = entries.find(e => e.action === 'worker.start');
      if (!start) { placement.textContent = 'No start entry (the audit log may have been pruned).'; return; }
      const m = start.metadata || {};
      const p = m.placement;
      const lines = [h('div', {}, 'Started by ', h('b', { text: start.actor }), ' at ' + time(start.ts) + ': ' + (start.reason || ''))];
      if (p) {
        lines.push(h('div', { text: 'Placed on pool ' + p.pool_id + ', device ' + p.gpu_device + ': ' + bytes(p.free_bytes) + ' free, the model needs ' + bytes(p.need_bytes) + ' (most free memory wins).' }));
        for (const [pool, why] of Object.entries(p.rejected || {})) lines.push(h('div', { class: 'muted', text: 'not ' + pool + ': ' + why }));
      } else if (m.pool_id) {
        lines.push(h('div', { text: 'Pool ' + m.pool_id + ' named by the caller' + (m.gpu_device !== undefined ? ', device ' + m.gpu_device : '') + '.' }));
      }
      if (m.demand) lines.push(h('div', { class: 'muted', text: 'demand: ' + JSON.stringify(m.demand) }));
      placement.replaceChildren(...lines);
    } catch (e) { history.replaceChildren(h('div', { class: 'error', text: e.message })); }
  };

  const readLog = async () => {
    try {
      const resp = await fetch('/api/admin/workers/' + encodeURIComponent(id) + '/logs?tail=200&follow=1', { headers: authHeaders(), signal: logCtl.signal, cache: 'no-store' });
      if (!resp.ok) throw await errorOf(resp);
      logState.textContent = '(following)';
      const reader = resp.body.getReader();
      const dec = new TextDecoder();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        log.append(dec.decode(value, { stream: true }));
        while (log.childNodes.length > 400) log.firstChild.remove();
        log.scrollTop = log.scrollHeight;
      }
      logState.textContent = '(the worker ended)';
    } catch (e) {
      if (!logCtl.signal.aborted) logState.textContent = '(' + e.message + ')';
    }
  };

  const fromState = () => state.items.get('worker/' + id);
  (async () => {
    if (!fromState()) {
      try { showRow(await call('GET', '/api/admin/workers/' + encodeURIComponent(id))); } catch (e) { live.replaceChildren(h('div', { class: 'error', text: e.message })); }
    }
  })();
  readLog();
  return { name: 'worker', update: () => showRow(fromState()), leave: () => logCtl.abort() };
}

// ---- the audit log ----

function audit() {
  const main = document.getElementById('main');
  const q = new URLSearchParams(location.hash.split('?')[1] || '');
  const field = (name, label, ph) => h('label', {}, label, h('input', { name, id: 'audit-' + name, placeholder: ph, value: q.get(name) || '' }));
  const out = h('div', { id: 'audit-entries' });
  const form = h('form', { class: 'filters', id: 'audit-form', onsubmit: ev => {
    ev.preventDefault();
    const p = new URLSearchParams();
    for (const el of form.querySelectorAll('input')) if (el.value.trim()) p.set(el.name, el.value.trim());
    location.hash = '#/audit' + (p.toString() ? '?' + p : '');
  } },
  field('actor', 'actor', 'admin, queen, hive:node-1'), field('action', 'action', 'worker.stop'), field('target', 'target', 'wk-…, pool id'),
  field('since', 'since', '1h or 2025-01-02T15:04:05Z'), field('until', 'until', '10m or RFC 3339'),
  h('button', { class: 'primary', type: 'submit', text: 'Filter' }));
  main.replaceChildren(h('h2', { text: 'Audit log' }), form, out);
  const p = new URLSearchParams();
  for (const k of ['actor', 'action', 'target', 'since', 'until']) if (q.get(k)) p.set(k, q.get(k));
  p.set('limit', '500');
  call('GET', '/api/admin/audit?' + p).then(a => {
    const entries = a.entries || [];
    out.replaceChildren(h('p', { class: 'muted', text: entries.length + ' entries, newest first' + (entries.length === 500 ? ' (the first 500)' : '') }),
      h('div', { class: 'scroll' }, h('table', {},
        h('thead', {}, h('tr', {}, ['id', 'time', 'actor', 'action', 'target', 'reason', 'metadata'].map((t, i) => h('th', { class: i === 6 ? 'hide-narrow' : null, text: t })))),
        h('tbody', {}, entries.map(e => h('tr', { 'data-entry': e.id, 'data-action': e.action, 'data-actor': e.actor },
          h('td', { class: 'num', text: e.id }), h('td', { text: time(e.ts) }), h('td', { text: e.actor }),
          h('td', { class: 'mono', text: e.action }),
          h('td', {}, /^wk-[0-9a-f]{16}$/.test(e.target) ? h('a', { class: 'mono', href: '#/worker/' + e.target, text: e.target }) : h('span', { class: 'mono', text: e.target })),
          h('td', { text: e.reason || '' }),
          h('td', { class: 'mono hide-narrow meta', title: e.metadata ? JSON.stringify(e.metadata, null, 1) : '', text: e.metadata ? JSON.stringify(e.metadata) : '' })))))));
  }).catch(e => out.replaceChildren(h('div', { class: 'error', id: 'audit-error', text: e.message })));
  return { name: 'audit' };
}

// ---- the playground ----

function playground() {
  const main = document.getElementById('main');
  const names = () => of('model/').map(m => m.name).sort();
  const model = h('select', { id: 'pg-model' });
  const fill = () => {
    const cur = model.value;
    model.replaceChildren(...names().map(n => h('option', { value: n, text: n })));
    if (cur && names().includes(cur)) model.value = cur;
  };
  fill();
  const prompt = h('textarea', { id: 'pg-prompt', placeholder: 'Say something to the model…' });
  const maxTokens = h('input', { id: 'pg-max', type: 'number', value: '64', min: '1', max: '4096' });
  const output = h('div', { id: 'pg-output', 'data-state': 'idle' });
  const meta = h('div', { class: 'muted', id: 'pg-meta' });
  let ctl = null;
  const send = h('button', { class: 'primary', type: 'submit', id: 'pg-send', text: 'Send' });
  const stop = h('button', { type: 'button', id: 'pg-stop', text: 'Stop', disabled: true, onclick: () => ctl && ctl.abort() });
  const form = h('form', { class: 'playground', onsubmit: async ev => {
    ev.preventDefault();
    output.textContent = '';
    output.dataset.state = 'waiting';
    meta.textContent = '';
    send.disabled = true; stop.disabled = false;
    ctl = new AbortController();
    const t0 = performance.now();
    let first = 0, chunks = 0, worker = '';
    try {
      const headers = { 'Content-Type': 'application/json' };
      const apiTok = sessionStorage.getItem(KEY_API);
      if (apiTok) headers.Authorization = 'Bearer ' + apiTok;
      const resp = await fetch('/v1/chat/completions', { method: 'POST', headers, signal: ctl.signal, cache: 'no-store',
        body: JSON.stringify({ model: model.value, stream: true, max_tokens: Number(maxTokens.value) || 64,
          messages: [{ role: 'user', content: prompt.value }] }) });
      if (!resp.ok) throw await errorOf(resp);
      worker = resp.headers.get('X-Apiary-Worker') || '';
      output.dataset.state = 'streaming';
      await readSSE(resp, data => {
        if (data === '[DONE]') return;
        const ev = JSON.parse(data);
        if (ev.error) throw new Error(ev.error.message);
        for (const c of ev.choices || []) {
          const d = (c.delta && c.delta.content) || '';
          if (d) {
            if (!first) first = performance.now();
            chunks++;
            output.append(d);
          }
        }
        meta.textContent = chunks + (chunks === 1 ? ' chunk' : ' chunks') + (first ? ' · first after ' + Math.round(first - t0) + ' ms' : '') + (worker ? ' · worker ' + worker : '');
      });
      output.dataset.state = 'done';
    } catch (e) {
      output.dataset.state = 'error';
      output.append(h('div', { class: 'error', text: ctl.signal.aborted ? 'stopped' : e.message }));
    }
    meta.textContent = chunks + (chunks === 1 ? ' chunk' : ' chunks') + ' in ' + Math.round(performance.now() - t0) + ' ms' + (first ? ' · first after ' + Math.round(first - t0) + ' ms' : '') + (worker ? ' · worker ' + worker : '');
    send.disabled = false; stop.disabled = true; ctl = null;
  } },
  h('div', { class: 'row' }, h('label', {}, 'model ', model), h('label', {}, 'max tokens ', maxTokens)),
  prompt, h('div', { class: 'row' }, send, stop), output, meta,
  h('span', { class: 'muted', text: 'Sent to /v1/chat/completions through the queen' + (sessionStorage.getItem(KEY_API) ? ' with the API token you gave.' : ' without an API token.') }));
  main.replaceChildren(h('h2', { text: 'Playground' }), form);
  return { name: 'playground', update: () => { if (!model.options.length || document.activeElement !== model) fill(); } };
}

// ---- routing between pages ----

function route() {
  if (state.signedOut) return;
  if (state.view && state.view.leave) state.view.leave();
  const hash = location.hash.replace(/^#/, '') || '/';
  const [path] = hash.split('?');
  let v;
  if (path.startsWith('/worker/')) v = worker(decodeURIComponent(path.slice('/worker/'.length)));
  else if (path === '/audit') v = audit();
  else if (path === '/playground') v = playground();
  else v = overview();
  state.view = v;
  for (const a of document.querySelectorAll('header nav a')) {
    if (a.dataset.nav === v.name) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  if (v.update) v.update();
}

async function start() {
  document.getElementById('signout').hidden = !sessionStorage.getItem(KEY_ADMIN);
  // A queen with tokens is asked for one first: no request goes out
  // without it only to be refused (a 401 in the browser's console).
  if (!sessionStorage.getItem(KEY_ADMIN)) {
    try {
      const h = await (await fetch('/health', { cache: 'no-store' })).json();
      if (h.tokens) { signIn(); return; }
    } catch (e) { /* the stream's own errors say what is wrong */ }
  }
  route();
  follow();
}

window.addEventListener('hashchange', route);
document.getElementById('signout').addEventListener('click', () => {
  sessionStorage.removeItem(KEY_ADMIN);
  sessionStorage.removeItem(KEY_API);
  signIn();
});
start();
