"""``libreyolo <command> key=value ...`` — LibreYOLO's command-line syntax.

Commands: ``train``, ``val``, ``predict``, ``export``, ``profile``, ``cfg``, ``checks``, ``info``,
``version``; ``libreyolo help [COMMAND]`` and ``COMMAND --help`` print their help
(:mod:`libreyolo_core.cli_help`).
``--key value`` works like ``key=value``; ``train spec=job.json`` reads a job spec written
by the service's worker (``kind`` train, profile, tune or predict).

Exit codes: 0 ok; 1 runtime error; 2 usage or config error (unknown key, bad value);
3 data error; 4 model / checkpoint error; 143 interrupted by SIGTERM (``last.pt`` saved; a
tune: ``tune.json`` written).
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from libreyolo_core.cli_errors import UsageError
from libreyolo_core.records.job import JOB_KINDS, JobSpec

#: Python's own warning format (dataset warnings get a shorter one, see :func:`main`)
_python_format_warning = warnings.formatwarning

__all__ = ["main", "parse_args", "UsageError"]

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, EXIT_DATA, EXIT_MODEL, EXIT_SIGTERM = 0, 1, 2, 3, 4, 143
#: seconds a torchrun rank other than 0 waits after a usage error, so that rank 0 prints it
RANK_USAGE_ERROR_GRACE_S = 10.0


COMMAND_KEYS: dict[str, set[str]] = {
    "val": {"model", "data", "split", "batch", "imgsz", "conf", "iou", "max_det", "device", "workers", "json",
            "save", "plots", "plot_images", "project", "name", "exist_ok"},
    "predict": {"model", "source", "conf", "iou", "imgsz", "max_det", "device", "json", "save", "save_txt",
                "save_conf", "save_json", "project", "name", "exist_ok"},
    "cfg": set(),  # any training key: the schema checks them
    "checks": {"data", "json", "cache_dir"},
    "info": {"model", "imgsz"},
    "export": {"model", "format", "file", "imgsz", "dynamic", "half", "opset", "nms", "simplify",
               "conf", "iou", "max_det", "batch", "json"},
    "version": set(),
}
COMMANDS = ("train", *COMMAND_KEYS, "profile")


def _value(text: str) -> Any:
    return None if text.strip().lower() in ("none", "null") else text


def parse_args(argv: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """Split ``[command, key=value | --key value | --flag ...]`` into the command and its keys.

    Values stay strings (``none``/``null`` become ``None``); the schema coerces them.

    Raises:
        UsageError: no or unknown command, or a malformed argument.
    """
    args = list(argv)
    if args and args[0] == "detect":
        args = args[1:]
    if not args or args[0] in ("-h", "--help", "help"):
        raise UsageError(f"usage: libreyolo {{{'|'.join(COMMANDS)}}} key=value ...")
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        close = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UsageError(f"unknown command {command!r}.{hint} Commands: {', '.join(COMMANDS)}")
    keys: dict[str, Any] = {}
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg.startswith("--"):
            name = arg[2:]
            if "=" in name:
                name, value = name.split("=", 1)
            elif i + 1 < len(rest) and not rest[i + 1].startswith("--") and "=" not in rest[i + 1]:
                value, i = rest[i + 1], i + 1
            elif name.startswith("no-"):
                name, value = name[3:], "false"
            else:
                value = "true"
        elif "=" in arg:
            name, value = arg.split("=", 1)
        else:
            raise UsageError(f"argument {arg!r} is not key=value (e.g. epochs=10)")
        keys[name.replace("-", "_")] = _value(value)
        i += 1
    return command, keys


def _check_keys(command: str, keys: dict[str, Any]) -> None:
    allowed = COMMAND_KEYS[command]
    for key in keys:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise UsageError(f"unknown key {key!r} for `libreyolo {command}`.{hint} "
                             f"Valid keys: {', '.join(sorted(allowed)) or '(none)'}")


def _typed(keys: dict[str, Any], types: dict[str, Callable[[str], Any]]) -> dict[str, Any]:
    """``keys`` with the listed ones converted; a value that does not convert, or an
    ``imgsz`` under 32, is a :class:`UsageError` naming the key."""
    out = dict(keys)
    for key, kind in types.items():
        if key not in out:
            continue
        try:
            out[key] = kind(out[key])
        except (TypeError, ValueError):
            what = {int: "an integer", float: "a number"}.get(kind, "true or false")  # type: ignore[call-overload]
            raise UsageError(f"{key}={out[key]!r} is not {what}") from None
    if "imgsz" in out and out["imgsz"] < 32:
        raise UsageError(f"imgsz={out['imgsz']} must be >= 32 (pixels)")
    return out


def _bool(v: Any) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


# -- commands ---------------------------------------------------------------------------------
def cmd_train(keys: dict[str, Any]) -> int:
    """``libreyolo train key=value ...`` (or ``spec=job.json``): train, or run the spec's
    predict / tune / profile job; prints the outcome line(s). Returns the exit code."""
    from libreyolo_core.config import resolve_config

    if "spec" in keys:
        spec_path = Path(keys.pop("spec"))
        spec = JobSpec.read(spec_path)
        if spec.kind not in JOB_KINDS:
            raise UsageError(f"{spec_path}: kind {spec.kind!r} is not one of {', '.join(JOB_KINDS)}")
        if spec.kind in ("predict", "tune"):
            return _run_spec_job(spec, keys)
        keys = _spec_keys(spec, keys)
    from libreyolo_core.distributed.batch import per_rank_batch
    from libreyolo_core.distributed.context import torchrun_env
    from libreyolo_core.facade import LibreYOLO, is_weights_path

    model = keys.pop("model", None) or "yolo9-t"
    if is_weights_path(model):  # fine-tune from a weights file
        yolo = LibreYOLO(model)
        cfg = resolve_config({**keys, "model": yolo.name})
    else:
        cfg = resolve_config({**keys, "model": model})  # every key checked before anything heavy
        yolo = LibreYOLO(model)
    if not cfg.data and not cfg.resume:  # a resumed run knows its data
        raise UsageError("libreyolo train needs data=path/to/data.yaml (or resume=path/to/last.pt)")
    env = torchrun_env()
    if env is not None and cfg.batch != -1 and not cfg.resume:  # before the dataset scan
        per_rank_batch(cfg.batch, env[2])
    result = yolo.train_resolved(cfg).to_dict()  # the keys resolved once, above
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun rank 0 reports for the job
        return EXIT_OK
    _print_train_result(result, cfg, fresh=not is_weights_path(model))
    return EXIT_OK


def _run_spec_job(spec: JobSpec, keys: dict[str, Any]) -> int:
    """A predict spec (a model on images: annotated images, ``predictions.json``) or a tune
    spec (several profile trials in this process, :mod:`libreyolo_core.profiler.tune`).

    Raises:
        UsageError: other keys beside ``spec=``.
    """
    if keys:
        raise UsageError(f"a {spec.kind} spec takes no other keys: {', '.join(keys)}")
    if spec.kind == "predict":
        from libreyolo_core.predict_job import run_predict_job

        return run_predict_job(spec)
    from libreyolo_core.profiler.tune import run_tune_job

    return run_tune_job(spec)


def _spec_keys(spec: JobSpec, keys: dict[str, Any]) -> dict[str, Any]:
    """The training keys of a train or profile spec: its params (a profile job: a window of
    real steps with augmentation on, then stop), its model, data, project, name, exist_ok
    and resume, then the command line's ``keys`` over them."""
    merged = dict(spec.params)
    if spec.kind == "profile":
        merged = {"no_aug_epochs": 0, "val": False, **merged, "profile": True,
                  "profile_then_stop": True}
    for k in ("model", "data", "project", "name", "exist_ok", "resume"):
        if getattr(spec, k) not in (None, ""):
            merged[k] = getattr(spec, k)
    return {**merged, **keys}


