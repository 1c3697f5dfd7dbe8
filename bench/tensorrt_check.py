"""TensorRT build and compare of an exported ONNX file (a ``make gpu-check`` check).

Exports ``--model`` (freshly built; raw layout, static ``--imgsz``) with our checked ONNX
export, builds a TensorRT engine from the file (TF32 off, so float32 stays float32), runs
it on the export check's input on the GPU and compares every output with PyTorch eval mode
on the same GPU, with the export check's figure ``|trt - torch| / (1 + |torch|)``.

Prints ONE JSON line: ``{"ok", "max_diff", "tolerance", "trt", ...}``; without TensorRT
(or without a GPU) ``{"ok": true, "skipped": "<why>"}``, exit 0.

Usage: ``python bench/tensorrt_check.py [--model yolox-n] [--imgsz 320] [--tolerance 1e-3]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="yolox-n")
    ap.add_argument("--imgsz", type=int, default=320)
    ap.add_argument("--tolerance", type=float, default=1e-3)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch

    if not torch.cuda.is_available():
        print(json.dumps({"ok": True, "skipped": "no GPU"}))
        return 0
    try:
        import tensorrt as trt
    except ImportError:
        print(json.dumps({"ok": True, "skipped": "tensorrt not installed"}))
        return 0
    from libreyolo_core.export.onnx import _check_input, _diff
    from libreyolo_core.facade import LibreYOLO

    yolo = LibreYOLO(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        result = yolo.export(file=Path(tmp) / "m.onnx", imgsz=args.imgsz)
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse(Path(result.path).read_bytes()):
            errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
            print(json.dumps({"ok": False, "stage": "parse", "errors": errors}))
            return 1
        config = builder.create_builder_config()
        config.clear_flag(trt.BuilderFlag.TF32)
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            print(json.dumps({"ok": False, "stage": "build"}))
            return 1
    engine = trt.Runtime(logger).deserialize_cuda_engine(plan)
    context = engine.create_execution_context()
    x = _check_input(1, args.imgsz, args.imgsz)
    net = yolo.model.cuda().eval()
    with torch.no_grad():
        decoded, maps = net(yolo.family.preprocess(x.cuda()))
    refs = {"decoded": decoded.float(), "p3": maps[0], "p4": maps[1], "p5": maps[2]}
    buffers = {"images": x.cuda().contiguous()}
    for name, ref in refs.items():
        buffers[name] = torch.empty_like(ref, dtype=torch.float32)
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        context.set_tensor_address(name, buffers[name].data_ptr())
    stream = torch.cuda.current_stream()
    context.execute_async_v3(stream.cuda_stream)
    stream.synchronize()
    diffs = {n: _diff(buffers[n].cpu().numpy(), r.float().cpu().numpy(), False) for n, r in refs.items()}
    worst = max(diffs.values())
    print(json.dumps({"ok": worst <= args.tolerance, "max_diff": worst, "tolerance": args.tolerance,
                      "diffs": diffs, "trt": trt.__version__, "model": args.model,
                      "imgsz": args.imgsz, "onnx_check_max_diff": result.max_diff}))
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
