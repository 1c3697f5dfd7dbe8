"""``timeline.html``: a self-contained viewer of one profile (no network, inline JS/CSS).

Lanes (reference A.4): phase · CPU (``step/<phase>`` annotations), CPU ops (>= 20 µs, nested
by depth), phase · GPU, GPU kernels (>= 2 µs), GPU memcpy/memset, and CPU -> GPU launch flow
lines. Events are capped to the longest :data:`MAX_CPU_EVENTS` CPU ops and
:data:`MAX_GPU_EVENTS` GPU events so the page stays responsive; everything is drawn on one
canvas (wheel = zoom, drag = pan, double-click = reset, hover = details). A side panel shows
the verdict with its figures and levers, the per-step phase bars (wall ms of every measured
step), the category mix and the top kernels (or CPU ops on a CPU run).
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from libreyolo_core.profiler.analysis import self_times
from libreyolo_core.profiler.record import ProfileRecord

__all__ = [
    "MAX_CPU_EVENTS",
    "MAX_GPU_EVENTS",
    "MAX_FLOWS",
    "timeline_data",
    "render_timeline",
    "write_timeline",
]

MAX_CPU_EVENTS = 1500
MAX_GPU_EVENTS = 2500
MAX_FLOWS = 4000
MIN_CPU_US = 20.0
MIN_GPU_US = 2.0
MAX_DEPTH = 6


def _longest(events: list[tuple], cap: int) -> list[tuple]:
    if len(events) > cap:
        events = sorted(events, key=lambda e: -e[1])[:cap]
    return sorted(events, key=lambda e: e[0])


def timeline_data(trace: Mapping[str, Any] | None) -> dict[str, Any]:
    """Compact lane data from a Chrome trace: ``names`` table and per-lane event tuples.

    Each event is ``[start_us, dur_us, name_index, row]`` relative to the first kept event;
    ``flows`` are ``[cpu_us, gpu_us]`` pairs; ``steps`` the ``ProfilerStep`` start times.
    """
    if not trace:
        return {"names": [], "lanes": {}, "flows": [], "steps": [], "span_us": 0.0}
    xs = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    names: dict[str, int] = {}

    def nid(name: str) -> int:
        return names.setdefault(name, len(names))

    def ev(e: Mapping[str, Any], row: int = 0) -> tuple:
        return (float(e["ts"]), float(e.get("dur", 0.0)), str(e.get("name", "?")), row)

    phase_cpu = [
        ev(e)
        for e in xs
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("step/")
    ]
    phase_gpu = [
        ev(e)
        for e in xs
        if e.get("cat") == "gpu_user_annotation" and str(e.get("name", "")).startswith("step/")
    ]
    ops = [
        (float(e["ts"]), float(e.get("dur", 0.0)), str(e["name"]), min(depth, MAX_DEPTH))
        for e, _s, depth in self_times([e for e in xs if e.get("cat") == "cpu_op"])
        if float(e.get("dur", 0.0)) >= MIN_CPU_US
    ]
    kernels = [e for e in xs if e.get("cat") == "kernel" and float(e.get("dur", 0.0)) >= MIN_GPU_US]
    kept_k = _longest(
        [ev(e) + ((e.get("args") or {}).get("correlation"),) for e in kernels], MAX_GPU_EVENTS
    )
    memcpy = _longest(
        [ev(e) for e in xs if e.get("cat") in ("gpu_memcpy", "gpu_memset")], MAX_GPU_EVENTS
    )
    launches = {
        (e.get("args") or {}).get("correlation"): float(e["ts"])
        for e in xs
        if e.get("cat") in ("cuda_runtime", "cuda_driver")
    }
    lanes_raw = {
        "phase · CPU": sorted(phase_cpu),
        "CPU ops": _longest(ops, MAX_CPU_EVENTS),
        "phase · GPU": sorted(phase_gpu),
        "GPU kernels": [k[:4] for k in kept_k],
        "GPU memcpy": memcpy,
    }
    markers = sorted(
        float(e["ts"]) for e in xs if str(e.get("name", "")).startswith("ProfilerStep#")
    )
    everything = [e for lane in lanes_raw.values() for e in lane]
    if not everything:
        return {"names": [], "lanes": {}, "flows": [], "steps": [], "span_us": 0.0}
    t0 = min(e[0] for e in everything)
    t1 = max(e[0] + e[1] for e in everything)
    lanes = {
        name: [[round(e[0] - t0, 1), round(e[1], 1), nid(e[2]), e[3]] for e in lane]
        for name, lane in lanes_raw.items()
        if lane
    }
    flows = []
    for k in kept_k[:MAX_FLOWS]:
        if k[4] is not None and k[4] in launches:
            flows.append([round(launches[k[4]] - t0, 1), round(k[0] - t0, 1)])
    return {
        "names": list(names),
        "lanes": lanes,
        "flows": flows,
        "steps": [round(m - t0, 1) for m in markers],
        "span_us": round(t1 - t0, 1),
    }


def _fmt(v: Any, unit: str = "", nd: int = 2) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{nd}f}{unit}"
    return f"{v}{unit}"


def _panel(p: ProfileRecord) -> str:
    cfg = p.config
    rows = [
        ("model", cfg.get("model")),
        ("device", cfg.get("device")),
        ("batch", cfg.get("batch")),
        ("imgsz", cfg.get("imgsz")),
        ("amp", cfg.get("amp")),
        ("workers", cfg.get("workers")),
        ("step", _fmt(p.step_ms, " ms")),
        ("img/s", _fmt(p.img_per_s)),
        (
            "data wait",
            f"{_fmt(p.dataload_ms, ' ms')} "
            f"({_fmt(100 * (p.dataload_frac or 0), '%', 0)})",
        ),
        ("utilisation", p.utilisation),
        ("GPU busy", _fmt(p.gpu_busy_ms_per_step, " ms/step")),
        ("kernels/step", _fmt(p.kernels_per_step, "", 0)),
        ("host overhead", _fmt(p.host_overhead_ms_per_step, " ms/step")),
        ("Tensor Cores", _fmt(p.tensorcore_pct, "%", 0)),
        ("peak VRAM", _fmt(p.peak_vram_mb, " MB", 0)),
        (
            "CPU ops",
            f"{_fmt(p.cpu_ops_ms_per_step, ' ms/step')}, "
            f"{_fmt(p.ops_per_step, '/step', 0)}",
        ),
    ]
    conf, load = p.confidence, p.load

    def pct(v: Any) -> str:
        return "n/a" if v is None else f"{100 * v:.0f}%"

    rows += [
        ("spread (CV)", f"step {pct(conf and conf.step_ms_cv)}, data wait "
                        f"{pct(conf and conf.dataload_ms_cv)}"),
        ("machine load", f"others {pct(load and load.other_cpu_frac)} of the CPU, load average "
                         f"{_fmt(load and load.loadavg_1m)}"),
    ]
    if conf is None:
        sure = "confidence: not recorded"
    elif conf.reliable:
        sure = "confidence: reliable (steady steps, no competing load)"
    else:
        sure = "UNRELIABLE: " + "; ".join(conf.reasons) + (
            f". {conf.advice}" if conf.advice else "")
    table = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows
    )
    cats = "".join(
        f'<div class="bar"><span style="width:{min(c["pct"], 100):.1f}%"></span>'
        f"<b>{html.escape(c['name'])}</b><em>{c['pct']:.1f}%</em></div>"
        for c in p.categories
    )
    gpu = bool(p.top_kernels)
    top = p.top_kernels if gpu else p.ops[:8]
    key, share = ("kernel", "pct_of_gpu") if gpu else ("op", "pct_of_cpu_ops")
    tops = "".join(
        f'<tr><td title="{html.escape(str(r.get("raw_name", r[key])))}">'
        f"{html.escape(str(r[key]))[:48]}</td><td>{r['ms_per_step']:.3f}</td>"
        f"<td>{r[share]:.1f}%</td></tr>"
        for r in top
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in p.notes)
    return (
        f'<div class="verdict v-{html.escape(str(p.verdict).replace("/", "-"))}">'
        '<div class="label">verdict</div>'
        f'<div class="bound">{html.escape(str(p.verdict))}</div>'
        f"<p>{html.escape(str(p.bound_why))}</p>"
        f'<p class="lever"><b>lever:</b> {html.escape(str(p.levers if "levers" in p.model_fields_set else ""))}</p>'
        f'<p class="confidence">{html.escape(sure)}</p></div>'
        f'<table class="figs">{table}</table>'
        f'<h3>per-step phases (wall ms)</h3><canvas id="steps" height="150"></canvas>'
        '<p class="caption" id="steps-caption"></p>'
        f"<h3>{'kernel' if gpu else 'CPU op'} mix</h3>{cats or '<p>n/a</p>'}"
        f"<h3>top {'kernels' if gpu else 'CPU ops'} (ms/step)</h3>"
        f'<table class="top">{tops or "<tr><td>n/a</td></tr>"}</table>'
        f'<ul class="notes">{notes}</ul>'
    )


_CSS = """
body{margin:0;font:13px system-ui,sans-serif;color:#222;display:flex;height:100vh;overflow:hidden}
#side{width:360px;overflow:auto;padding:10px;border-right:1px solid #ccc;background:#fafafa}
#main{flex:1;display:flex;flex-direction:column;min-width:0}
#bar{padding:6px 10px;border-bottom:1px solid #ddd;background:#f3f3f3}
#wrap{flex:1;position:relative;overflow:auto}#tl{display:block}
#tip{position:fixed;pointer-events:none;background:#222;color:#fff;padding:4px 6px;
 border-radius:3px;
 font-size:12px;display:none;max-width:520px;white-space:pre-wrap;z-index:9}