def _print_train_result(result: dict[str, Any], cfg: Any, fresh: bool) -> None:
    """The run's last lines: where the profile or the weights are, the best epoch's mAP
    (or that nothing was validated), and a note when a validated, not resumed run learned nothing."""
    if cfg.profile_then_stop:  # a profile job: a window of steps, no trained weights
        print(f"done: profile window measured; profile.json and timeline.html in "
              f"{result['save_dir']} (a profile run saves no weights)")
        return
    best = result["best_checkpoint"] if Path(result["best_checkpoint"]).is_file() else None
    weights = best or (result["last_checkpoint"] if Path(result["last_checkpoint"]).is_file()
                       else "none saved")
    if cfg.val:
        score = (f"best epoch {result['best_epoch']} mAP50={result.get('mAP50', 0):.4f} "
                 f"mAP50-95={result.get('mAP50-95', 0):.4f}")
    else:  # nothing was measured: a 0.0000 here would read as a result
        score = f"{result.get('epochs_completed', 0)} epoch(s) trained, not validated (val=False)"
    print(f"done: {score}  weights: {weights}")
    from libreyolo_core.records.notes import learned_nothing

    note = learned_nothing(result, result.get("epochs_completed"), fresh)
    # a resumed run: its start is unknown here (no "from scratch"), and one with nothing
    # left to train has no metrics of its own to judge
    if note and cfg.val and not cfg.resume:
        print(f"note: {note}")


