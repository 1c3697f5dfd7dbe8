"""Help texts of the ``libreyolo`` command line (``libreyolo help``, ``<command> --help``).

Shaped like ``yolo help``: the syntax, one line per command, examples; a command's help
gives its one-line description, its most used keys (training keys with the default and
description from :class:`~libreyolo_core.config.TrainConfig`, so they never drift) and
examples. ``libreyolo cfg`` prints every training key.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HELP_WORDS", "CommandHelp", "COMMAND_HELP", "general_help", "command_help"]

#: Arguments that ask for help instead of running.
HELP_WORDS = ("help", "-h", "--help")


@dataclass(frozen=True)
class CommandHelp:
    """One command's help: a one-line summary, its keys ``(name, description)`` (a training
    key with no description takes TrainConfig's, with its default), and example lines."""

    summary: str
    keys: tuple[tuple[str, str], ...]
    examples: tuple[str, ...]


_TRAIN_KEYS = ("model", "data", "epochs", "imgsz", "batch", "device", "workers", "lr0",
               "patience", "resume", "project", "name")

COMMAND_HELP: dict[str, CommandHelp] = {
    "train": CommandHelp(
        "train a detector on a YOLO-format dataset (writes runs/train/exp*/weights/best.pt)",
        tuple((k, "") for k in _TRAIN_KEYS),
        ("libreyolo train model=yolo9-t data=coco128.yaml epochs=10 imgsz=320",
         "libreyolo train data=my.yaml epochs=100 batch=32 device=0",
         "libreyolo train resume=runs/train/exp/weights/last.pt",
         "libreyolo train data=my.yaml epochs=100 preflight=True   # estimate the run first",
         "torchrun --nproc_per_node=2 -m libreyolo_core.cli train data=my.yaml batch=32")),
    "val": CommandHelp(
        "measure precision, recall, mAP50 and mAP50-95 of a model on a dataset split; print the "
        "per-class table and write the report (runs/val/exp*: report.json, predictions.json, "
        "curves, confusion matrices, pictures of detections)",
        (("model", "model name or checkpoint .pt (default yolo9-t)"),
         ("data", "dataset yaml (required)"), ("split", "val (default), train or test"),
         ("imgsz", "input size, pixels"), ("batch", "images per batch"),
         ("conf", "score threshold"), ("iou", "NMS IoU threshold"),
         ("device", "auto, cpu, 0, cuda:0"), ("json", "true: print the metrics as JSON"),
         ("save", "false: no report folder"), ("plots", "false: report.json and predictions.json only"),
         ("plot_images", "images drawn with their detections (default 16)"),
         ("project", "parent folder (default runs/val)"), ("name", "folder name (default exp)")),
        ("libreyolo val model=runs/train/exp/weights/best.pt data=coco128.yaml",
         "libreyolo val model=best.pt data=my.yaml split=test json=true")),
    "predict": CommandHelp(
        "detect objects in images or videos; print the boxes, and save annotated images or "
        "video, labels and COCO JSON when asked (runs/predict/exp*)",
        (("model", "model name or checkpoint .pt (default yolo9-t)"),
         ("source", "an image, a folder, a glob, a list file (.txt) or a video (required)"),
         ("conf", "score threshold"), ("iou", "NMS IoU threshold"),
         ("imgsz", "input size, pixels"), ("max_det", "boxes per image at most"),
         ("device", "auto, cpu, 0, cuda:0"),
         ("save", "true: annotated images / video"), ("save_txt", "true: YOLO label files"),
         ("save_conf", "true: a score column in the label files"),
         ("save_json", "true: predictions.json (COCO results)"),
         ("project", "parent folder (default runs/predict)"), ("name", "folder name (default exp)"),
         ("json", "true: one JSON line per image (boxes xyxy, scores, classes, names)")),
        ("libreyolo predict model=best.pt source=images/ conf=0.4 save=true",
         "libreyolo predict model=best.pt source=clip.mp4 save=true save_json=true",
         "libreyolo predict model=best.pt source=bus.jpg json=true > boxes.jsonl")),
    "export": CommandHelp(
        "export a model to ONNX, checked by onnxruntime against PyTorch before it is kept",
        (("model", "model name or checkpoint .pt (default yolo9-t)"),
         ("format", "onnx (default)"), ("file", "output path (default: the .pt with .onnx)"),
         ("imgsz", "input size, pixels (default: the training size)"),
         ("dynamic", "true: dynamic batch, height and width"), ("half", "true: float16"),
         ("opset", "ONNX opset (default 17)"),
         ("nms", "true: final detections [image, x1, y1, x2, y2, score, cls] in the graph"),
         ("simplify", "onnxslim/onnxsim when installed (false: never)"),
         ("json", "true: print the result (path, check figure) as JSON")),
        ("libreyolo export model=best.pt format=onnx imgsz=640",
         "libreyolo export model=best.pt dynamic=true nms=true")),
    "profile": CommandHelp(
        "profile a short training window: time per phase, a verdict and the lever to try",
        (("run DATA", "profile a window of training steps: --model, --imgsz, --batch, --workers"),
         ("tune DATA", "profile, try the levers the verdict names (--repeat trials each), "
                       "recommend only gains beyond noise"),
         ("summary", "verdict, lever and the figures of a profile.json"),
         ("phases|kernels|ops", "tables of one profile"),
         ("get FIELD", "one figure, for scripts"),
         ("compare A B", "two profiles side by side")),
        ("libreyolo profile run coco128.yaml --model yolo9-t --imgsz 320 --batch 16",
         "libreyolo profile summary runs/train/exp/profile.json")),
    "cfg": CommandHelp(
        "print every training key, its value and where it came from (default, family, you)",
        (("any training key", "shows the config those keys resolve to"),),
        ("libreyolo cfg", "libreyolo cfg model=yolox-s epochs=50")),
    "checks": CommandHelp(
        "scan a dataset: images, labels and every defect, split by split",
        (("data", "dataset yaml (required)"), ("json", "true: one JSON report per split")),
        ("libreyolo checks data=coco128.yaml",)),
    "info": CommandHelp(
        "parameters and GFLOPs of a model",
        (("model", "model name or checkpoint .pt (default yolo9-t)"),
         ("imgsz", "input size for the GFLOPs, pixels")),
        ("libreyolo info model=yolox-s imgsz=640",)),
    "version": CommandHelp("print the libreyolo version", (), ("libreyolo version",)),
}


