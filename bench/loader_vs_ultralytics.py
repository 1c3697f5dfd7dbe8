"""The training loader per CPU core, against Ultralytics' loader, in the same run.

Prints ONE result line, e.g.::

    loader_vs_ultralytics imgsz=640 batch=16 rounds=2 load=1.9: coco128 ours 90.2 img/s,
    ours-recent0 61.2, ours+buffer 120.3, ours+batch 118.0, ultralytics 98.0 img/s -> 0.92x
    [0.90-0.94], 0.62x [...] without the recent cache, 1.23x [...] with buffer, 1.20x [...]
    with batch partners | coco128x10 ... | coco128-1080p ...

Conditions (issue 23): imgsz 640, batch 16, mosaic on, mixup off, HSV, flips and affine
at each tool's defaults (ours: the yolo9 recipe, ``resolve_config(model="yolo9-t")``;
Ultralytics: ``default.yaml``), no image cache, loader workers 0 and ONE thread
(``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``, ``cv2.setNumThreads(1)``), so the
figure is the cost per core. Each measurement is a fresh process: build the dataset and
loader (not timed), load 1 warm-up batch, time ``--batches`` batches. The settings are
alternated ``--rounds`` times (ours, ours+buffer, Ultralytics, ours, ...); the rates are
the medians of the rounds and each ratio is the median (and range) of the per-round ratios
of neighbouring measurements, so a change of the machine's load hits every side alike. The
1-minute load average at the start and the end is part of the line.

Sets, made in a temporary folder from coco128 (``$COCO128`` or ../shared/datasets/coco128):

- ``coco128``: as is (128 JPEGs of about 640 x 480);
- ``coco128x10``: 1,280 distinct files: each image copied 10 times under new names
  (``<stem>_<k>.jpg``), with its label file;
- ``coco128-1080p``: each image upscaled with ``cv2.INTER_CUBIC`` so its longest side is
  1920 px (640 x 480 becomes 1920 x 1440), saved as JPEG quality 90; labels unchanged
  (they are normalised). Trained at 640, so a loader must shrink every image 3x.

"ours" is the training default, with ``cache_recent_mb`` at its 256 MiB (each process keeps the
images it decoded last; samples unchanged); "ours-recent0" is ours with
``cache_recent_mb=0``, every tile decoded, and the two variants below also run without it.
"ours+buffer" is ours with ``mosaic_buffer = min(n, 8 x batch, 1000)``, Ultralytics'
buffer size: about one decode per mosaic instead of four, at the randomness cost
docs/performance.md states; it is off by default. "ours+batch" is ours with
``mosaic_partners=batch`` (partners from the same batch: about one decode per sample,
samples still a pure function of seed, epoch and batch); also off by default.

"decode floor" is every file of the set decoded once at 1/8 scale (``IMREAD_REDUCED_COLOR_8``,
one thread, best of 3 passes): the entropy decoding that every decode of the file does, at
any output size. A loader that decodes one image per sample on this core cannot pass
``(1000 / floor) / ultralytics`` x Ultralytics' rate, even doing nothing else ("at most").

Ultralytics is never installed in the product: give a virtual environment that has
``ultralytics`` (8.4.190 measured) with ``--ultralytics-venv DIR`` or
``$ULTRALYTICS_VENV``; without one the comparison is skipped and only our figures print.

Usage: ``python bench/loader_vs_ultralytics.py [--ultralytics-venv DIR] [--sets coco128
coco128x10 coco128-1080p] [--batches 8] [--rounds 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETS = ("coco128", "coco128x10", "coco128-1080p")

# The Ultralytics side, run by the other venv's python (it imports nothing of ours).
ULTRA = textwrap.dedent("""
    import json, logging, os, sys, time
    import cv2, torch
    torch.set_num_threads(1); cv2.setNumThreads(1)
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset
    from ultralytics.utils import LOGGER
    LOGGER.setLevel(logging.ERROR)
    yaml, imgsz, batch, n_batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    data = check_det_dataset(yaml)
    cfg = get_cfg(overrides={"imgsz": imgsz, "mixup": 0.0, "workers": 0, "cache": False})
    ds = build_yolo_dataset(cfg, data["train"], batch, data, mode="train", rect=False, stride=32)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=0,
                                         collate_fn=ds.collate_fn, drop_last=True,
                                         generator=torch.Generator().manual_seed(0))
    def batches():
        while True:
            yield from loader
    it = batches(); next(it)
    t0 = time.perf_counter()
    n = sum(len(next(it)["img"]) for _ in range(n_batches))
    print(json.dumps({"img_s": n / (time.perf_counter() - t0), "version": __import__("ultralytics").__version__}))
