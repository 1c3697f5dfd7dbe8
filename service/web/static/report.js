/* Job page: the validation report (val/report.json): sortable per-class table, plots,
   and the gallery of detection pictures filtered by class, FP and FN marked. */
'use strict';
(function () {
  const L = window.LibreYOLO;
  const root = document.getElementById('job');
  const card = document.getElementById('report');
  if (!root || !card) return;
  const base = '/v1/jobs/' + encodeURIComponent(root.dataset.jobId) + '/artifacts/val/';
  const TERMINAL = ['succeeded', 'failed', 'cancelled'];
  const PLOTS = [
    ['pr_curve', 'Precision-recall curve (IoU 0.50)'],
    ['f1_curve', 'F1 against confidence'],
    ['precision_curve', 'Precision against confidence'],
    ['recall_curve', 'Recall against confidence'],
    ['confusion_matrix', 'Confusion matrix (counts)'],
    ['confusion_matrix_normalized', 'Confusion matrix (row-normalised)'],
    ['labels', 'Training labels: instances per class, box centres and sizes'],
  ];
  const COLS = ['class', 'images', 'instances', 'precision', 'recall', 'mAP50', 'mAP50-95'];
  let report = null;
  let sortKey = null;
  let sortDir = 1;

  function el(name, attrs, text) {
    const node = document.createElement(name);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, String(attrs[k])); });
    if (text !== undefined) node.textContent = text;
    return node;
  }

  const COUNTS = ['images', 'instances'];

  /** A table or lede value: counts as integers, metrics with three decimals, — for none. */
  function fmt(v, key) {
    if (v === null || v === undefined) return '—';
    return (typeof v === 'number' && COUNTS.indexOf(key) === -1) ? v.toFixed(3) : String(v);
  }

  function renderTable() {
    const tbody = card.querySelector('#report-table tbody');
    const rows = report.table.slice(1);
    if (sortKey) {
      rows.sort(function (a, b) {
        const x = a[sortKey], y = b[sortKey];
        if (x === y) return 0;
        if (x === null || x === undefined) return 1; // no instances: always last
        if (y === null || y === undefined) return -1;
        return (x < y ? -1 : 1) * sortDir;
      });
    }
    const out = [report.table[0]].concat(rows).map(function (r) {
      const tr = el('tr', { class: r.id === null ? 'all-row' : (r.no_instances ? 'no-instances' : '') });
      tr.appendChild(el('th', { scope: 'row' }, r['class'] + (r.no_instances ? ' (no instances)' : '')));
      COLS.slice(1).forEach(function (k) { tr.appendChild(el('td', { class: 'num' }, fmt(r[k], k))); });
      return tr;
    });
    tbody.replaceChildren.apply(tbody, out);
    card.querySelectorAll('#report-table th[aria-sort]').forEach(function (th) {
      const key = th.querySelector('button').dataset.key;
      th.setAttribute('aria-sort', key === sortKey ? (sortDir > 0 ? 'ascending' : 'descending') : 'none');
    });
  }

  function renderPlots() {
    const box = document.getElementById('report-plots');
    const figs = PLOTS.filter(function (p) { return report.files[p[0]]; }).map(function (p) {
      const fig = el('figure', { class: 'plot' });
      const a = el('a', { href: base + report.files[p[0]] });
      a.appendChild(el('img', { src: base + report.files[p[0]], alt: p[1], loading: 'lazy' }));
      fig.appendChild(a);
      fig.appendChild(el('figcaption', {}, p[1]));
      return fig;
    });
    box.replaceChildren.apply(box, figs);
  }

  function marks(cap, cls, label, names) {
    if (!names.length) return;
    cap.appendChild(document.createTextNode(' '));
    cap.appendChild(el('span', { class: cls }, label));
    cap.appendChild(document.createTextNode(' ' + names.join(', ')));
  }

  function renderGallery() {
    const box = document.getElementById('report-gallery');
    const want = document.getElementById('report-class').value;
    const errorsOnly = document.getElementById('report-errors').value === 'errors';
    const shown = report.images.filter(function (im) {
      if (want && im.classes.indexOf(want) === -1) return false;
      return !errorsOnly || im.fp > 0 || im.fn > 0;
    });
    const figs = shown.map(function (im) {
      const fig = el('figure', { class: 'detection', 'data-classes': im.classes.join('|') });
      const a = el('a', { href: base + im.file });  // the picture at full size
      a.appendChild(el('img', { src: base + im.file, loading: 'lazy',
        alt: im.source + ': ground truth beside the predictions' }));
      fig.appendChild(a);
      const cap = el('figcaption', {}, im.source + ' · TP ' + im.tp + ' · FP ' + im.fp + ' · FN ' + im.fn);
      marks(cap, 'mark-fp', 'FP', im.fp_classes);
      marks(cap, 'mark-fn', 'FN', im.fn_classes);
      fig.appendChild(cap);
      return fig;
    });
    box.replaceChildren.apply(box, figs);
    document.getElementById('report-count').textContent =
      shown.length + ' of ' + report.images.length + ' pictures';
  }

  function render() {
    const m = report.metrics;
    const cm = report.confusion_matrix || {};
    document.getElementById('report-lede').textContent =
      (report.epoch ? 'Epoch ' + report.epoch + ' · ' : '') + 'mAP50 ' + fmt(m.mAP50) + ' · mAP50-95 ' +
      fmt(m['mAP50-95']) + ' · P ' + fmt(m.precision) + ' · R ' + fmt(m.recall) +
      ' · confusion matrix and pictures at conf ≥ ' + cm.conf + ', IoU ' + cm.iou;
    renderTable();
    renderPlots();
    const sel = document.getElementById('report-class');
    const names = {};
    report.images.forEach(function (im) { im.classes.forEach(function (c) { names[c] = true; }); });
    Object.keys(names).sort().forEach(function (c) { sel.appendChild(el('option', { value: c }, c)); });
    renderGallery();
    card.hidden = false;
  }

  card.querySelector('#report-table thead').addEventListener('click', function (ev) {
    const btn = ev.target.closest('button.sort');
    if (!btn || !report) return;
    const key = btn.dataset.key;
    sortDir = key === sortKey ? -sortDir : (key === 'class' ? 1 : -1);
    sortKey = key;
    renderTable();
  });
  document.getElementById('report-class').addEventListener('change', renderGallery);
  document.getElementById('report-errors').addEventListener('change', renderGallery);

  async function load() {
    // the listing first: a job without a report answers no 404 (a console error)
    const list = await L.request('GET', '/v1/jobs/' + encodeURIComponent(root.dataset.jobId) + '/artifacts');
    const paths = ((list.data && list.data.data) || []).map(function (a) { return a.path; });
    if (!list.ok || paths.indexOf('val/report.json') === -1) return false;
    const got = await L.request('GET', base + 'report.json');
    if (!got.ok || !got.data || !Array.isArray(got.data.table)) return false;
    report = got.data;
    render();
    return true;
  }

  async function poll() {
    let done = false;
    try { done = await load(); } catch (e) { done = false; }
    if (done) return;
    const status = document.getElementById('status-badge').textContent.trim();
    if (TERMINAL.indexOf(status) === -1) setTimeout(poll, 10000); // written when the run ends
  }
  poll();
})();
