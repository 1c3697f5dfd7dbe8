"""ONNX export, checked by onnxruntime before the file is kept.

:func:`export_onnx` traces :class:`~libreyolo_core.export.graph.ExportGraph` with
``torch.onnx.export`` (the TorchScript exporter: dynamic axes and torchvision's NMS
symbolic), writes it to a temporary file beside the target, optionally simplifies it
(onnxslim, else onnxsim, when installed), runs it in onnxruntime's CPU provider on an
input made for the check and compares every output with the same graph in PyTorch eval
mode. The figure is the worst ``|ort - torch| / (1 + |torch|)`` over every output element:
an absolute difference for scores and probabilities (in [0, 1]), a relative one for box
coordinates in pixels and for raw logits (float32 rounding grows with the magnitude: a
640-pixel box is only good to ~1e-4 px). Within tolerance (1e-4 float32; 1e-2 float16) the
file takes its final name; otherwise it is deleted and
:class:`ExportCheckError` carries the figure. The file's metadata (``metadata_props``)
names the classes, ``imgsz``, the model, the layout and the check figure, so the file is
self-describing (:func:`read_metadata`).
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo_core.export.graph import ExportGraph, output_names

__all__ = ["ExportError", "ExportCheckError", "ExportResult", "export_onnx", "read_metadata",
           "require_onnx", "ONNX_INSTALL", "FP32_TOLERANCE", "FP16_TOLERANCE"]

log = logging.getLogger(__name__)

#: the one line that says what to install
ONNX_INSTALL = "ONNX export needs onnx and onnxruntime: pip install 'libreyolo-service[onnx]'"
#: maximum of |ort - torch| / (1 + |torch|) for a float32 export
FP32_TOLERANCE = 1e-4
#: the same for a float16 export
FP16_TOLERANCE = 1e-2
#: the opset used when none is asked for
DEFAULT_OPSET = 17


class ExportError(RuntimeError):
    """An export that cannot be made (missing package, bad option, exporter failure)."""


class ExportCheckError(ExportError):
    """The exported file's outputs differ from PyTorch's beyond tolerance; no file was kept.

    Attributes:
        max_diff: the worst difference found; tolerance: the limit it broke.
    """

    def __init__(self, message: str, max_diff: float, tolerance: float):
        super().__init__(message)
        self.max_diff, self.tolerance = max_diff, tolerance


@dataclass(frozen=True)
class ExportResult:
    """What an export made.

    Attributes:
        path: the ONNX file. format: ``onnx``. max_diff: the check's worst difference
        (``|ort - torch| / (1 + |torch|)``). tolerance: its limit. check_shape: the input
        ``(B, 3, H, W)`` it was checked on. layout: ``raw`` or ``nms``. outputs: output names.
        seconds: wall time of export + check.
    """

    path: str
    format: str
    model: str
    imgsz: int
    dynamic: bool
    half: bool
    opset: int
    layout: str
    outputs: list[str]
    max_diff: float
    tolerance: float
    check_shape: list[int]
    simplified: str | None
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def require_onnx() -> tuple[Any, Any]:
    """``(onnx, onnxruntime)`` modules.

    Raises:
        ExportError: one of them is not installed (:data:`ONNX_INSTALL`).
    """
    try:
        import onnx
        import onnxruntime
    except ImportError:
        raise ExportError(ONNX_INSTALL) from None
    return onnx, onnxruntime


def _check_input(batch: int, h: int, w: int) -> torch.Tensor:
    """The check's input, ``uint8 (batch, 3, h, w)``: a seeded synthetic scene (smooth
    colour gradients, a few solid boxes, mild noise) rather than white noise, which no
    camera makes and which drives a network's logits far outside what it was trained on
    (where float32 itself is no longer good to 1e-4)."""
    gen = torch.Generator().manual_seed(0)
    yy = torch.linspace(0, 1, h)[:, None]
    xx = torch.linspace(0, 1, w)[None, :]
    out = torch.empty(batch, 3, h, w)
    for b in range(batch):
        phase = torch.rand(3, generator=gen) * 6.28
        for c in range(3):
            out[b, c] = 128 + 60 * torch.sin(6.0 * xx + 4.0 * yy * (c + 1) + phase[c] + b)
        for _ in range(4):
            y0, x0 = (torch.rand(2, generator=gen) * torch.tensor([h * 0.7, w * 0.7])).long().tolist()
            dy, dx = max(h // 6, 2), max(w // 5, 2)
            out[b, :, y0: y0 + dy, x0: x0 + dx] = torch.rand(3, 1, 1, generator=gen) * 255
    out += torch.randn(out.shape, generator=gen) * 8
    return out.clamp(0, 255).round().to(torch.uint8)


def _diff(got: np.ndarray, ref: np.ndarray, half: bool) -> float:
    if got.shape != ref.shape:
        return float("inf")
    if got.size == 0:
        return 0.0
    got64, ref64 = got.astype(np.float64), ref.astype(np.float64)
    same = (got64 == ref64) | (np.isnan(got64) & np.isnan(ref64))  # equal infinities too
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(got64 - ref64) / (1.0 + np.abs(ref64))
    err = np.where(same, 0.0, np.where(np.isfinite(err), err, np.inf))
    return float(err.max())


def _canonical(dets: np.ndarray) -> np.ndarray:
    """``nms`` rows in one order whatever the NMS kernel's tie order: image, then
    descending score, then the box."""
    if dets.size == 0:
        return dets
    keys = [dets[:, c] for c in (4, 3, 2, 1)] + [-dets[:, 5], dets[:, 0]]
    return dets[np.lexsort(keys)]


def _simplify(path: Path, how: str | bool | None) -> str | None:
    """Simplify ``path`` in place with onnxslim, else onnxsim; ``how`` ``None`` (auto: when
    installed), False (never), True (must: raise when neither is installed), or the tool's
    name. Returns the tool used."""
    if how is False:
        return None
    import onnx

    tools = ["onnxslim", "onnxsim"] if how in (None, True) else [str(how)]
    for tool in tools:
        try:
            module = __import__(tool)
        except ImportError:
            continue
        if tool == "onnxslim":
            model = module.slim(str(path))
        else:
            model, ok = module.simplify(onnx.load(str(path)))
            if not ok:
                raise ExportError(f"onnxsim could not validate the simplified {path.name}")
        onnx.save(model, str(path))
        return tool
    if how is None:
        return None
    raise ExportError(f"simplify={how} needs onnxslim or onnxsim: pip install onnxslim")


def _check_options(family: Any, *, opset: int, half: bool, imgsz: int) -> None:
    """Refuse export options that cannot work (raises :class:`ExportError`)."""
    if opset < 11:
        raise ExportError(f"opset={opset}: the export needs opset >= 11")
    if half and family.name == "yolo9":
        raise ExportError("half=true is not supported for YOLOv9 yet (the TorchScript exporter "
                          "fails on its float16 head: 'tensor does not have a device'); export "
                          "float32 (half=false)")
    if imgsz % family.stride:
        raise ExportError(f"imgsz={imgsz} must be a multiple of the stride {family.stride}")


def _dynamic_axes(layout: str, outputs: list[str], dynamic: bool) -> dict[str, dict[int, str]] | None:
    """``torch.onnx.export``'s ``dynamic_axes``: batch, height and width of the input and the
    matching output axes when ``dynamic``; the ``nms`` layout's detection count always."""
    if not dynamic:
        return {"detections": {0: "detections"}} if layout == "nms" else None
    axes = {"images": {0: "batch", 2: "height", 3: "width"}}
    if layout == "nms":
        axes["detections"] = {0: "detections"}
        return axes
    axes["decoded"] = {0: "batch", 2: "anchors"}
    for name in outputs[1:]:
        axes[name] = {0: "batch", 2: f"{name}_h", 3: f"{name}_w"}
    return axes


