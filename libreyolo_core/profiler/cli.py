"""``libreyolo profile run|tune|summary|phases|kernels|ops|get|compare`` (POSIX flags).

Exit codes: 0 ok; 1 a trace that cannot be analysed; 2 usage error, missing file, unknown
field or phase (the message lists the valid ones); 3 ``run`` produced no profile because the
first epoch cannot hold the window (the message names the three ways out, with numbers);
143 ``tune`` stopped by SIGTERM (``tune.json`` holds what was measured).

``tune`` profiles the configuration ``--repeat`` times, tries the levers its verdict names
and recommends one only when it beats the baseline beyond noise (:mod:`.tune`).

``run`` prints, besides the verdict, how sure it is: the spread of the window's steps and
the machine's load (``confidence`` and ``load`` in ``profile.json``); ``compare`` puts both
sides' load next to the delta and says when the environment may explain it.

Readers accept a ``profile.json`` (schema ``libreyolo.profile...``), a ``profile_repeat.json``,
a raw ``profile_trace.json.gz`` or plain ``.json`` trace (analysed on the fly, with a sibling ``profile_summary.json`` if
present) or a directory holding ``profile.json``. Every subcommand takes ``--json``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from libreyolo_core.profiler.record import ProfileRecord
from libreyolo_core.profiler.repeat import aggregate  # exported here too: its old home

__all__ = ["main", "build_parser", "load_profile", "aggregate", "ReaderError"]

EXIT_OK, EXIT_TRACE, EXIT_USAGE, EXIT_NO_PROFILE = 0, 1, 2, 3
REMEDIES = ("a bigger dataset", "fewer --steps", "a smaller --batch")


class ReaderError(Exception):
    """A reader cannot go on; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


# -- loading -----------------------------------------------------------------------------
def load_profile(path: str | Path) -> ProfileRecord:
    """Read a profile for the readers (see module docstring).

    Raises:
        ReaderError: missing file (code 2) or a file that is neither a profile nor a trace
            (code 1).
    """
    from libreyolo_core.profiler.analysis import read_json
    from libreyolo_core.profiler.artifacts import profile_from_trace

    p = Path(path)
    if p.is_dir():
        p = p / "profile.json"
    if not p.is_file():
        raise ReaderError(f"{path}: no such file", EXIT_USAGE)
    try:
        data = read_json(p)
    except (OSError, ValueError, EOFError) as exc:
        raise ReaderError(f"{p}: not JSON ({exc})", EXIT_TRACE) from None
    if isinstance(data, dict) and str(data.get("schema", "")).startswith("libreyolo.profile"):
        try:
            return ProfileRecord.of(data)
        except ValueError as exc:
            raise ReaderError(f"{p}: not a readable profile ({exc})", EXIT_TRACE) from None
    if isinstance(data, list) or (isinstance(data, dict) and "traceEvents" in data):
        try:
            return profile_from_trace(p)
        except Exception as exc:  # noqa: BLE001
            raise ReaderError(f"{p}: trace cannot be analysed ({exc})", EXIT_TRACE) from None
    raise ReaderError(
        f"{p}: neither a profile.json (libreyolo.profile schema) nor a Chrome trace", EXIT_TRACE
    )


# -- run -----------------------------------------------------------------------------------
def _model_name(args: argparse.Namespace) -> str:
    if args.weights:
        return args.weights
    name = args.model
    if args.size:
        base = name.rsplit("-", 1)[0] if "-" in name else name
        name = f"{base}-{args.size}"
    return name


