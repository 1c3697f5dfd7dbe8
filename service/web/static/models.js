/* Model page: delete (after a confirmation) through DELETE /v1/models/{id}. */
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