.verdict{border-radius:6px;padding:8px;background:#e8eefc;border-left:6px solid #3a63c8}
.v-dataloader{background:#fdf1e2;border-color:#e08a1e}.v-compute{background:#e6f6ea;border-color:#2e9a4a}
.v-memory-pressure{background:#fbe5e5;border-color:#c83a3a}.v-mixed{background:#eee;border-color:#888}
.label{font-size:11px;text-transform:uppercase;color:#555}.bound{font-size:22px;font-weight:700}
table{border-collapse:collapse;width:100%;margin-top:8px}th,td{text-align:left;padding:2px 4px;
 border-bottom:1px solid #eee;font-weight:normal}th{color:#555}
.bar{position:relative;display:flex;align-items:center;height:18px;margin:2px 0;background:#eee}
.bar span{position:absolute;left:0;top:0;bottom:0;background:#9cb6ec}
.bar b{position:relative;font-weight:600;margin-left:4px;flex:1;min-width:0;overflow:hidden;
 text-overflow:ellipsis;white-space:nowrap}
.bar em{position:relative;font-style:normal;margin:0 4px 0 8px}
.caption{margin:2px 0 0;font-size:11px;color:#555}
h3{margin:12px 0 4px;font-size:13px}#steps{width:100%}.notes{color:#555;padding-left:18px}
"""

_JS = r"""
(function(){
const D=JSON.parse(document.getElementById('data').textContent);
const P=D.profile, T=D.timeline, names=T.names;
const COL={dataload:'#e08a1e',to_device:'#8e6bd1',forward:'#3a63c8',backward:'#2e9a4a',
 optimizer:'#c83a3a',ema:'#b0a020',preprocess:'#7aa',postprocess:'#a77'};
function hash(s){let h=0;for(let i=0;i<s.length;i++)h=(h*31+s.charCodeAt(i))|0;return h;}
function colour(n){if(n.startsWith('step/'))return COL[n.slice(5)]||'#777';
 const h=Math.abs(hash(n))%360;return 'hsl('+h+',55%,62%)';}
const laneNames=Object.keys(T.lanes);const LABEL=110,TOP=20,GAP=8;let LH=16,y=TOP;
const lanes=[];
for(const ln of laneNames){const ev=T.lanes[ln];let rows=1;
 for(const e of ev)rows=Math.max(rows,e[3]+1);lanes.push({name:ln,ev:ev,y:0,rows:rows});}
// rows share the window's height (16 to 120 px each); a CPU op's row is its call depth
function layout(h){const rows=lanes.reduce((n,L)=>n+L.rows,0)||1;
 LH=Math.max(16,Math.min(120,Math.floor((h-TOP-GAP*lanes.length-10)/rows)));y=TOP;
 for(const L of lanes){L.y=y;y+=L.rows*LH+GAP;}}
function rowLabel(L,r){return r===0?L.name:(L.name==='CPU ops'?'  called at depth '+r:'  row '+(r+1));}
const cv=document.getElementById('tl'),ctx=cv.getContext('2d'),wrap=document.getElementById('wrap');
const tip=document.getElementById('tip');
let span=Math.max(T.span_us,1),v0=0,v1=span,flows=true;
function W(){return cv.clientWidth-LABEL;}
function X(t){return LABEL+(t-v0)/(v1-v0)*W();}
function resize(){layout(wrap.clientHeight);cv.style.width='100%';cv.width=wrap.clientWidth;
 cv.height=Math.max(y+10,60);
 cv.style.height=cv.height+'px';draw();}
function draw(){ctx.clearRect(0,0,cv.width,cv.height);ctx.font='11px sans-serif';
 ctx.fillStyle='#999';for(const s of T.steps){const x=X(s);if(x>=LABEL&&x<=cv.width){
  ctx.fillRect(x,0,1,cv.height);}}
 ctx.fillStyle='#333';ctx.fillText(((v1-v0)/1000).toFixed(2)+' ms visible',LABEL+4,12);
 for(const L of lanes){ctx.fillStyle='#f4f4f4';ctx.fillRect(0,L.y,cv.width,L.rows*LH);
  ctx.fillStyle='#333';for(let r=0;r<L.rows;r++)ctx.fillText(rowLabel(L,r),4,L.y+r*LH+LH/2+4);
  for(const e of L.ev){if(e[0]+e[1]<v0||e[0]>v1)continue;const x=Math.max(X(e[0]),LABEL);
   const w=Math.max(X(e[0]+e[1])-x,1);ctx.fillStyle=colour(names[e[2]]);
   ctx.fillRect(x,L.y+e[3]*LH+1,w,LH-2);
   if(w>40){ctx.fillStyle='#000';ctx.save();ctx.beginPath();ctx.rect(x,L.y+e[3]*LH,w,LH);ctx.clip();
    ctx.fillText(names[e[2]],x+2,L.y+e[3]*LH+LH/2+4);ctx.restore();}}}
 const ops=lanes.find(l=>l.name==='CPU ops')||lanes[0],gk=lanes.find(l=>l.name==='GPU kernels');
 if(flows&&gk&&ops){ctx.strokeStyle='rgba(200,60,60,.35)';ctx.beginPath();
  for(const f of T.flows){if(f[1]<v0||f[0]>v1)continue;ctx.moveTo(X(f[0]),ops.y);
   ctx.lineTo(X(f[1]),gk.y);}ctx.stroke();}}
function hit(mx,my){for(const L of lanes){if(my<L.y||my>L.y+L.rows*LH)continue;
 const row=Math.floor((my-L.y)/LH);const t=v0+(mx-LABEL)/W()*(v1-v0);let best=null;
 for(const e of L.ev){if(e[3]===row&&e[0]<=t&&t<=e[0]+e[1]){best=e;}}
 if(!best){const tol=3/W()*(v1-v0);
  for(const e of L.ev){if(e[3]===row&&e[0]-tol<=t&&t<=e[0]+e[1]+tol){best=e;break;}}}
 return best?[L,best]:null;}return null;}
cv.addEventListener('wheel',ev=>{ev.preventDefault();const r=cv.getBoundingClientRect();
 const t=v0+(ev.clientX-r.left-LABEL)/W()*(v1-v0);const k=ev.deltaY>0?1.25:0.8;
 v0=Math.max(0,t-(t-v0)*k);v1=Math.min(span,t+(v1-t)*k);if(v1-v0<1){v1=v0+1;}draw();},{passive:false});
let drag=null;cv.addEventListener('mousedown',ev=>{drag={x:ev.clientX,a:v0,b:v1};});
window.addEventListener('mouseup',()=>{drag=null;});
cv.addEventListener('mousemove',ev=>{const r=cv.getBoundingClientRect();
 if(drag){const dt=(ev.clientX-drag.x)/W()*(drag.b-drag.a);let a=drag.a-dt,b=drag.b-dt;
  if(a<0){b-=a;a=0;}if(b>span){a-=b-span;b=span;}v0=Math.max(a,0);v1=b;draw();return;}
 const h=hit(ev.clientX-r.left,ev.clientY-r.top);if(!h){tip.style.display='none';return;}
 tip.textContent=names[h[1][2]]+'\n'+h[0].name+': '+(h[1][1]/1000).toFixed(3)+' ms at '+
  (h[1][0]/1000).toFixed(3)+' ms';
 tip.style.left=(ev.clientX+12)+'px';tip.style.top=(ev.clientY+12)+'px';
 tip.style.display='block';});
cv.addEventListener('mouseleave',()=>{tip.style.display='none';});
cv.addEventListener('dblclick',()=>{v0=0;v1=span;draw();});
document.getElementById('flows').addEventListener('change',ev=>{flows=ev.target.checked;draw();});
document.getElementById('reset').addEventListener('click',()=>{v0=0;v1=span;draw();});
window.addEventListener('resize',resize);resize();
const sc=document.getElementById('steps');
if(sc){const c=sc.getContext('2d');sc.width=sc.clientWidth||330;
 const st=(P.steps||[]).filter(s=>s.kind!=='warmup');const mx=Math.max(1,...st.map(s=>s.wall_ms));
 const bw=Math.max(2,Math.floor((sc.width-10)/Math.max(st.length,1))-2);
 st.forEach((s,i)=>{let yy=sc.height-14;const x=4+i*(bw+2);
  const parts=[['dataload',s.dataload_ms]].concat(Object.entries(s.phases));let used=0;
  for(const [n,ms] of parts){const h=ms/mx*(sc.height-16);c.fillStyle=COL[n]||'#777';
   c.fillRect(x,yy-h,bw,h);yy-=h;used+=ms;}
  const rest=Math.max(s.wall_ms-used,0)/mx*(sc.height-16);
  c.fillStyle='#ccc';c.fillRect(x,yy-rest,bw,rest);
  c.fillStyle=s.kind==='synced'?'#3a63c8':'#e08a1e';c.fillRect(x,sc.height-10,bw,4);});
 document.getElementById('steps-caption').textContent='one bar per step; tallest '+
  mx.toFixed(1)+' ms; underline: orange = unsynced step, blue = synced step';}
const leg=document.getElementById('legend');
for(const k in COL){const s=document.createElement('span');
 s.style.cssText='display:inline-block;margin-right:8px';
 const i=document.createElement('i');
 i.style.cssText='display:inline-block;width:10px;height:10px;background:'+COL[k];
 s.appendChild(i);s.appendChild(document.createTextNode(' '+k));leg.appendChild(s);}
})();
"""


def render_timeline(profile: ProfileRecord | Mapping[str, Any],
                    trace: Mapping[str, Any] | None) -> str:
    """The HTML text of ``timeline.html`` for ``profile`` (a record or ``profile.json``'s
    JSON; and its trace, if any)."""
    rec = ProfileRecord.of(profile)
    tl = timeline_data(trace)
    data = json.dumps(
        {"profile": {"bound": rec.verdict, "steps": rec.steps}, "timeline": tl},
        separators=(",", ":"),
    )
    data = data.replace("<", "\\u003c")  # only inside JSON strings: no "</script>" can appear
    title = html.escape(f"{rec.model or 'profile'} — {rec.verdict}")
    counts = ", ".join(f"{k}: {len(v)}" for k, v in tl["lanes"].items()) or "no trace events"
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>LibreYOLO profile: {title}</title><style>{_CSS}</style></head><body>"
        f'<div id="side"><h2 style="margin:0 0 8px">{title}</h2>{_panel(rec)}</div>'
        '<div id="main"><div id="bar">wheel: zoom · drag: pan · double-click: reset · '
        '<label><input type="checkbox" id="flows" checked> launch flows</label> '
        f'<button id="reset">reset</button> <span style="color:#666">{html.escape(counts)}'
        "; full trace: profile_trace.json.gz (Perfetto, ui.perfetto.dev, opens it as is)</span>"
        '<div id="legend"></div></div>'
        '<div id="wrap"><canvas id="tl"></canvas></div></div><div id="tip"></div>'
        f'<script type="application/json" id="data">{data}</script>'
        f"<script>{_JS}</script></body></html>"
    )


def write_timeline(path: Path, profile: ProfileRecord | Mapping[str, Any],
                   trace: Mapping[str, Any] | None) -> None:
    """Write ``timeline.html`` (see :func:`render_timeline`)."""
    path.write_text(render_timeline(profile, trace), encoding="utf-8")