""")

# Our side, run by this python.
OURS = textwrap.dedent("""
    import json, logging, sys, time, warnings
    from pathlib import Path
    import cv2, torch
    torch.set_num_threads(1); cv2.setNumThreads(1)
    logging.disable(logging.INFO); warnings.simplefilter("ignore")
    from libreyolo_core.config import resolve_config
    from libreyolo_core.data import YOLODataset, build_dataloader, load_data_config, scan_split
    yaml, imgsz, batch, n_batches, buffer = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    report = scan_split(load_data_config(Path(yaml)), "train")
    recent = {} if sys.argv[7] == "default" else {"cache_recent_mb": int(sys.argv[7])}
    cfg = resolve_config(model="yolo9-t", mosaic_buffer=buffer, mosaic_partners=sys.argv[6], **recent)
    ds = YOLODataset(report, imgsz, augment=True, aug=cfg.augment, seed=0,
                     cache_recent_mb=cfg.cache_recent_mb)
    loader = build_dataloader(ds, batch, 0, shuffle=True, seed=0, drop_last=True)
    def batches():
        epoch = 0
        while True:
            ds.set_epoch(epoch); loader.sampler.set_epoch(epoch)
            yield from loader
            epoch += 1
    it = batches(); next(it)
    t0 = time.perf_counter()
    n = sum(len(next(it)) for _ in range(n_batches))
    print(json.dumps({"img_s": n / (time.perf_counter() - t0)}))
""")

# The JPEG decoding floor: every file of a set decoded at 1/8 scale (libjpeg-turbo's DCT
# scaling), where the inverse DCT and colour conversion are almost free and what is left is
# the entropy (Huffman) decoding that any decode of the file must do, at any output size.
FLOOR = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    import cv2, numpy as np
    cv2.setNumThreads(1)
    bufs = [np.fromfile(f, np.uint8) for f in sorted(Path(sys.argv[1]).glob("*.jpg"))]
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for b in bufs:
            cv2.imdecode(b, cv2.IMREAD_REDUCED_COLOR_8)
        best = min(best, (time.perf_counter() - t0) / len(bufs))
    print(json.dumps({"ms": best * 1e3}))
""")


def make_sets(src: Path, root: Path, names: list[str]) -> dict[str, tuple[Path, Path, int]]:
    """``name -> (our yaml, Ultralytics yaml with an absolute path, images)``."""
    import cv2

    out = {}
    images = sorted((src / "images" / "train2017").glob("*.jpg"))
    for name in names:
        d = root / name
        (d / "images" / "train2017").mkdir(parents=True)
        (d / "labels" / "train2017").mkdir(parents=True)
        copies = 10 if name == "coco128x10" else 1
        for im in images:
            lab = src / "labels" / "train2017" / f"{im.stem}.txt"
            for k in range(copies):
                stem = im.stem if copies == 1 else f"{im.stem}_{k}"
                dst = d / "images" / "train2017" / f"{stem}.jpg"
                if name == "coco128-1080p":
                    img = cv2.imread(str(im))
                    h, w = img.shape[:2]
                    r = 1920 / max(h, w)
                    big = cv2.resize(img, (round(w * r), round(h * r)), interpolation=cv2.INTER_CUBIC)
                    cv2.imwrite(str(dst), big, [cv2.IMWRITE_JPEG_QUALITY, 90])
                else:
                    shutil.copyfile(im, dst)
                if lab.is_file():
                    shutil.copyfile(lab, d / "labels" / "train2017" / f"{stem}.txt")
        names_yaml = (src / "coco128.yaml").read_text().split("names:", 1)[1]
        ours = d / "data.yaml"
        ours.write_text(f"path: .\ntrain: images/train2017\nval: images/train2017\nnames:{names_yaml}")
        ultra = d / "ultra.yaml"
        ultra.write_text(f"path: {d}\ntrain: images/train2017\nval: images/train2017\nnames:{names_yaml}")
        out[name] = (ours, ultra, len(images) * copies)
    return out


