"""The `libreyolo` command line: key=value parsing, exit codes, messages naming the key."""

import subprocess
import sys

import pytest

from libreyolo_core.cli import UsageError, parse_args, run


def libreyolo(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "libreyolo_core.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def test_parse_key_value_and_flags():
    cmd, keys = parse_args(["detect", "train", "model=yolo9-t", "--epochs", "3", "--no-amp",
                            "--exist-ok", "nbs=none", "scale=(0.5,1.5)"])
    assert cmd == "train"
    assert keys == {"model": "yolo9-t", "epochs": "3", "amp": "false", "exist_ok": "true",
                    "nbs": None, "scale": "(0.5,1.5)"}
    with pytest.raises(UsageError, match="Did you mean 'train'"):
        parse_args(["trian"])
    with pytest.raises(UsageError, match="not key=value"):
        parse_args(["train", "epochs"])


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["train", "model=yolo9-t", "data=x.yaml", "epoch=3"], "Did you mean epochs"),
        (["train", "model=yolo9-t", "data=x.yaml", "lr0=abc"], "lr0='abc'"),
        (["train", "model=yolo9-q", "data=x.yaml"], "Valid models: yolo9-t, yolo9-s"),
        (["train"], "libreyolo train needs data=path/to/data.yaml"),
        (["train", "model=yolo9-t", "dat=x.yaml"], "Did you mean data"),
        (["cfg", "model=yolo9-t", "imgsz=100"], "multiple of 32"),
        (["val", "model=yolo9-t", "dat=x.yaml"], "Did you mean 'data'"),
        (["info", "model=yolo9-t", "imgsz=-5"], "imgsz=-5 must be >= 32"),
        (["info", "model=yolox-s", "imgsz=abc"], "imgsz='abc' is not an integer"),
        (["info", "model=yolo9-t", "imgsz=0"], "imgsz=0 must be >= 32"),
        (["predict", "model=yolo9-t", "source=x.jpg", "imgsz=100,200"], "imgsz='100,200' is not an integer"),
        (["val", "model=yolo9-t", "data=x.yaml", "conf=high"], "conf='high' is not a number"),
    ],
)
def test_bad_keys_exit_2_naming_the_key(args, words, capsys):
    assert run(args) == 2
    assert words in capsys.readouterr().err


def test_cfg_prints_resolved_config():
    out = libreyolo("cfg", "model=yolo9-s", "epochs=7")
    assert out.returncode == 0, out.stderr
    assert "resolved training config for yolo9-s" in out.stdout
    assert any(ln.startswith("epochs") and "7" in ln and "[user]" in ln for ln in out.stdout.splitlines())


def test_checks_missing_yaml_is_a_data_error(tmp_path):
    out = libreyolo("checks", f"data={tmp_path / 'missing.yaml'}")
    assert out.returncode == 3
    assert "missing.yaml" in out.stderr


def test_info_prints_params_and_gflops():
    out = libreyolo("info", "model=yolo9-t", "imgsz=640")
    assert out.returncode == 0, out.stderr
    assert "2,036,544 parameters" in out.stdout and "GFLOPs" in out.stdout


def test_resume_true_without_an_earlier_run_is_a_checkpoint_error(tmp_path, capsys):
    assert run(["train", "resume=True", f"project={tmp_path}"]) == 4
    err = capsys.readouterr().err
    assert "no weights/last.pt under" in err and "resume=path/to/last.pt" in err


