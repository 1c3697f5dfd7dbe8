"""``predict`` sources (image, folder, glob, list file, video) and what it saves
(annotated images and video, YOLO labels with and without scores, COCO JSON)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from libreyolo_core import LibreYOLO
from libreyolo_core.cli import EXIT_DATA, run
from libreyolo_core.predict import SourceError, expand_source

ANY = dict(conf=0.0, max_det=3, imgsz=64, device="cpu")  # an untrained model: 3 boxes per image


@pytest.fixture(scope="module")
def model():
    return LibreYOLO("yolo9-t", nc=4, names={0: "circle", 1: "square", 2: "triangle", 3: "star"})


@pytest.fixture(scope="module")
def images(sample_yaml) -> list[Path]:
    return sorted((Path(sample_yaml).parent / "images" / "val").glob("*"))[:3]


def _video(path: Path, frames: int = 6, size: tuple[int, int] = (96, 64)) -> Path:
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 5.0, size)
    rng = np.random.default_rng(0)
    for _ in range(frames):
        w.write(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))
    w.release()
    return path


def test_save_images_labels_and_json(model, images, tmp_path):
    preds = model.predict([str(p) for p in images], save=True, save_txt=True, save_conf=True, save_json=True,
                          project=tmp_path, **ANY)
    out = tmp_path / "exp"
    assert len(preds) == 3 and all(p.extra["save_dir"] == str(out) for p in preds)
    for src, p in zip(images, preds, strict=True):
        with Image.open(out / src.name) as im, Image.open(src) as orig:
            assert im.size == orig.size  # annotated at the source's size
            assert np.asarray(im, np.int16).tolist() != np.asarray(orig.convert("RGB"), np.int16).tolist()
        rows = [r.split() for r in (out / "labels" / f"{src.stem}.txt").read_text().splitlines()]
        assert len(rows) == len(p) == 3 and all(len(r) == 6 for r in rows)
        vals = np.array(rows, float)
        assert ((vals[:, 1:5] >= 0) & (vals[:, 1:5] <= 1)).all()
        assert vals[:, 5] == pytest.approx(p.scores, abs=1e-4)
    res = json.loads((out / "predictions.json").read_text())
    assert len(res) == 9 and {"image_id", "category_id", "bbox", "score", "file_name"} <= set(res[0])
    # save_txt without save_conf: five columns; a second run goes to exp2
    model.predict(str(images[0]), save_txt=True, project=tmp_path, **ANY)
    assert len((tmp_path / "exp2" / "labels" / f"{images[0].stem}.txt").read_text().split("\n")[0].split()) == 5


def test_video_is_read_and_written_frame_by_frame(model, tmp_path):
    video = _video(tmp_path / "clip.mp4")
    gen = model.predict(str(video), save=True, save_txt=True, project=tmp_path / "p", stream=True, **ANY)
    assert inspect.isgenerator(gen)
    preds = list(gen)
    assert [p.extra["frame"] for p in preds] == list(range(6))
    out = tmp_path / "p" / "exp"
    cap = cv2.VideoCapture(str(out / "clip.mp4"))
    n = 0
    while cap.read()[0]:
        n += 1
    cap.release()
    assert n == 6
    assert sorted(p.name for p in (out / "labels").iterdir()) == [f"clip_{k}.txt" for k in range(6)]


def test_streaming_a_long_video_keeps_memory_flat(model, tmp_path):
    """160 frames of 640 x 480, annotated and written: the Python heap (numpy's buffers are
    traced too) after the last frame is within 12 MB of what it was at frame 32. Kept frames
    or results would grow it by 0.9 MB a frame (115 MB here)."""
    import tracemalloc

    video = _video(tmp_path / "long.mp4", frames=160, size=(640, 480))
    tracemalloc.start()
    try:
        at_32 = 0
        for k, p in enumerate(model.predict(str(video), save=True, project=tmp_path / "p",
                                            stream=True, **ANY)):
            assert p.extra["frame"] == k
            if k == 32:
                at_32 = tracemalloc.get_traced_memory()[0]
        grown = tracemalloc.get_traced_memory()[0] - at_32
    finally:
        tracemalloc.stop()
    assert k == 159
    assert grown < 12 * 2**20, f"the heap grew {grown / 2**20:.1f} MB over 127 frames"


def test_sources_glob_list_file_and_folder(images, tmp_path):
    folder = images[0].parent
    assert [s.path for s in expand_source(str(folder / "*"))] == sorted(folder.glob("*"))
    lst = tmp_path / "list.txt"
    lst.write_text(f"# two images\n{images[0]}\n\n{images[1]}\n")
    assert [s.path for s in expand_source(str(lst))] == images[:2]
    assert len(expand_source(str(folder))) == len(list(folder.glob("*")))
    with pytest.raises(FileNotFoundError, match="list.txt:1"):
        (tmp_path / "list.txt").write_text("missing.jpg\n")
        expand_source(str(lst))
    with pytest.raises(FileNotFoundError, match="no images or videos match"):
        expand_source(str(tmp_path / "*.jpg"))


def test_unreadable_video_is_a_clear_error(model, tmp_path):
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video")
    with pytest.raises(SourceError, match="OpenCV cannot open"):
        model.predict(str(bad), **ANY)


def test_cli_predict_saves(images, tmp_path, capsys):
    assert run(["predict", f"source={images[0].parent}", "conf=0.0", "max_det=2", "imgsz=64", "device=cpu",
                "save=true", "save_json=true", f"project={tmp_path}"]) == 0
    err = capsys.readouterr().err
    assert f"saved to {tmp_path / 'exp'}" in err
    assert (tmp_path / "exp" / "predictions.json").is_file() and (tmp_path / "exp" / images[0].name).is_file()
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"x")
    assert run(["predict", f"source={bad}", "device=cpu"]) == EXIT_DATA  # a message, no traceback
