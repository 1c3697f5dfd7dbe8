/* Job page: live log and curves over SSE (resumes after a drop), summary refresh, cancel. */
'use strict';
(function () {
  const L = window.LibreYOLO;
  const root = document.getElementById('job');
  if (!root) return;
  const jobId = root.dataset.jobId;
  const logEl = document.getElementById('log');
  const stateEl = document.getElementById('stream-state');
  const badge = document.getElementById('status-badge');
  const summary = document.getElementById('summary');
  const progressEl = document.getElementById('live-progress');
  const progressText = document.getElementById('live-progress-text');
  const dialog = document.getElementById('cancel-dialog');
  const cancelMessage = document.getElementById('cancel-message');
  const SVG_NS = 'http://www.w3.org/2000/svg';
  const MAX_LOG_LINES = 2000;
  const TERMINAL = ['succeeded', 'failed', 'cancelled'];
  const QUEUE_REFRESH_MS = 10000;

  // ------------------------------------------------------------------ stream
  let source = null;
  let lastSeq = 0;
  let ended = false;
  let retryMs = 1000;

  function setState(cls, text) {
    stateEl.className = 'stream-state ' + cls;
    stateEl.textContent = text;
  }

  function connect() {
    source = new EventSource('/v1/jobs/' + encodeURIComponent(jobId) +
      '/events/stream?after=' + lastSeq);
    source.onopen = function () {
      retryMs = 1000;
      setState('live', 'live');
    };
    ['log', 'metric', 'status', 'artifact'].forEach(function (kind) {
      source.addEventListener(kind, onEvent);
    });
    source.addEventListener('end', function (ev) {
      ended = true;
      source.close();
      flushRunEnded();
      let info = {};
      try { info = JSON.parse(ev.data); } catch (e) { info = {}; }
      if (info.status) setStatus(info.status);
      setState('done', 'finished' + (info.status ? ' (' + info.status + ')' : ''));
      refreshSummary();
    });
    source.onerror = function () {
      if (ended) return;
      if (source.readyState === EventSource.CLOSED) {
        // the browser gave up (e.g. a 5xx while the service restarts): retry ourselves
        setState('retry', 'connection lost, retrying in ' + Math.round(retryMs / 1000) + ' s');
        setTimeout(connect, retryMs);
        retryMs = Math.min(retryMs * 2, 15000);
      } else {
        setState('retry', 'connection lost, reconnecting…'); // resumes with Last-Event-ID
      }
    };
  }

  let runEnded = null; // the engine's 'run ended' line, printed after its last log lines

  function flushRunEnded() {
    if (runEnded !== null) addLines([runEnded]);
    runEnded = null;
  }

  function onEvent(ev) {
    let e;
    try { e = JSON.parse(ev.data); } catch (err) { return; }
    if (typeof e.seq !== 'number' || e.seq <= lastSeq) return; // already seen
    lastSeq = e.seq;
    const d = e.data || {};
    if (e.kind === 'log') {
      addLines(Array.isArray(d.lines) ? d.lines : []);
      if (d.event === 'gang') scheduleSummary(500);  // a node slot taken or released
    } else if (e.kind === 'metric') {
      if (d.event === 'progress' || d.event === 'epoch_start') showProgress(d);
      if (d.event === 'tune_candidate' || d.event === 'tune' || d.event === 'preflight') scheduleSummary(500);
      if (d.event === 'epoch_end') {
        showProgress(d, true);
        addEpoch(d);
      }
    } else if (e.kind === 'status') {
      if (d.event === 'run_end') {
        // The engine's own end. Its last log lines (the final epoch's line) are copied in
        // the same batch but after the engine's events, so the line waits for the job's
        // status (or the stream's end) to be printed after them.
        runEnded = '── run ended: ' + (d.status || '?') +
          (d.best_epoch !== undefined && d.best_epoch !== null ? ', best epoch ' + d.best_epoch : '') +
          ' ──';
      } else if (d.event === 'status' && d.status) {
        flushRunEnded();
        addLines(['── job ' + d.status + (d.reason ? ': ' + d.reason : '') + nodesText(d) + ' ──']);
        setStatus(d.status);
        scheduleSummary(0);
      }
    } else if (e.kind === 'artifact') {
      scheduleSummary(2000);
    }
  }

  // a multi-node job's start: ' on 2 nodes (world size 2): node 0 w-a (10.0.0.1), ...'
  function nodesText(d) {
    if (!Array.isArray(d.nodes) || d.nodes.length < 2) return '';
    return ' on ' + d.nodes.length + ' nodes (world size ' + d.world_size + '): ' +
      d.nodes.map(function (n) {
        return 'node ' + n.node_rank + ' ' + n.worker + ' (' + n.addr + ')';
      }).join(', ') + (d.rendezvous ? '; rendezvous ' + d.rendezvous : '');
  }

  function setStatus(status) {
    // the queue's line (or a gang's wait) is over; the engine's progress replaces this
    if (status === 'running' && root.dataset.status === 'queued') progressText.textContent = 'starting';
    root.dataset.status = status;
    badge.textContent = status;
    badge.className = 'badge badge-' + status;
    if (status === 'succeeded') {
      progressEl.value = 100;
    }
    // an ended job has no time left: drop the ETA its last progress event gave
    if (TERMINAL.indexOf(status) !== -1) {
      progressText.textContent = progressText.textContent.replace(/ · ETA [^·]*$/, '');
      // a finished tune is not "2 of 3 trials done" (the summary refresh adds the count)
      if (progressText.textContent.indexOf('tuning:') === 0) progressText.textContent = 'tune ' + status;
    }
  }

  function fmtSeconds(s) {
    s = Math.max(0, Math.round(Number(s)));
    if (s < 60) return s + ' s';
    if (s < 3600) return Math.floor(s / 60) + ' min ' + (s % 60) + ' s';
    return Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min';
  }

  function showProgress(d, epochDone) {
    if (d.phase === 'tuning' && Number(d.trials_planned)) {  // a tune job: its trials
      const planned = Number(d.trials_planned);
      progressEl.value = Math.max(0, Math.min(100, Math.round(100 * (Number(d.trials_done) || 0) / planned)));
      const i = Number(d.candidate_index) || 0;
      progressText.textContent = 'tuning: ' + (i === 0 ? 'baseline'
        : d.candidate + ' (candidate ' + i + ' of ' + d.candidates + ')') +
        ' · trial ' + d.trial + '/' + d.trials + ' · ' + (Number(d.trials_done) || 0) + ' of ' +
        planned + ' trials done';
      return;
    }
    if (d.phase === 'profiling' && Number(d.steps)) {  // a profile job: step k of its window
      const total = Number(d.steps);
      const k = Number(d.step) || 0;
      progressEl.value = Math.max(0, Math.min(100, Math.round(100 * k / total)));
      progressText.textContent = 'profile window step ' + k + '/' + total +
        (d.warmup != null ? ' (' + d.warmup + ' warm-up + ' + d.measured + ' measured)' : '');
      return;
    }
    const epochs = Number(d.epochs) || 0;
    const epoch = Number(d.epoch) || 0;
    if (!epochs || !epoch) return;
    const steps = Number(d.steps) || 0;
    const step = Number(d.step) || 0;
    const frac = epochDone ? epoch / epochs : (epoch - 1 + (steps ? step / steps : 0)) / epochs;
    progressEl.value = Math.max(0, Math.min(100, Math.round(100 * frac)));
    let detail = '';
    if (!epochDone && d.phase === 'validating' && d.val_batches) {
      detail = ' · validating ' + (Number(d.val_batch) || 0) + '/' + d.val_batches;
    } else if (!epochDone && steps) {
      detail = ' · step ' + step + '/' + steps;
    }
    if (d.phase === 'validating') {
      progressEl.value = Math.max(0, Math.min(100, Math.round(100 * epoch / epochs)));
    }
    if (!epochDone && d.phase !== 'validating' && typeof d.eta_s === 'number'
        && TERMINAL.indexOf(root.dataset.status) === -1) {
      detail += ' · ETA ' + fmtSeconds(d.eta_s);
    }
    progressText.textContent = 'epoch ' + epoch + '/' + epochs + detail;
  }

  // ------------------------------------------------------------------ log tail
  const lines = [];
  let logPending = false;

  function addLines(more) {
    if (!more.length) return;
    Array.prototype.push.apply(lines, more);
    if (lines.length > MAX_LOG_LINES) lines.splice(0, lines.length - MAX_LOG_LINES);
    if (!logPending) {
      logPending = true;
      requestAnimationFrame(renderLog);
    }
  }

  function renderLog() {
    logPending = false;
    const atBottom = logEl.scrollHeight - logEl.scrollTop - logEl.clientHeight < 24;
    logEl.textContent = lines.join('\n');
    if (atBottom) logEl.scrollTop = logEl.scrollHeight;
  }

  // ------------------------------------------------------------------ curves
  const epochs = new Map(); // epoch -> {losses, metrics}
  let chartPending = false;

  function addEpoch(d) {
    if (typeof d.epoch !== 'number') return;
    epochs.set(d.epoch, { losses: d.losses || {}, metrics: d.metrics || {} });
    if (!chartPending) {
      chartPending = true;
      requestAnimationFrame(renderCharts);
    }
  }

  function seriesOf(group, names) {
    const keys = names || [];
    const sorted = Array.from(epochs.keys()).sort(function (a, b) { return a - b; });
    if (!names) {
      sorted.forEach(function (ep) {
        Object.keys(epochs.get(ep)[group]).forEach(function (k) {
          if (keys.indexOf(k) === -1) keys.push(k);
        });
      });
    }
    return keys.map(function (name) {
      const points = [];
      sorted.forEach(function (ep) {
        const v = epochs.get(ep)[group][name];
        if (typeof v === 'number' && isFinite(v)) points.push([ep, v]);
      });
      return { name: name, points: points };
    }).filter(function (s) { return s.points.length; });
  }

  function renderCharts() {
    chartPending = false;
    if (!document.getElementById('loss-chart')) return; // a profile job has no curves
    const losses = seriesOf('losses');
    const maps = seriesOf('metrics', ['mAP50', 'mAP50-95']);
    drawChart(document.getElementById('loss-chart'), document.getElementById('loss-legend'),
      losses, 'no loss yet');
    drawChart(document.getElementById('map-chart'), document.getElementById('map-legend'),
      maps, 'no validation yet');
    document.getElementById('curves-empty').hidden = epochs.size > 0;
    document.getElementById('charts').hidden = epochs.size === 0;
    document.getElementById('curve-values').hidden = epochs.size === 0;
    renderTable(losses, maps);
  }

  function el(name, attrs, text) {
    const node = document.createElementNS(SVG_NS, name);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, String(attrs[k])); });
    if (text !== undefined) node.textContent = text;
    return node;
  }

  /** The smallest of 1, 2, 2.5, 5 x 10^k that is >= v (a readable tick step). */
  function niceStep(v) {
    if (!(v > 0)) return 0.2;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    const steps = [1, 2, 2.5, 5, 10];
    for (let i = 0; i < steps.length; i++) if (steps[i] * p >= v * (1 - 1e-9)) return steps[i] * p;
    return 10 * p;
  }

  function fmt(v) {
    if (v === 0) return '0';
    const a = Math.abs(v);
    if (a >= 100) return v.toFixed(0);
    return String(parseFloat(v.toPrecision(3)));
  }

  /** Line chart of series [{name, points: [[epoch, value]...]}] into an SVG (480x240). */
  function drawChart(svg, legend, series, emptyText) {
    const W = 480; const H = 240;
    const m = { l: 46, r: 14, t: 12, b: 34 };
    svg.replaceChildren();
    legend.replaceChildren();
    if (!series.length) {
      svg.appendChild(el('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'empty' },
        emptyText));
      return;
    }
    let xMax = 1; let yMax = 0;
    series.forEach(function (s) {
      s.points.forEach(function (p) {
        xMax = Math.max(xMax, p[0]);
        yMax = Math.max(yMax, p[1]);
      });
    });
    const xMin = 1;
    const xSpan = Math.max(1, xMax - xMin);
    const yStep = niceStep(yMax * 1.05 / 5);
    const yTicks = Math.max(1, Math.ceil(yMax * 1.05 / yStep - 1e-9));
    const yTop = yStep * yTicks;
    const X = function (x) { return m.l + (x - xMin) / xSpan * (W - m.l - m.r); };
    const Y = function (y) { return H - m.b - y / yTop * (H - m.t - m.b); };
    for (let i = 0; i <= yTicks; i++) {
      const v = yStep * i;
      svg.appendChild(el('line', { x1: m.l, x2: W - m.r, y1: Y(v), y2: Y(v), class: 'grid' }));
      svg.appendChild(el('text', { x: m.l - 6, y: Y(v) + 4, 'text-anchor': 'end', class: 'tick' },
        fmt(v)));
    }
    const every = Math.max(1, Math.ceil(xSpan / 8));
    for (let x = xMin; x <= xMax; x += every) {
      svg.appendChild(el('line', { x1: X(x), x2: X(x), y1: H - m.b, y2: H - m.b + 4, class: 'axis' }));
      svg.appendChild(el('text', { x: X(x), y: H - m.b + 16, 'text-anchor': 'middle', class: 'tick' },
        String(x)));
    }
    svg.appendChild(el('text', { x: (W + m.l) / 2, y: H - 3, 'text-anchor': 'middle', class: 'tick' },
      'epoch'));
    svg.appendChild(el('line', { x1: m.l, x2: m.l, y1: m.t, y2: H - m.b, class: 'axis' }));
    svg.appendChild(el('line', { x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b, class: 'axis' }));
    series.forEach(function (s, i) {
      const cls = 'c' + (i % 5) + ' d' + (i % 3);
      const d = s.points.map(function (p, j) {
        return (j ? 'L' : 'M') + X(p[0]).toFixed(1) + ' ' + Y(p[1]).toFixed(1);
      }).join(' ');
      svg.appendChild(el('path', { d: d, class: 'series ' + cls, 'data-series': s.name }));
      s.points.forEach(function (p) {
        svg.appendChild(el('circle', { cx: X(p[0]).toFixed(1), cy: Y(p[1]).toFixed(1), r: 3,
          class: 'c' + (i % 5) }));
      });
      const last = s.points[s.points.length - 1];
      const li = document.createElement('li');
      const sw = document.createElement('span');
      sw.className = 'swatch ' + cls;
      sw.setAttribute('aria-hidden', 'true');
      li.append(sw, document.createTextNode(s.name + ' ' + fmt(last[1]) + ' (epoch ' + last[0] + ')'));
      legend.appendChild(li);
    });
  }

  function renderTable(losses, maps) {
    const table = document.getElementById('curve-table');
    const cols = losses.map(function (s) { return ['losses', s.name, 'loss ' + s.name]; })
      .concat(maps.map(function (s) { return ['metrics', s.name, s.name]; }));
    const headRow = document.createElement('tr');
    ['Epoch'].concat(cols.map(function (c) { return c[2]; })).forEach(function (label) {
      const th = document.createElement('th');
      th.scope = 'col';
      th.textContent = label;
      headRow.appendChild(th);
    });
    table.tHead.replaceChildren(headRow);
    const body = table.tBodies[0];
    body.replaceChildren();
    Array.from(epochs.keys()).sort(function (a, b) { return a - b; }).forEach(function (ep) {
      const tr = document.createElement('tr');
      const th = document.createElement('th');
      th.scope = 'row';
      th.textContent = String(ep);
      tr.appendChild(th);
      cols.forEach(function (c) {
        const td = document.createElement('td');
        const v = epochs.get(ep)[c[0]][c[1]];
        td.className = 'num';
        td.textContent = typeof v === 'number' ? v.toFixed(4) : '—';
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
  }

  // ------------------------------------------------------------------ summary + cancel
  let summaryTimer = null;
  let summaryBusy = false;

  function scheduleSummary(delay) {
    if (summaryTimer !== null) return;
    summaryTimer = setTimeout(function () {
      summaryTimer = null;
      refreshSummary();
    }, delay);
  }

  async function refreshSummary() {
    if (summaryBusy) {
      scheduleSummary(500);
      return;
    }
    summaryBusy = true;
    try {
      const resp = await L.fetchHTML('/web/jobs/' + encodeURIComponent(jobId) + '/summary');
      if (resp.status !== 200) return;
      const focusedId = summary.contains(document.activeElement) ? document.activeElement.id : '';
      L.swapHTML(summary, resp.html);
      const status = resp.headers.get('X-Job-Status');
      if (status) setStatus(status);
      if (focusedId && document.getElementById(focusedId)) {
        document.getElementById(focusedId).focus();
      }
    } catch (err) {
      // the stream's own state line says when the service is unreachable
    } finally {
      summaryBusy = false;
    }
  }

  // a cancelled or failed train job: a new job that continues from its last.pt
  summary.addEventListener('click', async function (ev) {
    const button = ev.target.closest('#resume-button');
    if (!button) return;
    const message = document.getElementById('resume-message');
    button.disabled = true;
    message.textContent = 'Resuming…';
    try {
      const resp = await L.request('POST', '/v1/jobs/' + encodeURIComponent(jobId) + '/resume');
      if (resp.ok) {
        window.location.assign('/jobs/' + encodeURIComponent(resp.data.id));
        return;
      }
      message.textContent = 'Could not resume: ' + L.problemText(resp.data);
    } catch (err) {
      message.textContent = 'Could not resume: ' + err;
    }
    button.disabled = false;
  });

  summary.addEventListener('click', function (ev) {
    const button = ev.target.closest('#cancel-button');
    if (!button) return;
    dialog.returnValue = '';
    dialog.showModal();
  });

  dialog.addEventListener('close', async function () {
    if (dialog.returnValue !== 'cancel') return;
    cancelMessage.textContent = 'Cancelling…';
    try {
      const resp = await L.request('POST', '/v1/jobs/' + encodeURIComponent(jobId) + '/cancel');
      if (resp.ok) {
        cancelMessage.textContent = resp.data.status === 'cancelled' ? 'Job cancelled.'
          : 'Cancel requested: the run stops after its current step.';
        setStatus(resp.data.status);
      } else {
        cancelMessage.textContent = 'Could not cancel: ' + L.problemText(resp.data);
      }
    } catch (err) {
      cancelMessage.textContent = 'Could not cancel: ' + err;
    }
    refreshSummary();
  });

  // a queued job's place in the queue and estimated start change without an event
  setInterval(function () {
    if (root.dataset.status === 'queued' && !document.hidden) refreshSummary();
  }, QUEUE_REFRESH_MS);

  if (TERMINAL.indexOf(root.dataset.status) !== -1) setState('', 'loading…');
  renderCharts();
  connect();
})();
