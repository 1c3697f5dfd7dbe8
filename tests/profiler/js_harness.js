// Runs timeline.html's inline script under a minimal DOM stub (node, no browser).
// Usage: node js_harness.js timeline.html  -> prints "ok <lanes>" or throws.
const fs = require('fs');
const html = fs.readFileSync(process.argv[2], 'utf8');
const data = html.match(/<script type="application\/json" id="data">([\s\S]*?)<\/script>/)[1];
const code = html.match(/<script>([\s\S]*?)<\/script><\/body>/)[1];
const noop = new Proxy(function () {}, { get: (t, k) => (k === 'measureText' ? () => ({ width: 10 }) : noop), apply: () => noop });
const listeners = {};
function el(id) {
  return { id, textContent: id === 'data' ? data : '', style: {}, width: 800, height: 150,
    clientWidth: 800, clientHeight: 400, checked: true,
    getContext: () => noop, appendChild: () => {}, set innerHTML(v) {},
    getBoundingClientRect: () => ({ left: 0, top: 0 }),
    addEventListener: (ev, fn) => { (listeners[id + ':' + ev] = listeners[id + ':' + ev] || []).push(fn); } };
}
const els = {};
global.document = { getElementById: (id) => (els[id] = els[id] || el(id)), createElement: () => el('x'), createTextNode: (t) => ({ t }) };
global.window = { addEventListener: (ev, fn) => { (listeners['window:' + ev] = listeners['window:' + ev] || []).push(fn); } };
eval(code);
// exercise the interactions once
const fire = (k, ev) => (listeners[k] || []).forEach((fn) => fn(ev));
fire('tl:wheel', { clientX: 400, deltaY: -1, preventDefault() {} });
fire('tl:mousemove', { clientX: 300, clientY: 30 });
fire('tl:mousedown', { clientX: 300 });
fire('tl:mousemove', { clientX: 250, clientY: 30 });
fire('window:mouseup', {});
fire('tl:dblclick', {});
fire('flows:change', { target: { checked: false } });
console.log('ok ' + Object.keys(JSON.parse(els.data.textContent).timeline.lanes).length);