def export_onnx(
    model: torch.nn.Module,
    family: Any,
    path: str | Path,
    *,
    names: dict[int, str],
    model_name: str,
    imgsz: int,
    dynamic: bool = False,
    half: bool = False,
    opset: int | None = None,
    nms: bool = False,
    simplify: str | bool | None = None,
    conf: float = 0.25,
    iou: float = 0.45,
    max_det: int = 300,
    batch: int = 1,
) -> ExportResult:
    """Export ``model`` to ``path`` as ONNX and check it in onnxruntime (module docstring).

    Args:
        model: the family's network (not changed: a copy is exported).
        family: its family (``preprocess``, ``name``, ``stride``).
        path: the ``.onnx`` file to write (its folder is created).
        names: class id -> name (into the metadata). model_name: ``yolo9-t``...
        imgsz: square input size in pixels (a multiple of the stride); the traced and
            checked size of a static export.
        dynamic: batch, height and width are dynamic axes (otherwise fixed to
            ``(batch, 3, imgsz, imgsz)``).
        half: float16 network (input stays uint8, outputs float32).
        opset: ONNX opset (default 17). nms: the ``nms`` layout (final detections) instead
            of ``raw``. simplify: see :func:`_simplify`.
        conf, iou, max_det: the ``nms`` layout's thresholds, fixed in the graph.

    Returns:
        :class:`ExportResult` (also logged in one line with the check figure).

    Raises:
        ExportError: onnx / onnxruntime missing, a bad option, or the exporter failing.
        ExportCheckError: the check failed (no file is left at ``path``).
    """
    onnx, ort = require_onnx()
    t0 = time.perf_counter()
    path = Path(path)
    opset = int(opset or DEFAULT_OPSET)
    _check_options(family, opset=opset, half=half, imgsz=imgsz)
    import copy

    net = copy.deepcopy(model).cpu().eval()
    net = net.half() if half else net.float()
    layout = "nms" if nms else "raw"
    graph = ExportGraph(net, family, layout, half=half, conf=conf, iou=iou, max_det=max_det).eval()
    outputs = output_names(layout)
    axes = _dynamic_axes(layout, outputs, dynamic)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    trace_input = _check_input(batch, imgsz, imgsz)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the TorchScript exporter's tracer and deprecation notes
            torch.onnx.export(graph, (trace_input,), str(tmp), dynamo=False, opset_version=opset,
                              input_names=["images"], output_names=outputs, dynamic_axes=axes,
                              do_constant_folding=True)
        simplified = _simplify(tmp, simplify)
        # the check: another batch and size than the trace's when the axes are dynamic
        check = (_check_input(2, imgsz + family.stride, imgsz) if dynamic else trace_input)
        with torch.no_grad():
            ref = graph(check)
        refs = [r.numpy() for r in (ref if isinstance(ref, tuple) else (ref,))]
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(str(tmp), options, providers=["CPUExecutionProvider"])
        got = session.run(None, {"images": check.numpy()})
        if layout == "nms":
            got, refs = [_canonical(got[0])], [_canonical(refs[0])]
        diffs = {n: _diff(g, r, half) for n, g, r in zip(outputs, got, refs, strict=True)}
        max_diff = max(diffs.values())
        tolerance = FP16_TOLERANCE if half else FP32_TOLERANCE
        if not max_diff <= tolerance:
            worst = max(diffs, key=lambda n: diffs[n])
            raise ExportCheckError(
                f"ONNX check failed for {path.name}: onnxruntime differs from PyTorch by "
                f"{max_diff:.3g} on {worst!r} (tolerance {tolerance:g}); no file written",
                max_diff, tolerance)
        meta = {
            "libreyolo_model": model_name, "family": family.name, "names": json.dumps(
                {str(k): v for k, v in sorted(names.items())}),
            "nc": str(len(names)), "imgsz": str(imgsz), "stride": str(family.stride),
            "layout": layout, "input": "images uint8 (B, 3, H, W) RGB, letterboxed (pad 114)",
            "outputs": ",".join(outputs), "dynamic": str(dynamic).lower(), "half": str(half).lower(),
            "check_max_diff": f"{max_diff:.6g}", "check_tolerance": f"{tolerance:g}",
        }
        if layout == "nms":
            meta.update({"conf": str(conf), "iou": str(iou), "max_det": str(max_det)})
        proto = onnx.load(str(tmp))
        del proto.metadata_props[:]
        for key, value in meta.items():
            entry = proto.metadata_props.add()
            entry.key, entry.value = key, value
        proto.producer_name = "libreyolo"
        onnx.save(proto, str(tmp))
        os.replace(tmp, path)
    except ExportError:
        raise
    except Exception as exc:  # the exporter or onnxruntime failed: one error naming it
        raise ExportError(f"ONNX export of {model_name} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    result = ExportResult(str(path), "onnx", model_name, imgsz, dynamic, half, opset, layout,
                          outputs, max_diff, tolerance, list(check.shape), simplified,
                          round(time.perf_counter() - t0, 3))
    log.info("export: %s -> %s (%s layout, opset %d%s%s%s); onnxruntime check on %s: max diff "
             "%.3g (tolerance %g)", model_name, path, layout, opset, ", dynamic" if dynamic else "",
             ", fp16" if half else "", f", simplified by {simplified}" if simplified else "",
             "x".join(map(str, check.shape)), max_diff, tolerance)
    return result


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata an export wrote into ``path`` (``names`` as ``{int: str}``, ``imgsz``
    and ``nc`` as ints, the rest as strings).

    Raises:
        ExportError: onnx is not installed. FileNotFoundError: no such file.
    """
    onnx, _ = require_onnx()
    if not Path(path).is_file():
        raise FileNotFoundError(f"no ONNX file at {path}")
    proto = onnx.load(str(path), load_external_data=False)
    meta: dict[str, Any] = {p.key: p.value for p in proto.metadata_props}
    if "names" in meta:
        meta["names"] = {int(k): v for k, v in json.loads(meta["names"]).items()}
    for key in ("imgsz", "nc", "stride"):
        if key in meta:
            meta[key] = int(meta[key])
    return meta