def cmd_val(keys: dict[str, Any]) -> int:
    from libreyolo_core.facade import LibreYOLO

    _check_keys("val", keys)
    if not keys.get("data"):
        raise UsageError("libreyolo val needs data=path/to/data.yaml")
    as_json = _bool(keys.pop("json", False))
    model = LibreYOLO(keys.pop("model", "yolo9-t"))
    m = model.val(**_typed(keys, {"batch": int, "imgsz": int, "max_det": int, "workers": int,
                                  "conf": float, "iou": float, "save": _bool, "plots": _bool,
                                  "plot_images": int, "exist_ok": _bool}), verbose=not as_json)
    if as_json:
        print(json.dumps(m))
    else:
        print(f"P={m['precision']:.4f} R={m['recall']:.4f} mAP50={m['mAP50']:.4f} "
              f"mAP50-95={m['mAP50-95']:.4f}")
    return EXIT_OK


def cmd_predict(keys: dict[str, Any]) -> int:
    from libreyolo_core.facade import LibreYOLO

    _check_keys("predict", keys)
    if not keys.get("source"):
        raise UsageError("libreyolo predict needs source=image|folder|glob|list.txt|video")
    as_json = _bool(keys.pop("json", False))
    model = LibreYOLO(keys.pop("model", "yolo9-t"))
    preds = model.predict(**_typed(keys, {"conf": float, "iou": float, "imgsz": int, "max_det": int,
                                          "source": str, "device": str, "save": _bool, "save_txt": _bool,
                                          "save_conf": _bool, "save_json": _bool, "exist_ok": _bool}),
                          stream=True, verbose=not as_json)
    n = frames = 0
    save_dir = None
    for p in preds:  # a generator: one image or video frame in memory at a time
        n += 1
        save_dir = p.extra.get("save_dir", save_dir)
        if as_json:
            print(json.dumps({"path": p.path, "frame": p.extra.get("frame"), "boxes": p.boxes.tolist(),
                              "scores": p.scores.tolist(), "classes": p.classes.tolist(), "names": p.names}))
        elif "frame" in p.extra:
            frames += 1
        else:
            found = ", ".join(f"{n} {s:.2f}" for n, s in zip(p.names, p.scores, strict=True)) or "nothing"
            print(f"{p.path}: {len(p)} detections: {found}")
    if not as_json:
        what = f"{n - frames} image(s)" + (f", {frames} video frame(s)" if frames else "")
        where = (f"; saved to {save_dir}" if save_dir else
                 "; nothing saved (save=true: annotated images/video, save_txt=true: labels, "
                 "save_json=true: predictions.json; json=true: one JSON line per image)")
        print(what + where, file=sys.stderr)
    return EXIT_OK


