/* Jobs page: submit form (API validation errors next to their field) and auto-refresh. */
'use strict';
(function () {
  const L = window.LibreYOLO;
  const form = document.getElementById('job-form');
  const rows = document.getElementById('job-rows');
  const auto = document.getElementById('auto-refresh');
  const refreshStatus = document.getElementById('refresh-status');
  const formError = document.getElementById('form-error');
  const formOk = document.getElementById('form-ok');
  const submitButton = document.getElementById('submit-job');
  const REFRESH_MS = 3000;
  // error slot -> control that gets aria-invalid and focus
  const CONTROLS = {
    kind: 'input[name="kind"]', model: '#f-model', data: '#f-data', epochs: '#f-epochs',
    imgsz: '#f-imgsz', batch: '#f-batch', gpus: '#f-gpus', nodes: '#f-nodes',
    params: '#f-params',
  };
  const BASIC = ['epochs', 'imgsz', 'batch'];

  function value(name) {
    const el = form.elements.namedItem(name);
    return el && typeof el.value === 'string' ? el.value.trim() : '';
  }

  function clearErrors() {
    form.querySelectorAll('.field-error').forEach(function (el) {
      el.hidden = true;
      el.textContent = '';
    });
    form.querySelectorAll('[aria-invalid]').forEach(function (el) {
      el.removeAttribute('aria-invalid');
    });
    formError.hidden = true;
    formError.textContent = '';
  }

  /** Which error slot shows an API field ("params.epochs" -> epochs, "procs" -> gpus...). */
  function slotFor(field) {
    if (!field) return null;
    if (field.indexOf('params.') === 0) {
      const key = field.slice(7).split('.')[0];
      return BASIC.indexOf(key) !== -1 && value(key) !== '' ? key : 'params';
    }
    const head = field.split('.')[0];
    if (head === 'procs') return 'gpus';
    return Object.prototype.hasOwnProperty.call(CONTROLS, head) ? head : null;
  }

  /** Show one message next to its field; returns the control (for focus) or null. */
  function showError(field, message) {
    const slot = slotFor(field);
    const box = slot && document.getElementById(slot + '-error');
    if (!box) {
      formError.textContent = (field ? field + ': ' : '') + message;
      formError.hidden = false;
      return null;
    }
    box.textContent = box.textContent ? box.textContent + ' ' + message : message;
    box.hidden = false;
    const control = form.querySelector(CONTROLS[slot]);
    if (control) {
      control.setAttribute('aria-invalid', 'true');
      control.setAttribute('aria-describedby', slot + '-error');
    }
    return control;
  }

  function showProblem(resp) {
    const p = resp.data || {};
    let first = null;
    const errors = Array.isArray(p.errors) && p.errors.length ? p.errors
      : [{ field: p.field, message: L.problemText(p, p.field) }];
    errors.forEach(function (e) {
      const control = showError(e.field, e.message || L.problemText(p, e.field));
      first = first || control;
    });
    if (!first && formError.hidden) {
      formError.textContent = 'Error ' + resp.status + ': ' + L.problemText(p);
      formError.hidden = false;
    }
    (first || formError).focus();
  }

  async function submit(event) {
    event.preventDefault();
    clearErrors();
    formOk.replaceChildren();
    submitButton.disabled = true;
    try {
      let params = {};
      const yamlText = value('params');
      if (yamlText) {
        const parsed = await L.request('POST', '/web/params', { yaml: yamlText });
        if (!parsed.ok) {
          showProblem(parsed);
          return;
        }
        params = parsed.data.params || {};
      }
      BASIC.forEach(function (key) {
        const raw = value(key);
        if (raw !== '') params[key] = Number(raw);
      });
      const preflight = document.getElementById('f-preflight');
      if (preflight && preflight.checked) params.preflight = true;
      const kindEl = form.querySelector('input[name="kind"]:checked');
      const body = {
        kind: kindEl ? kindEl.value : 'train',
        model: value('model'),
        data: value('data'),
        gpus: Number(value('gpus') || 0),
        nodes: Number(value('nodes') || 1),
        params: params,
      };
      const resp = await L.request('POST', '/v1/jobs', body);
      if (!resp.ok) {
        showProblem(resp);
        return;
      }
      const link = document.createElement('a');
      link.href = '/jobs/' + resp.data.id;
      link.textContent = resp.data.id;
      formOk.replaceChildren(document.createTextNode('Submitted job '), link,
        document.createTextNode(' (' + resp.data.status + ').'));
      refreshRows();
    } catch (err) {
      if (String(err && err.message) !== 'signed out') {
        formError.textContent = 'Could not reach the service: ' + err;
        formError.hidden = false;
      }
    } finally {
      submitButton.disabled = false;
    }
  }

  let refreshing = false;
  async function refreshRows() {
    if (refreshing || !rows || rows.dataset.static) return;
    if (rows.contains(document.activeElement)) return; // do not pull a focused link away
    refreshing = true;
    try {
      const resp = await L.fetchHTML(rows.dataset.src);
      if (resp.status === 200) {
        L.swapHTML(rows, resp.html);
        refreshStatus.textContent = 'Updated ' + new Date().toLocaleTimeString();
      } else {
        refreshStatus.textContent = 'Refresh failed (' + resp.status + ')';
      }
    } catch (err) {
      refreshStatus.textContent = 'Refresh failed: service unreachable';
    } finally {
      refreshing = false;
    }
  }

  if (form) form.addEventListener('submit', submit);
  setInterval(function () {
    if (auto && auto.checked && document.visibilityState === 'visible') refreshRows();
  }, REFRESH_MS);
})();
