/* Shared helpers of the LibreYOLO pages: same-origin fetches with the sign-in cookie. */
'use strict';
(function () {
  const L = {};

  /** Go to the sign-in page, coming back here afterwards. */
  L.toSignin = function () {
    const next = location.pathname + location.search;
    location.assign('/signin?next=' + encodeURIComponent(next));
  };

  /**
   * fetch() with the cookie; JSON in and out. Resolves to {ok, status, data, headers};
   * `data` is the parsed JSON (or problem+json) body, or null. A 401 goes to sign-in.
   */
  L.request = async function (method, url, body) {
    const opts = {
      method: method,
      credentials: 'same-origin',
      headers: { Accept: 'application/json, application/problem+json' },
    };
    if (body !== undefined) {
      opts.headers['Content-Type'] = 'application/json';
      opts.body = JSON.stringify(body);
    }
    const resp = await fetch(url, opts);
    if (resp.status === 401) {
      L.toSignin();
      throw new Error('signed out');
    }
    let data = null;
    const type = resp.headers.get('content-type') || '';
    if (type.indexOf('json') !== -1) {
      try { data = await resp.json(); } catch (e) { data = null; }
    }
    return { ok: resp.ok, status: resp.status, data: data, headers: resp.headers };
  };

  /** GET an HTML fragment of this service; resolves to {status, html, headers}. */
  L.fetchHTML = async function (url) {
    const resp = await fetch(url, { credentials: 'same-origin', headers: { Accept: 'text/html' } });
    if (resp.status === 401) {
      L.toSignin();
      throw new Error('signed out');
    }
    return { status: resp.status, html: await resp.text(), headers: resp.headers };
  };

  /** Replace an element's children with server-rendered (autoescaped) HTML. */
  L.swapHTML = function (el, html) {
    const tpl = document.createElement('template'); // parses <tr> rows in context too
    tpl.innerHTML = html;
    el.replaceChildren(tpl.content);
  };

  /** A problem+json detail without its leading "field: " (the field is shown next to it). */
  L.problemText = function (problem, field) {
    let text = (problem && (problem.detail || problem.title)) || 'request failed';
    if (field && text.indexOf(field + ': ') === 0) text = text.slice(field.length + 2);
    return text;
  };

  window.LibreYOLO = L;
})();