def cmd_run(args: argparse.Namespace) -> int:
    """Profile ``--repeat`` short training runs (:func:`~.trial.run_trial` each); exit 3
    when the first epoch cannot hold the window."""
    from libreyolo_core.profiler.artifacts import write_json
    from libreyolo_core.profiler.trial import NoProfileError, result_json, run_trial
    from libreyolo_core.profiler.window import ProfileWindowError

    project = Path(args.project)
    keys = _train_keys(args)
    results = []
    for i in range(args.repeat):
        name = "prof" if args.repeat == 1 else f"prof_{i + 1}"
        try:
            results.append(run_trial(
                args.data, _model_name(args), project=project, name=name, warmup=args.warmup,
                steps=args.steps, epochs=args.epochs, stdout=sys.stderr if args.json else None,
                **keys,
            ))
        except ProfileWindowError as exc:
            print(f"error: no profile for trial {i + 1}: {exc}", file=sys.stderr)
            return EXIT_NO_PROFILE
        except NoProfileError as exc:
            print(f"error: trial {i + 1}: {exc}. Ways out: {', '.join(REMEDIES)}",
                  file=sys.stderr)
            return EXIT_NO_PROFILE
    profiles = [r.profile for r in results]
    paths = [str(r.profile_path) for r in results]
    final: ProfileRecord | dict[str, Any] = profiles[-1]
    final_path = paths[-1]
    if len(profiles) >= 2:
        aggregated = aggregate(profiles, paths)
        final_path = str(project / "profile_repeat.json")
        write_json(Path(final_path), aggregated.to_dict())
        final = aggregated
    trace = results[-1].trace_path
    result = {"profile": final_path, "trace": str(trace) if trace else None,
              **result_json(final)}
    if args.json:
        print(json.dumps(result))
    else:
        if len(profiles) >= 2:
            from libreyolo_core.profiler.report import format_summary

            print(format_summary(final))
        print(f"profile: {final_path}" + (f"\ntrace: {result['trace']}" if result["trace"] else ""))
    return EXIT_OK