def cmd_export(keys: dict[str, Any]) -> int:
    """``libreyolo export model=best.pt format=onnx ...``: write and check the file; print
    where it went and the check figure (``json=true``: the result as one JSON line)."""
    from libreyolo_core.export.onnx import ONNX_INSTALL, ExportError
    from libreyolo_core.facade import LibreYOLO

    _check_keys("export", keys)
    as_json = _bool(keys.pop("json", False))
    typed = _typed(keys, {"imgsz": int, "opset": int, "max_det": int, "batch": int,
                          "conf": float, "iou": float})
    for key in ("dynamic", "half", "nms"):
        if key in typed:
            typed[key] = _bool(typed[key])
    if "simplify" in typed and str(typed["simplify"]).lower() in ("true", "false", "1", "0", "yes", "no"):
        typed["simplify"] = _bool(typed["simplify"])
    model = LibreYOLO(typed.pop("model", "yolo9-t"))
    try:
        result = model.export(**typed)
    except ExportError as exc:  # missing package: a usage error; a failed check or exporter: runtime
        if str(exc) == ONNX_INSTALL:
            raise UsageError(str(exc)) from None
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_RUNTIME
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if as_json:
        print(json.dumps(result.to_dict()))
    else:
        slim = f", simplified by {result.simplified}" if result.simplified else ""
        print(f"exported {result.path} ({result.layout} layout, opset {result.opset}{slim}); "
              f"onnxruntime check: max diff {result.max_diff:.3g} (tolerance {result.tolerance:g})")
    return EXIT_OK


def cmd_cfg(keys: dict[str, Any]) -> int:
    from libreyolo_core.config import describe_config, resolve_config

    print(describe_config(resolve_config(keys)))
    return EXIT_OK


def cmd_checks(keys: dict[str, Any]) -> int:
    """Scan every split of the dataset and print its report; exit 1 if a split is unusable."""
    from libreyolo_core.data.config import load_data_config
    from libreyolo_core.data.report import DatasetError, format_report
    from libreyolo_core.data.scan import require_trainable, scan_split

    _check_keys("checks", keys)
    if not keys.get("data"):
        raise UsageError("libreyolo checks needs data=path/to/data.yaml")
    as_json = _bool(keys.get("json", False))
    dc = load_data_config(keys["data"])
    ok = True
    seen: dict[tuple[str, ...], str] = {}
    for split in ("train", "val", "test"):
        files = getattr(dc, split, None)
        if files is None:
            continue
        key = tuple(str(f) for f in files)
        if key in seen:
            print(f"[{split}] same images as [{seen[key]}]")
            continue
        seen[key] = split
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = None
            try:
                report = scan_split(dc, split, cache_dir=keys.get("cache_dir") or None)
                require_trainable(report, split)
            except DatasetError as exc:
                ok = False
                print(f"[{split}] error: {exc}")
        for w in caught:
            print(f"warning: {w.message}", file=sys.stderr)
        if report is None:
            continue
        if as_json:
            print(json.dumps({"split": split, **report.to_dict()}))
        else:
            print(f"[{split}]\n{format_report(report)}")
    return EXIT_OK if ok else EXIT_RUNTIME


def cmd_info(keys: dict[str, Any]) -> int:
    from libreyolo_core.facade import LibreYOLO

    _check_keys("info", keys)
    model = LibreYOLO(keys.get("model", "yolo9-t"))
    info = model.info(_typed(keys, {"imgsz": int}).get("imgsz"))
    size = info["imgsz"]
    print(f"{model.name}: {info['params']:,} parameters, {info['gflops']:.2f} GFLOPs at {size}x{size}")
    return EXIT_OK


def cmd_version(keys: dict[str, Any]) -> int:
    import libreyolo_core

    print(f"libreyolo {libreyolo_core.__version__}")
    return EXIT_OK