def _train_key_lines(names: tuple[str, ...]) -> list[str]:
    from libreyolo_core.config import TrainConfig

    fields = TrainConfig.model_fields
    width = max(len(n) for n in names)
    out = []
    for n in names:
        info = fields[n]
        out.append(f"  {n:<{width}}  {info.description} (default {info.default!r})")
    return out


def general_help() -> str:
    """``libreyolo help``: syntax, commands, examples, where to look next."""
    width = max(len(c) for c in COMMAND_HELP)
    lines = ["usage: libreyolo COMMAND key=value ...   (also --key value; key=none for None)",
             "", "commands:"]
    lines += [f"  {name:<{width}}  {h.summary}" for name, h in COMMAND_HELP.items()]
    lines += ["", "examples:"]
    lines += [f"  {h.examples[0]}" for h in COMMAND_HELP.values() if h.examples][:5]
    lines += ["", "libreyolo help COMMAND (or COMMAND --help): its keys and examples",
              "libreyolo cfg: every training key with its default and description",
              "exit codes: 0 ok, 1 runtime error, 2 usage or config error, 3 data error, "
              "4 model or checkpoint error, 143 stopped by SIGTERM (last.pt saved)"]
    return "\n".join(lines)


def command_help(command: str) -> str:
    """``libreyolo COMMAND --help``: summary, most used keys, examples.

    Raises:
        KeyError: ``command`` is not a command.
    """
    h = COMMAND_HELP[command]
    if command == "profile":
        usage = ("usage: libreyolo profile {run|tune|summary|phases|kernels|ops|get|compare} "
                 "--flag value ...   (`libreyolo profile run --help`: every flag)")
    else:
        usage = f"usage: libreyolo {command} key=value ..."
    lines = [usage, "", h.summary]
    if h.keys:
        label = {"train": "most used keys:", "profile": "subcommands:"}.get(command, "keys:")
        lines += ["", label]
        if command == "train":
            lines += _train_key_lines(tuple(k for k, _ in h.keys))
            lines += ["  (every other training key: `libreyolo cfg`)"]
        else:
            width = max(len(k) for k, _ in h.keys)
            lines += [f"  {k:<{width}}  {d}" for k, d in h.keys]
    if h.examples:
        lines += ["", "examples:"] + [f"  {e}" for e in h.examples]
    return "\n".join(lines)