def run(cmd: list[str], env: dict[str, str], timeout: float) -> dict:
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode or not lines:
        raise SystemExit(f"measurement failed ({' '.join(cmd[:3])}...):\n{res.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ultralytics-venv", type=Path, default=os.environ.get("ULTRALYTICS_VENV"),
                   help="a venv with ultralytics installed (default $ULTRALYTICS_VENV)")
    p.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS))
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--batches", type=int, default=8, help="timed batches per measurement")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    if a.rounds < 1 or a.batches < 1 or a.batch < 1 or a.imgsz < 32:
        p.error("needs --rounds, --batches and --batch >= 1 and --imgsz >= 32")

    src = Path(os.environ.get("COCO128", HERE.parent.parent / "shared" / "datasets" / "coco128"))
    if not (src / "coco128.yaml").is_file():
        raise SystemExit(f"coco128 not found at {src} (set COCO128=path/to/coco128)")
    ultra_py = None
    if a.ultralytics_venv:
        ultra_py = Path(a.ultralytics_venv) / "bin" / "python"
        if not ultra_py.is_file():
            raise SystemExit(f"--ultralytics-venv {a.ultralytics_venv}: no bin/python there")
    load0 = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="bench-loader-"))
    try:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "PYTHONPATH": str(HERE.parent), "YOLO_CONFIG_DIR": str(tmp / "ultralytics-cfg"),
               "YOLO_OFFLINE": "1"}
        sets = make_sets(src, tmp, a.sets)
        rates: dict[tuple[str, str], list[float]] = {}
        floor_ms = {name: run([sys.executable, "-c", FLOOR, str(ours.parent / "images" / "train2017")],
                              env, 900)["ms"] for name, (ours, _, _) in sets.items()}
        version = ""
        for _ in range(a.rounds):
            for name, (ours_yaml, ultra_yaml, n) in sets.items():
                common = [str(ours_yaml), str(a.imgsz), str(a.batch), str(a.batches)]
                buffer = min(n, 8 * a.batch, 1000)
                for label, extra in (("ours", ["0", "dataset", "default"]),
                                     ("ours-recent0", ["0", "dataset", "0"]),
                                     ("ours+buffer", [str(buffer), "dataset", "0"]),
                                     ("ours+batch", ["0", "batch", "0"])):
                    r = run([sys.executable, "-c", OURS, *common, *extra], env, 900)
                    rates.setdefault((name, label), []).append(r["img_s"])
                if ultra_py is not None:
                    r = run([str(ultra_py), "-c", ULTRA, str(ultra_yaml), *common[1:]], env, 900)
                    version = r.get("version", "")
                    rates.setdefault((name, "ultralytics"), []).append(r["img_s"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    parts = []
    for name in sets:
        med = {k: statistics.median(v) for (s, k), v in rates.items() if s == name}
        text = (f"{name} ours {med['ours']:.1f} img/s, ours-recent0 {med['ours-recent0']:.1f}, "
                f"ours+buffer {med['ours+buffer']:.1f}, ours+batch {med['ours+batch']:.1f}")
        if "ultralytics" in med:
            # the ratio of each round's neighbouring measurements, then their median: a load
            # change between rounds cancels out
            u = rates[(name, "ultralytics")]

            def ratio(label: str, u: list[float] = u, name: str = name) -> str:
                r = [o / t for o, t in zip(rates[(name, label)], u, strict=True)]
                return f"{statistics.median(r):.2f}x [{min(r):.2f}-{max(r):.2f}]"

            text += (f", ultralytics {med['ultralytics']:.1f} img/s -> {ratio('ours')}, "
                     f"{ratio('ours-recent0')} without the recent cache, "
                     f"{ratio('ours+buffer')} with buffer, {ratio('ours+batch')} with batch partners")
            # one decode per sample (as Ultralytics' buffer and our batch partners do) and
            # nothing else: no loader that decodes on this core can pass this ratio
            text += (f"; decode floor {floor_ms[name]:.2f} ms/img -> at most "
                     f"{1000 / floor_ms[name] / med['ultralytics']:.1f}x")
        else:
            text += f"; decode floor {floor_ms[name]:.2f} ms/img"
        parts.append(text)
    head = (f"loader_vs_ultralytics imgsz={a.imgsz} batch={a.batch} rounds={a.rounds} "
            f"load={load0:.1f}-{os.getloadavg()[0]:.1f}")
    if ultra_py is None:
        head += " (no --ultralytics-venv: comparison skipped)"
    elif version:
        head += f" ultralytics={version}"
    print(head + ": " + " | ".join(parts))


if __name__ == "__main__":
    main()