HANDLERS: dict[str, Callable[[dict[str, Any]], int]] = {
    "train": cmd_train, "val": cmd_val, "predict": cmd_predict, "export": cmd_export, "cfg": cmd_cfg,
    "checks": cmd_checks, "info": cmd_info, "version": cmd_version,
}


def _help(argv: list[str]) -> int | None:
    """Print the help that ``argv`` asks for and return 0 (2 for help on an unknown
    command); None when it asks for none. Bare ``libreyolo``, ``libreyolo help``,
    ``--help``/``-h``; ``libreyolo help COMMAND``, ``COMMAND help``, ``COMMAND --help``
    (``profile``'s subcommands keep their own ``--help``)."""
    from libreyolo_core.cli_help import COMMAND_HELP, HELP_WORDS, command_help, general_help

    if argv and argv[0] == "detect":
        argv = argv[1:]
    if not argv or argv[0] in HELP_WORDS:
        topic = argv[1] if len(argv) > 1 else None
        if topic is None:
            print(general_help())
            return EXIT_OK
        if topic not in COMMAND_HELP:
            close = difflib.get_close_matches(topic, list(COMMAND_HELP), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            print(f"error: no command {topic!r}.{hint} Commands: {', '.join(COMMAND_HELP)}",
                  file=sys.stderr)
            return EXIT_USAGE
        print(command_help(topic))
        return EXIT_OK
    command, rest = argv[0], argv[1:]
    if command not in COMMAND_HELP:
        return None
    if command == "profile":
        if not rest or rest[0] in HELP_WORDS:
            print(command_help("profile"))
            return EXIT_OK
        return None
    if rest[:1] == ["help"] or "--help" in rest or "-h" in rest:  # not `--name help`
        print(command_help(command))
        return EXIT_OK
    return None


def run(argv: Sequence[str]) -> int:
    """Run one command; returns the exit code (errors are printed, not raised)."""
    from libreyolo_core.config import ConfigError
    from libreyolo_core.distributed.batch import BatchSizeError
    from libreyolo_core.models.registry import ModelNameError

    helped = _help(list(argv))
    if helped is not None:
        return helped
    usage_errors: tuple[type[BaseException], ...] = (UsageError, ConfigError, ModelNameError,
                                                     BatchSizeError)
    try:
        if list(argv[:1]) == ["profile"]:  # POSIX flags, its own parser
            from libreyolo_core.profiler.cli import main as profile_main

            return profile_main(list(argv[1:]))
        command, keys = parse_args(argv)
        return HANDLERS[command](keys)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - map every failure to an exit code
        # a DeviceError can only come from its module once imported: help and the
        # torch-free commands never import torch for it
        device = sys.modules.get("libreyolo_core.distributed.device")
        if isinstance(exc, usage_errors + ((device.DeviceError,) if device else ())):
            if int(os.environ.get("RANK", "0")) == 0:  # under torchrun every rank has the same
                print(f"error: {exc}", file=sys.stderr)
            elif int(os.environ.get("WORLD_SIZE", "1")) > 1:
                # rank 0 says it for the job: a rank that left first would make torchrun stop
                # rank 0 before it had printed (seen on a loaded machine); torchrun stops this
                # one as soon as rank 0 has exited
                time.sleep(RANK_USAGE_ERROR_GRACE_S)
            _record_error(EXIT_USAGE, exc)
            return EXIT_USAGE
        full = disk_full(exc)
        if full is not None:  # named, with the free space, instead of torch's message
            print(f"error: {full}", file=sys.stderr)
            _record_error(EXIT_RUNTIME, full)
            return EXIT_RUNTIME
        code = _exit_for(exc)
        if code != EXIT_SIGTERM:
            _record_error(code, exc)
        return code


def _record_error(code: int, exc: BaseException) -> None:
    """Leave the failure where a supervisor can read it: ``$LIBREYOLO_ERROR_FILE`` gets
    ``{"exit_code", "error", "rank"}``. The first rank to fail writes it; the others (who
    usually fail because of it) leave it alone. Under torchrun the launcher's own exit code
    is always 1, so this is how the service tells a data error from a crash."""
    path = os.environ.get("LIBREYOLO_ERROR_FILE")
    if not path:
        return
    text = _loader_worker_death(exc) or f"{type(exc).__name__}: {exc}"
    record = {"exit_code": code, "error": text[:2000],
              "rank": int(os.environ.get("RANK", "0"))}
    from libreyolo_core.engine import fence

    # a given-up attempt's failure must not become the newer attempt's (first writer wins)
    fence.check("the error file")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:  # already written by the first failing rank, or no such folder
        return
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(record, fh)


class DiskFull(OSError):
    """A write failed because the disk is full; the message names the folder and the
    free space left on its filesystem."""


#: what a failed write says when the disk is full (torch's zip writer hides the errno)
_NO_SPACE = ("No space left on device", "file write failed", "PytorchStreamWriter failed writing")


def disk_full(exc: BaseException, where: str | None = None) -> DiskFull | None:
    """``exc`` (or an exception it was raised from) as a :class:`DiskFull` when it is a
    full disk (``ENOSPC``, or torch's failed checkpoint write on a disk with under 64 MiB
    free), else None. ``where``: the folder whose disk is reported (default: the cwd,
    the run's job folder under the service)."""
    import errno
    import shutil

    folder = where or os.getcwd()
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        usage = None
    seen: set[int] = set()
    item: BaseException | None = exc
    while item is not None and id(item) not in seen:
        seen.add(id(item))
        text = str(item)
        nospc = isinstance(item, OSError) and item.errno == errno.ENOSPC
        torch_write = any(t in text for t in _NO_SPACE[1:]) and usage is not None \
            and usage.free < 64 << 20
        if nospc or _NO_SPACE[0] in text or torch_write:
            free = (f"{usage.free / 2**20:.1f} MiB free of {usage.total / 2**30:.1f} GiB"
                    if usage is not None else "free space unknown")
            return DiskFull(errno.ENOSPC, f"disk full: no space left on the device of {folder} "
                            f"({free}); free some space or move the run folder")
        item = item.__cause__ or item.__context__
    return None


#: what Gloo and NCCL say when a collective fails because another rank went away
PEER_LOST = ("Connection closed by peer", "Connection reset by peer",
             "NCCL communicator was aborted")


def _peer_lost(exc: BaseException) -> bool:
    """True when ``exc`` is a collective that failed because another rank of the process
    group (``WORLD_SIZE`` > 1) went away: its traceback says nothing about the cause."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not isinstance(exc, RuntimeError):
        return False
    return any(text in str(exc) for text in PEER_LOST)


def _loader_worker_death(exc: BaseException) -> str | None:
    """The sentence for a data loader worker that died (torch's ``DataLoader worker (pid
    N) is killed by signal: Killed`` / ``exited unexpectedly``): which worker, the signal,
    what to try; None for any other error."""
    import re

    # torch raises "exited unexpectedly" from "killed by signal: X"
    chain: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 5:
        chain.append(" ".join(str(seen).split()))
        seen = seen.__cause__ or seen.__context__
    text = " | ".join(sorted(chain, key=lambda t: "killed by signal" not in t))
    m = re.search(r"DataLoader worker \(pid\(?s?\)? ([\d, ]+)\) (?:is killed by signal: ([^.]+)|"
                  r"exited unexpectedly(?: with exit code (-?\d+))?)", text)
    if m is None:
        return None
    pid, signame, code = m.group(1).strip(), m.group(2), m.group(3)
    if signame is None and code and code.lstrip("-").isdigit() and int(code) < 0:
        import signal as _signal

        try:
            signame = _signal.Signals(-int(code)).name
        except ValueError:
            signame = f"signal {-int(code)}"
    how = f"was killed by {signame}" if signame else "exited unexpectedly"
    why = ""
    if signame and ("Killed" in signame or "SIGKILL" in signame):
        why = " (usually the kernel's out-of-memory killer: the machine ran out of memory)"
    elif signame and ("Bus" in signame or "SIGBUS" in signame):
        why = " (usually out of shared memory, /dev/shm)"
    return (f"data loader worker (pid {pid}) {how}{why}. Try fewer loader workers "
            "(workers=2, or workers=0 to load in the training process), less memory per "
            "worker (cache=false, a smaller batch or imgsz), more memory, or more shared "
            "memory (/dev/shm; in docker: --shm-size=2g)")


def _exit_for(exc: Exception) -> int:
    from libreyolo_core.data.config import DataConfigError
    from libreyolo_core.data.report import DatasetError
    from libreyolo_core.engine.checkpoint import CheckpointError
    from libreyolo_core.profiler import ProfileWindowError

    if type(exc).__name__ == "TuneInterrupted":
        path = getattr(exc, "path", None)
        where = f"; what was measured is in {path}" if path else ""
        print(f"tune interrupted ({exc}){where}", file=sys.stderr)
        return EXIT_SIGTERM
    interrupted = type(exc).__name__ == "TrainingInterrupted"
    if interrupted and int(os.environ.get("RANK", "0")) != 0:  # rank 0 speaks for the job
        return EXIT_SIGTERM
    if interrupted:
        last = getattr(exc, "last_checkpoint", None)
        if last is None:  # stopped before training began (during a preflight)
            print(f"interrupted ({exc}): stopped before the first epoch, nothing saved",
                  file=sys.stderr)
        else:
            # run by the service, a server path means nothing to its user: its way instead
            how = os.environ.get("LIBREYOLO_RESUME_HINT") or f"resume={last}"
            print(f"interrupted ({exc}): {Path(last).name if os.environ.get('LIBREYOLO_RESUME_HINT') else last} "
                  f"saved; resume with {how}", file=sys.stderr)
        return EXIT_SIGTERM
    loader = _loader_worker_death(exc)
    if loader is not None:  # torch's message and a long traceback said none of this
        print(f"error: {loader}", file=sys.stderr)
        return EXIT_RUNTIME
    print(f"error: {exc}", file=sys.stderr)
    from libreyolo_core.predict import SourceError

    if isinstance(exc, DataConfigError | DatasetError | ProfileWindowError | SourceError):
        return EXIT_DATA
    if isinstance(exc, CheckpointError):
        return EXIT_MODEL
    if isinstance(exc, FileNotFoundError):
        return EXIT_DATA
    if _peer_lost(exc):  # a consequence: the rank or node that went away says why
        print("error: a peer of the process group went away (another rank or node stopped; "
              "its own log says why)", file=sys.stderr)
        return EXIT_RUNTIME
    logging.getLogger(__name__).debug("traceback", exc_info=exc)
    import traceback

    traceback.print_exception(exc, file=sys.stderr)
    return EXIT_RUNTIME


def _format_warning(message: Warning | str, category: type[Warning], filename: str,
                    lineno: int, line: str | None = None) -> str:
    """A dataset warning as one ``warning: ...`` line (it names the file and line of the
    data at fault; the source line that raised it means nothing to a user); others as
    Python formats them."""
    from libreyolo_core.data.report import DatasetWarning  # loaded by whatever warned

    if issubclass(category, DatasetWarning):
        return f"warning: {message}\n"
    return _python_format_warning(message, category, filename, lineno, line)


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point of ``libreyolo``."""
    from libreyolo_core.engine.fence import guard_output

    guard_output()  # under the service: a given-up attempt prints nothing into the log
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    warnings.formatwarning = _format_warning
    code = run(sys.argv[1:] if argv is None else argv)
    if code == EXIT_OK and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # a DDP rank (torchrun) that finished: not the interpreter's teardown (exit_rank).
        # Failures keep the slower exit: a rank that left at once made torchrun stop the
        # others before rank 0 had printed the error they all had.
        from libreyolo_core.distributed.context import exit_rank

        exit_rank(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
