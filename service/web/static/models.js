/* Model page: delete (after a confirmation) through DELETE /v1/models/{id}; ONNX export
   through POST /v1/models/{id}/export (then the page follows the export until it ends). */
'use strict';
(function () {
  const L = window.LibreYOLO;
  const root = document.getElementById('model');
  if (!root) return;
  const modelId = root.dataset.modelId;
  const dialog = document.getElementById('delete-dialog');
  const message = document.getElementById('delete-message');

  document.getElementById('delete-button').addEventListener('click', function () {
    dialog.showModal();
  });
  const onnx = document.getElementById('onnx');
  const exportButton = document.getElementById('export-button');
  const exportMessage = document.getElementById('export-message');
  if (exportButton) {
    exportButton.addEventListener('click', async function () {
      exportButton.disabled = true;
      const r = await L.request('POST', '/v1/models/' + encodeURIComponent(modelId) +
                                '/export?format=onnx');
      if (!r.ok) {
        exportButton.disabled = false;
        exportMessage.textContent = L.problemText(r.data);
        return;
      }
      if (r.data && r.data.warnings && r.data.warnings.length) {
        sessionStorage.setItem('export-warning-' + modelId, r.data.warnings.join(' '));
      }
      location.reload();
    });
  }
  const warned = sessionStorage.getItem('export-warning-' + modelId);
  if (warned && onnx && onnx.dataset.onnxState === 'exporting') exportMessage.textContent = warned;
  if (onnx && onnx.dataset.onnxState === 'exporting') {
    // follow the export: reload once its state changes
    const poll = async function () {
      const r = await L.request('GET', '/v1/models/' + encodeURIComponent(modelId));
      if (r.ok && r.data && r.data.onnx && r.data.onnx.state !== 'exporting') {
        sessionStorage.removeItem('export-warning-' + modelId);
        location.reload();
        return;
      }
      setTimeout(poll, 3000);
    };
    setTimeout(poll, 3000);
  }

  dialog.addEventListener('close', async function () {
    if (dialog.returnValue !== 'delete') return;
    const r = await L.request('DELETE', '/v1/models/' + encodeURIComponent(modelId));
    if (r.ok) {
      location.assign('/models');
      return;
    }
    message.textContent = L.problemText(r.data);
  });
})();
