/* Datasets page: delete a dataset (DELETE /v1/datasets/{id}) after a confirmation. */
(function () {
  'use strict';
  const L = window.LibreYOLO;
  const dialog = document.getElementById('delete-dialog');
  if (!dialog) return;
  let target = null;

  document.addEventListener('click', function (ev) {
    const button = ev.target.closest('.delete-dataset');
    if (!button) return;
    target = button;
    document.getElementById('delete-name').textContent = button.dataset.name;
    dialog.returnValue = '';
    dialog.showModal();
  });

  dialog.addEventListener('close', async function () {
    if (dialog.returnValue !== 'delete' || !target) return;
    const id = target.dataset.id;
    const message = document.getElementById('ds-msg-' + id);
    message.textContent = 'Deleting…';
    try {
      const resp = await L.request('DELETE', '/v1/datasets/' + encodeURIComponent(id));
      if (resp.ok) {
        target.closest('section').remove();
      } else {
        message.textContent = 'Could not delete: ' + L.problemText(resp.data);
      }
    } catch (err) {
      message.textContent = 'Could not delete: ' + err;
    }
  });
})();