# -- tune ----------------------------------------------------------------------------------
def _set_keys(items: Sequence[str]) -> dict[str, Any]:
    """``["mosaic=1.0", "cache=ram"]`` -> ``{"mosaic": "1.0", "cache": "ram"}`` (the schema
    converts the values).

    Raises:
        ReaderError: an item without ``=`` (code 2).
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ReaderError(f"--set {item!r}: give a training key as KEY=VALUE (e.g. mosaic=0.5)")
        out[key.strip().replace("-", "_")] = None if value.strip().lower() in ("none", "null") \
            else value.strip()
    return out


def _train_keys(args: argparse.Namespace) -> dict[str, Any]:
    """The training keys of ``profile run`` / ``profile tune``: their flags, then ``--set``
    (which wins).

    Raises:
        ReaderError: a ``--set`` item without ``=`` (code 2).
    """
    return {"batch": args.batch, "imgsz": args.imgsz, "workers": args.workers, "amp": args.amp,
            "device": args.device, **_set_keys(args.set or [])}


def cmd_tune(args: argparse.Namespace) -> int:
    """Profile the configuration, try the levers of its verdict, recommend only real gains
    (:func:`~.tune.run_tune`); exit 3 when one epoch cannot hold the window."""
    from libreyolo_core.profiler.tune import TuneOptions, run_tune
    from libreyolo_core.profiler.window import ProfileWindowError

    try:
        options = TuneOptions(repeat=args.repeat, warmup=args.warmup, steps=args.steps,
                              max_candidates=args.max_candidates,
                              budget_s=None if args.budget_s == 0 else args.budget_s,
                              min_gain=args.min_gain)
    except ValueError as exc:
        raise ReaderError(str(exc)) from None
    base = _train_keys(args)
    try:
        res = run_tune(args.data, _model_name(args), run_dir=args.project,
                       base={k: v for k, v in base.items() if v is not None}, options=options,
                       stdout=sys.stderr if args.json else sys.stdout)
    except ProfileWindowError as exc:
        print(f"error: no tune: {exc}", file=sys.stderr)
        return EXIT_NO_PROFILE
    if args.json:
        print(json.dumps(res))
    else:
        print(f"tune: {Path(args.project) / 'tune.json'}")
    return EXIT_OK


# -- readers -------------------------------------------------------------------------------
def _emit(args: argparse.Namespace, data: Any, text: str) -> int:
    print(json.dumps(data, indent=1) if args.json else text)
    return EXIT_OK


def cmd_summary(args: argparse.Namespace) -> int:
    from libreyolo_core.profiler.report import format_summary

    p = load_profile(args.profile)
    data = {
        k: v
        for k, v in p.to_dict().items()
        if k not in ("kernels", "ops", "kernels_by_phase", "ops_by_phase", "steps")
    }
    return _emit(args, data, format_summary(p))


def cmd_phases(args: argparse.Namespace) -> int:
    from libreyolo_core.profiler.report import format_phases

    p = load_profile(args.profile)
    return _emit(args, [r.to_dict() for r in p.phases], format_phases(p.phases))


def _select(args: argparse.Namespace, p: ProfileRecord, kind: str) -> tuple[list[dict], str, str]:
    """Rows for ``kernels``/``ops`` after the filters; returns (rows, key, note)."""
    note = ""
    key = "kernel" if kind == "kernels" else "op"
    if kind == "kernels" and not p.kernels:
        kind, key = "ops", "op"
        note = "no GPU kernels in this profile (CPU run): showing CPU ops (self time) instead"
    phase = getattr(args, "phase", None)
    if phase:
        valid = [r.phase for r in p.phases]
        if phase not in valid:
            raise ReaderError(
                f"unknown phase {phase!r}; valid phases: {', '.join(valid) or '(none)'}"
            )
        by_phase = p.kernels_by_phase if kind == "kernels" else p.ops_by_phase
        rows = list(by_phase.get(phase, []))
    else:
        rows = list(p.kernels if kind == "kernels" else p.ops)
    if getattr(args, "category", None):
        rows = [r for r in rows if args.category.lower() in str(r.get("category", "")).lower()]
    if getattr(args, "grep", None):
        try:
            rx = re.compile(args.grep, re.IGNORECASE)
        except re.error as exc:
            raise ReaderError(f"--grep {args.grep!r}: bad regular expression ({exc})") from None
        rows = [r for r in rows if rx.search(str(r[key])) or rx.search(str(r.get("raw_name", "")))]
    if getattr(args, "tensorcore", False):
        rows = [r for r in rows if r.get("tensorcore")]
    sort = getattr(args, "sort", "time")
    if sort == "count":
        rows.sort(key=lambda r: -r["count_per_step"])
    elif sort == "name":
        rows.sort(key=lambda r: str(r[key]).lower())
    else:
        rows.sort(key=lambda r: -r["ms_per_step"])
    return rows[: args.top], key, note


def cmd_kernels(args: argparse.Namespace, kind: str = "kernels") -> int:
    from libreyolo_core.profiler.report import format_rows

    p = load_profile(args.profile)
    rows, key, note = _select(args, p, kind)
    text = ((note + "\n") if note else "") + format_rows(rows, key)
    data: dict[str, Any] = {"rows": rows, "kind": "kernels" if key == "kernel" else "ops"}
    if note:
        data["note"] = note
    return _emit(args, data, text)


def cmd_get(args: argparse.Namespace) -> int:
    metrics = load_profile(args.profile).metrics
    if not args.field:
        return _emit(args, sorted(metrics), "\n".join(sorted(metrics)))
    if args.field not in metrics:
        raise ReaderError(
            f"unknown field {args.field!r}; valid fields: {', '.join(sorted(metrics))}"
        )
    value = metrics[args.field]
    return _emit(args, {args.field: value}, "n/a" if value is None else str(value))


def cmd_compare(args: argparse.Namespace) -> int:
    from libreyolo_core.profiler.report import compare_profiles, format_compare

    c = compare_profiles(load_profile(args.before), load_profile(args.after))
    return _emit(args, c.to_dict(), format_compare(c))


# -- parser ------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The ``libreyolo profile`` argument parser."""
    ap = argparse.ArgumentParser(prog="libreyolo profile", description="training profiler")
    sub = ap.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="profile a short window of real training steps")
    r.add_argument("data", help="dataset yaml")
    r.add_argument("--weights", default=None, help="checkpoint to start from (overrides --model)")
    r.add_argument(
        "--model", default="yolo9-t", help="model name <family>-<size> (default yolo9-t)"
    )
    r.add_argument("--size", default=None, help="size letter replacing the one in --model")
    r.add_argument("--batch", type=int, default=16)
    r.add_argument("--imgsz", type=int, default=640)
    r.add_argument("--workers", type=int, default=8)
    r.add_argument("--amp", action=argparse.BooleanOptionalAction, default=True)
    r.add_argument("--steps", type=int, default=20, help="measured steps (>= 2)")
    r.add_argument("--warmup", type=int, default=5, help="discarded steps")
    r.add_argument(
        "--repeat", type=int, default=1, help="trials: prof_1..prof_N + profile_repeat.json"
    )
    r.add_argument("--device", default=None, help="cpu, 0, cuda:0, auto (default: auto)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="any other training key (repeat: --set cache_recent_mb=0 --set mixup=0)")
    r.add_argument("--project", default="runs/profile")
    r.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="length of the LR schedule the trial runs in (default warmup + steps + 5); "
        "the window itself stays inside the first epoch",
    )
    r.add_argument("--json", action="store_true")

    t = sub.add_parser("tune", help="profile, try the levers the verdict names, recommend "
                       "only gains beyond noise")
    t.add_argument("data", help="dataset yaml")
    t.add_argument("--weights", default=None, help="checkpoint to start from (overrides --model)")
    t.add_argument("--model", default="yolo9-t", help="model name <family>-<size>")
    t.add_argument("--size", default=None, help="size letter replacing the one in --model")
    t.add_argument("--batch", type=int, default=None, help="default: the training default")
    t.add_argument("--imgsz", type=int, default=None, help="default: the family's")
    t.add_argument("--workers", type=int, default=None, help="default: the training default")
    t.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None)
    t.add_argument("--device", default=None, help="cpu, 0, cuda:0, auto (default: auto)")
    t.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="any other training key of the baseline (repeat: --set mosaic=1.0 "
                   "--set cache=ram)")
    t.add_argument("--repeat", type=int, default=3, help="trials per configuration (>= 2)")
    t.add_argument("--steps", type=int, default=10, help="measured steps of each trial")
    t.add_argument("--warmup", type=int, default=3, help="discarded steps of each trial")
    t.add_argument("--max-candidates", type=int, default=6,
                   help="configurations tried besides the baseline")
    t.add_argument("--budget-s", type=float, default=1800.0,
                   help="time budget in seconds; 0: none")
    t.add_argument("--min-gain", type=float, default=0.05,
                   help="smallest gain recommended, a fraction (0.05 = 5%%)")
    t.add_argument("--project", default="runs/tune", help="folder of tune.json and the trials")
    t.add_argument("--json", action="store_true", help="print tune.json (progress on stderr)")

    def reader(name: str, help_: str) -> argparse.ArgumentParser:
        s = sub.add_parser(name, help=help_)
        s.add_argument("profile", help="profile.json, profile_repeat.json or profile_trace.json.gz")
        s.add_argument("--json", action="store_true")
        return s

    reader("summary", "headline figures and the verdict")
    reader("phases", "per-phase GPU ms, wall ms, kernels, ops")
    for name in ("kernels", "ops"):
        s = reader(name, f"top {name} by time")
        s.add_argument("--top", type=int, default=20)
        s.add_argument(
            "--category", default=None, help="substring: gemm, layout, norm, elementwise"
        )
        s.add_argument("--grep", default=None, help="regular expression, case-insensitive")
        s.add_argument("--phase", default=None)
        s.add_argument("--sort", choices=("time", "count", "name"), default="time")
        if name == "kernels":
            s.add_argument("--tensorcore", action="store_true", help="Tensor-Core kernels only")
    g = reader("get", "one metric (no field: list the metric names)")
    g.add_argument("field", nargs="?", default=None)
    c = sub.add_parser("compare", help="delta of the headline metrics and a significance call")
    c.add_argument("before")
    c.add_argument("after")
    c.add_argument("--json", action="store_true")
    return ap


def main(argv: Sequence[str]) -> int:
    """Run ``libreyolo profile <argv>``; returns the exit code.

    Errors of the readers are printed and mapped to exit codes; errors of ``run`` other than
    an unfillable window propagate to the caller (``libreyolo_core.cli`` maps them).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0)
    if args.command == "run" and (args.repeat < 1 or args.steps < 1 or args.warmup < 0):
        print("error: --repeat and --steps must be >= 1, --warmup >= 0", file=sys.stderr)
        return EXIT_USAGE
    handlers = {
        "run": cmd_run,
        "summary": cmd_summary,
        "phases": cmd_phases,
        "kernels": cmd_kernels,
        "ops": lambda a: cmd_kernels(a, "ops"),
        "get": cmd_get,
        "compare": cmd_compare,
        "tune": cmd_tune,
    }
    try:
        return handlers[args.command](args)
    except ReaderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