@pytest.mark.parametrize("args", [[], ["--help"], ["-h"], ["help"]])
def test_tool_help_lists_every_command_and_exits_0(args, capsys):
    from libreyolo_core.cli_help import COMMAND_HELP

    assert run(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: libreyolo COMMAND key=value")
    for command, h in COMMAND_HELP.items():
        assert f"  {command}" in out and h.summary in out
    assert "libreyolo train model=yolo9-t data=" in out  # an example to copy


@pytest.mark.parametrize("command", ["train", "val", "predict", "profile", "cfg", "checks",
                                     "info", "version"])
@pytest.mark.parametrize("form", ["--help", "help", "-h", "help-first"])
def test_every_command_has_help(command, form, capsys):
    from libreyolo_core.cli_help import COMMAND_HELP

    args = ["help", command] if form == "help-first" else [command, form]
    assert run(args) == 0
    out = capsys.readouterr().out
    h = COMMAND_HELP[command]
    assert out.splitlines()[0].startswith(f"usage: libreyolo {command}")
    assert h.summary in out and "examples:" in out
    assert all(k in out for k, _ in h.keys)


def test_train_help_shows_the_schema_defaults_and_ignores_help_as_a_value(capsys):
    assert run(["train", "epochs=3", "--help"]) == 0
    out = capsys.readouterr().out
    assert "epochs    training epochs (default 300)" in out and "`libreyolo cfg`" in out
    assert run(["help", "trian"]) == 2
    assert "Did you mean 'train'" in capsys.readouterr().err


def test_help_through_the_console_script():
    out = libreyolo("predict", "--help")
    assert out.returncode == 0 and "save annotated images or video" in out.stdout


def test_the_installed_libreyolo_command_is_ours():
    """``bin/libreyolo`` of this environment runs our CLI (the test-only reference package
    ships a command of the same name; ``make setup`` keeps it out of the venv)."""
    from pathlib import Path

    script = Path(sys.executable).with_name("libreyolo")
    if not script.is_file():
        pytest.skip(f"no console script at {script} (the package is not installed here)")
    out = subprocess.run([str(script), "help"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "libreyolo_core" in script.read_text() and "train" in out.stdout


def test_dataset_warnings_print_as_one_line():
    """A dataset warning in the engine's log is one ``warning:`` line naming the data at
    fault, without Python's source file, line and code of the scanner."""
    from libreyolo_core.cli import _format_warning
    from libreyolo_core.data import DatasetWarning

    text = "/d/labels/a.txt:5: 4 values; expected 5 (cls cx cy w h); line dropped"
    assert _format_warning(DatasetWarning(text), DatasetWarning, "/x/scan.py", 253) == \
        f"warning: {text}\n"
    other = _format_warning(UserWarning("careful"), UserWarning, "/x/m.py", 7, "warn()")
    assert other.startswith("/x/m.py:7: UserWarning: careful")


def test_a_lost_peer_is_one_line_not_a_traceback(monkeypatch, capsys):
    """Under DDP, a rank whose collective failed because another rank or node went away
    prints one line (the rank that went away says why) and exits 1; the same error in a
    one-process run, and any other error, keeps its traceback."""
    from libreyolo_core.cli import EXIT_RUNTIME, _exit_for

    gloo = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
                        "closed by peer [127.0.0.1]:38613")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert _exit_for(gloo) == EXIT_RUNTIME
    err = capsys.readouterr().err
    assert "a peer of the process group went away" in err and "RuntimeError" not in err
    # (an exception never raised has no frames: print_exception prints its last line)
    assert _exit_for(RuntimeError("shape mismatch")) == EXIT_RUNTIME
    assert "RuntimeError: shape mismatch" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert _exit_for(gloo) == EXIT_RUNTIME
    assert "RuntimeError: [../third_party/gloo" in capsys.readouterr().err


def test_train_without_a_usable_box_exits_3_before_training(tmp_path):
    """#28.2: every label's class outside names: a data error (exit 3) naming why, no
    epoch run, no weights written."""
    from libreyolo_core.data.sample import generate_sample_dataset

    yaml_path = generate_sample_dataset(tmp_path / "s", n_train=4, n_val=2, imgsz=64)
    for lf in yaml_path.parent.rglob("labels/**/*.txt"):
        lf.write_text("".join("7 " + ln.split(" ", 1)[1] + "\n"
                              for ln in lf.read_text().splitlines() if ln.strip()))
    out = libreyolo("train", "model=yolo9-t", f"data={yaml_path}", "epochs=1", "imgsz=64",
                    "batch=2", "device=cpu", f"project={tmp_path / 'runs'}", "workers=0")
    assert out.returncode == 3, out.stderr[-2000:]
    assert "no usable box in 4 images" in out.stderr and "Traceback" not in out.stderr
    assert not list((tmp_path / "runs").rglob("*.pt"))


@pytest.mark.parametrize("args", [[], ["--help"], ["help"], ["help", "train"], ["train", "--help"],
                                  ["predict", "--help"], ["profile", "--help"], ["cfg", "--help"]])
def test_help_never_imports_torch(args):
    """#28.7: `libreyolo --help` took 16 s on a loaded machine because it imported torch."""
    code = ("import sys\nfrom libreyolo_core.cli import run\n"
            f"try:\n    rc = run({args!r})\nexcept SystemExit as e:\n    rc = e.code\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', rc, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stderr.strip().splitlines()[-1].startswith("NO-TORCH"), out.stderr[-500:]
    assert out.stdout.strip()  # help was printed


def test_the_scan_counts_go_into_run_end(tmp_path):
    """#28.2: label defects were visible only in the log; run_end carries each split's
    counts, which the worker copies into the job's result (``result.data``). A run with
    ``val=false`` does not print a measured-looking mAP50 of 0."""
    import json

    from libreyolo_core.data.sample import generate_sample_dataset

    yaml_path = generate_sample_dataset(tmp_path / "s", n_train=4, n_val=2, imgsz=64)
    labels = sorted((yaml_path.parent / "labels" / "train").glob("*.txt"))
    for lf in labels[:2]:
        lf.write_text(lf.read_text() + "9 0.5 0.5 0.1 0.1\n0 0.5 0.5 0 0\n")
    out = libreyolo("train", "model=yolo9-t", f"data={yaml_path}", "epochs=1", "imgsz=64",
                    "batch=2", "device=cpu", f"project={tmp_path / 'runs'}", "workers=0",
                    "val=false")
    assert out.returncode == 0, out.stderr[-2000:]
    # val=false measured nothing: the closing line says so instead of "mAP50=0.0000"
    assert "1 epoch(s) trained, not validated (val=False)" in out.stdout, out.stdout[-500:]
    assert "mAP50=" not in out.stdout
    events = [json.loads(ln) for ln in next((tmp_path / "runs").rglob("events.jsonl"))
              .read_text().splitlines()]
    data = events[-1]["data"]
    assert events[-1]["event"] == "run_end" and data["train"]["n_defects"] == 4, data
    assert data["train"]["defects"] == {"bad_class": 2, "zero_area": 2}
    assert data["train"]["images"] == 4 and data["train"]["boxes"] > 0


def test_a_killed_loader_worker_is_named_with_what_to_try():
    """#28.11 (a public bug report): torch's message and a 90-line traceback, reason
    'runtime error'. Now the worker, the signal and what to try, without a traceback —
    from the real error a DataLoader raises when one of its workers is SIGKILLed."""
    code = """
import os, signal, sys, time, torch
from torch.utils.data import DataLoader, Dataset
from libreyolo_core.cli import _exit_for

class Slow(Dataset):
    def __len__(self): return 1000
    def __getitem__(self, i):
        time.sleep(0.05)
        return torch.zeros(1)

it = iter(DataLoader(Slow(), batch_size=1, num_workers=1))
next(it)
os.kill(it._workers[0].pid, signal.SIGKILL)
try:
    for _ in range(100):
        next(it)
except RuntimeError as exc:
    sys.exit(_exit_for(exc))
sys.exit(99)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr[-2000:]
    err = out.stderr
    assert "error: data loader worker (pid " in err and "Killed" in err, err[-2000:]
    assert "out-of-memory killer" in err and "workers=2" in err and "--shm-size" in err
    assert "Traceback" not in err


def test_a_resume_with_nothing_left_to_train_prints_no_learned_nothing_note(tmp_path):
    """A finished run resumed again says there is nothing to train, and not "mAP50 0.000
    after 1 epoch from scratch: too short to learn" (it trained nothing, from its own
    weights; found by the fresh-user trial). The first run, 1 epoch from scratch, has it."""
    from libreyolo_core.data.sample import generate_sample_dataset

    yaml_path = generate_sample_dataset(tmp_path / "s", n_train=4, n_val=2, imgsz=64)
    keys = ["model=yolo9-t", f"data={yaml_path}", "epochs=1", "imgsz=64", "batch=2",
            "device=cpu", f"project={tmp_path / 'runs'}", "workers=0"]
    first = libreyolo("train", *keys)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "from scratch: too short to learn" in first.stdout, first.stdout
    last = next((tmp_path / "runs").rglob("last.pt"))
    again = libreyolo("train", f"resume={last}", "device=cpu", "workers=0")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "nothing to train" in again.stdout + again.stderr
    assert "note:" not in again.stdout, again.stdout
