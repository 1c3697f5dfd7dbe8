/* Model page, "Try it": send one image to POST /v1/predict (a predict job on a worker),
   poll the job, then show the annotated image and the boxes (predictions.json). */
'use strict';
(function () {
  const L = window.LibreYOLO;
  const card = document.getElementById('try-it-card');
  if (!card) return;
  const modelId = card.dataset.modelId;
  const maxBytes = Number(card.dataset.maxBytes);
  const input = document.getElementById('try-file');
  const conf = document.getElementById('try-conf');
  const status = document.getElementById('try-status');
  const error = document.getElementById('try-error');
  const figure = document.getElementById('try-result');
  const image = document.getElementById('try-image');
  const caption = document.getElementById('try-caption');
  const table = document.getElementById('try-boxes');
  const TYPES = ['image/jpeg', 'image/png', 'image/webp', 'image/bmp'];
  const POLL_MS = 500;
  const GIVE_UP_MS = 180000; // the job's own time budget stops it before this

  function fail(text) {
    status.textContent = '';
    error.textContent = text;
    error.hidden = false;
    input.disabled = false;
  }

  function sleep(ms) { return new Promise(function (done) { setTimeout(done, ms); }); }

  async function poll(jobId, started) {
    for (;;) {
      const r = await L.request('GET', '/v1/jobs/' + encodeURIComponent(jobId));
      if (!r.ok) return fail(L.problemText(r.data));
      const job = r.data;
      if (job.status === 'succeeded') return job;
      if (job.status === 'failed' || job.status === 'cancelled') {
        return fail('The prediction ' + job.status + ': ' +
                    ((job.error && job.error.reason) || job.end_reason || 'no reason given') +
                    ' (job ' + jobId + ')');
      }
      const waited = Math.round((Date.now() - started) / 1000);
      status.textContent = (job.status === 'queued'
        ? 'Waiting for a worker' + (job.waiting ? ' (' + job.waiting + ')' : '')
        : 'Running on a worker') + '… ' + waited + ' s';
      if (Date.now() - started > GIVE_UP_MS) {
        return fail('No answer after ' + waited + ' s; the job ' + jobId + ' is still ' +
                    job.status + ' (see its page).');
      }
      await sleep(POLL_MS);
    }
  }

  function showBoxes(preds, names) {
    const body = table.tBodies[0];
    body.replaceChildren();
    preds.sort(function (a, b) { return b.score - a.score; });
    for (const p of preds) {
      const row = body.insertRow();
      const [x, y, w, h] = p.bbox;
      row.insertCell().textContent = names[String(p.category_id)] || String(p.category_id);
      row.insertCell().textContent = p.score >= 0.01 ? p.score.toFixed(3) : p.score.toExponential(1);
      row.insertCell().textContent = [x, y, x + w, y + h].map(function (v) {
        return Math.round(v);
      }).join(', ');
    }
    table.hidden = preds.length === 0;
  }

  input.addEventListener('change', async function () {
    const file = input.files && input.files[0];
    error.hidden = true;
    if (!file) return;
    if (TYPES.indexOf(file.type) === -1) {
      return fail(file.name + ' is not a JPEG, PNG, WebP or BMP image.');
    }
    if (file.size > maxBytes) {
      return fail(file.name + ' is ' + file.size + ' bytes; the limit is ' + maxBytes + ' bytes.');
    }
    input.disabled = true;
    figure.hidden = true;
    table.hidden = true;
    status.textContent = 'Sending ' + file.name + '…';
    const started = Date.now();
    const query = new URLSearchParams({ model: modelId, name: file.name, conf: conf.value || '0.25' });
    let resp;
    try {
      resp = await fetch('/v1/predict?' + query, {
        method: 'POST', credentials: 'same-origin', body: file,
        headers: { 'Content-Type': file.type, Accept: 'application/json, application/problem+json' },
      });
    } catch (e) {
      return fail('The service did not answer: ' + e.message);
    }
    if (resp.status === 401) return L.toSignin();
    let data = null;
    try { data = await resp.json(); } catch (e) { data = null; }
    if (!resp.ok) return fail(L.problemText(data));
    const job = await poll(data.id, started);
    if (!job) return;
    const summary = (job.result && job.result.predict) || {};
    const url = '/v1/jobs/' + encodeURIComponent(job.id) + '/artifacts/';
    const r = await L.request('GET', url + 'predictions.json');
    if (!r.ok) return fail(L.problemText(r.data));
    const preds = r.data || [];
    image.src = url + (summary.files || [])[0];
    caption.textContent = preds.length + ' box' + (preds.length === 1 ? '' : 'es') +
      ' in ' + ((Date.now() - started) / 1000).toFixed(1) + ' s · job ';
    const link = document.createElement('a');
    link.href = '/jobs/' + encodeURIComponent(job.id);
    link.textContent = job.id;
    caption.appendChild(link);
    figure.hidden = false;
    showBoxes(preds, summary.names || {});
    status.textContent = 'Done.';
    input.disabled = false;
  });
})();
