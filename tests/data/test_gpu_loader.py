"""``loader=gpu`` on CPU tensors: the tensor code CUDA runs, checked against the CPU pipeline.

The GPU path (libreyolo_core/data/gpu_plan.py, gpu_augment.py, gpu_loader.py) makes the CPU
pipeline's draws with the CPU pipeline's functions and computes boxes on the host with them,
so sample ``i`` of epoch ``e`` has the same boxes on both paths; only pixels differ (resize
filter, float vs fixed-point bilinear, float HSV). Here, on CPU tensors:

- boxes follow the pixels: a painted rectangle lands inside its transformed box;
- per sample: same boxes and metas as ``YOLODataset``; pixels within one grey level where
  no resize is involved, close elsewhere;
- as distributions (the statistics of test_data_distribution.py) against the CPU pipeline;
- host fallback for PNG / grey / CMYK files, said once;
- a real training run with ``loader=gpu`` (and its profile window) ends with finite losses.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_data_distribution import RECIPES, collect, distribution_differences

from libreyolo_core.config import AugmentConfig, resolve_config
from libreyolo_core.data import load_data_config, scan_split
from libreyolo_core.data.dataset import YOLODataset
from libreyolo_core.data.gpu_loader import GPUAugmenter, GPULoader, build_gpu_dataloader
from libreyolo_core.data.gpu_plan import EncodedDataset, collate_encoded

CPU = torch.device("cpu")
RED = (220, 30, 30)


def gpu_batch(ds: YOLODataset, idx: list[int], augmenter: GPUAugmenter | None = None):
    """Samples ``idx`` of ``ds`` (at its epoch) through the GPU path on CPU tensors."""
    enc = EncodedDataset(ds)
    return (augmenter or GPUAugmenter(ds.imgsz, CPU))(collate_encoded([enc[i] for i in idx]), ds)


@pytest.fixture(scope="module")
def coco(coco128_ro: Path, tmp_path_factory):
    from data_helpers import writable_copy

    root = writable_copy(coco128_ro, tmp_path_factory.mktemp("gpu") / "coco128")
    return scan_split(load_data_config(root / "coco128.yaml"), "train")


# ---------------------------------------------------------------- boxes follow the pixels
def _painted_set(root: Path) -> Path:
    """Eight JPEGs of different sizes: a blue background with one red rectangle well inside
    (at least 20 % from every side), labelled with that rectangle."""
    rng = np.random.default_rng(0)
    for k in range(8):
        h, w = int(rng.integers(50, 120)), int(rng.integers(50, 120))
        img = np.zeros((h, w, 3), np.uint8)
        img[:] = (40, 60, 200)
        x1, x2 = sorted(rng.uniform(0.2, 0.8, 2) * w)
        y1, y2 = sorted(rng.uniform(0.2, 0.8, 2) * h)
        x2, y2 = max(x2, x1 + 0.15 * w), max(y2, y1 + 0.15 * h)
        img[round(y1):round(y2), round(x1):round(x2)] = RED
        (root / "images").mkdir(parents=True, exist_ok=True)
        (root / "labels").mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(root / "images" / f"{k}.jpg", quality=95)
        x1, x2, y1, y2 = round(x1), round(x2), round(y1), round(y2)
        (root / "labels" / f"{k}.txt").write_text(
            f"0 {(x1 + x2) / 2 / w} {(y1 + y2) / 2 / h} {(x2 - x1) / w} {(y2 - y1) / h}\n")
    (root / "data.yaml").write_text("path: .\ntrain: images\nnames: [red]\n")
    return root / "data.yaml"


def _red(img: torch.Tensor) -> np.ndarray:
    """``(S, S)`` mask of the red paint in a ``(3, S, S)`` uint8 image."""
    r, g, b = img.int()
    return ((r > 150) & (g < 100) & (b < 100)).numpy()


@pytest.mark.parametrize("rotate", [False, True], ids=["axis-aligned", "rotated"])
def test_boxes_follow_the_painted_pixels(tmp_path, rotate) -> None:
    """Mosaic + scale + translation + flips (+ rotation and shear): the red rectangle of every
    tile lands where the composed matrix sends its box.

    Axis-aligned warps keep the rectangle a rectangle: the box's inside (less 2 px for the
    resize and JPEG edges) is red. Rotated ones make it a rotated rectangle whose bounding
    box is the box: the red inside the box (grown by 3 px) spans the box to within 2 px
    (for boxes inside the image: a rotated box cut by the border is the clipped bounding box
    of all four corners, larger than the visible part, on the CPU path too).
    Either way almost no red lies outside every box (only tiles whose boxes the
    box-candidate rule dropped: slivers at the border).
    """
    aug = AugmentConfig(mixup=0.0, hsv_prob=0.0, flipud=0.5, fliplr=0.5, scale=(0.6, 1.4),
                        degrees=30.0 if rotate else 0.0, shear=5.0 if rotate else 0.0)
    ds = YOLODataset(scan_split(load_data_config(_painted_set(tmp_path / "ds")), "train"), 96,
                     augment=True, aug=aug, seed=3)
    checked = outside = red_total = 0
    for epoch in range(4):
        ds.set_epoch(epoch)
        batch = gpu_batch(ds, list(range(len(ds))))
        for k in range(len(ds)):
            red = _red(batch.images[k])
            covered = np.zeros_like(red)
            for _, _, x1, y1, x2, y2 in batch.targets[batch.targets[:, 0] == k].tolist():
                if not rotate:
                    inner = red[math.ceil(y1 + 2):math.floor(y2 - 2), math.ceil(x1 + 2):math.floor(x2 - 2)]
                    assert inner.size == 0 or inner.mean() > 0.97, (epoch, k, inner.mean())
                elif min(x1, y1) > 0.5 and max(x2, y2) < 95.5:  # clipped: the box overstates
                    gy1, gx1 = max(0, math.floor(y1 - 3)), max(0, math.floor(x1 - 3))
                    ys, xs = np.nonzero(red[gy1:math.ceil(y2 + 3), gx1:math.ceil(x2 + 3)])
                    assert len(xs), (epoch, k)
                    found = (xs.min() + gx1, ys.min() + gy1, xs.max() + gx1 + 1, ys.max() + gy1 + 1)
                    np.testing.assert_allclose(found, (x1, y1, x2, y2), atol=2.0)
                covered[max(0, math.floor(y1 - 2)):math.ceil(y2 + 2),
                        max(0, math.floor(x1 - 2)):math.ceil(x2 + 2)] = True
                checked += 1
            outside += int((red & ~covered).sum())
            red_total += int(red.sum())
    assert checked > 50
    assert outside < 0.02 * red_total, (outside, red_total)


# ---------------------------------------------------------------- per sample vs the CPU path
@pytest.mark.parametrize("recipe", ["base", "yolo9"])
def test_same_boxes_and_close_pixels_as_the_cpu_loader(coco, recipe) -> None:
    """Same seed, same sample: boxes equal to float precision, metas equal; pixels of the
    whole sample within 8 grey levels on average (measured: 1-5). At imgsz 160 coco's 640-px
    images shrink 4x through different filters: the CPU decoder's DCT scaling (a box filter)
    vs an antialiased bilinear (triangle) resize of the full decode, which differ by several
    levels on fine texture; HSV runs in float vs cv2's tables. The geometry is checked to
    one grey level below, the colour balance by the paired check of the distribution test."""
    ds = YOLODataset(coco, 160, augment=True, aug=RECIPES[recipe], seed=1)
    ds.set_epoch(3)
    idx = list(range(0, len(ds), 8))
    batch = gpu_batch(ds, idx)
    assert batch.images.dtype == torch.uint8 and batch.images.shape == (len(idx), 3, 160, 160)
    for k, i in enumerate(idx):
        image, labels, meta = ds[i]
        np.testing.assert_allclose(batch.targets[batch.targets[:, 0] == k, 1:].numpy(), labels.numpy(),
                                   atol=1e-4)
        assert batch.metas[k] == meta
        assert (batch.images[k].float() - image.float()).abs().mean() < 8.0


@pytest.mark.parametrize("perspective", [0.0, 0.001], ids=["affine", "perspective"])
def test_warp_within_one_grey_level_without_resize(coco, perspective) -> None:
    """Where no tile is resized (coco128's 640-wide images at imgsz 640) and no HSV shift is
    drawn, the one warp (mosaic placement x affine or perspective x flips) gives cv2's
    pixels to within one grey level: the geometry is the CPU path's exactly, only the
    bilinear arithmetic differs (float32 vs cv2's 1/32-px fixed point). Mixup blends are
    within one level too; boxes are the CPU path's."""
    aug = AugmentConfig(hsv_prob=0.0, perspective=perspective)
    ds = YOLODataset(coco, 640, augment=True, aug=aug, seed=2)
    ds.set_epoch(1)
    idx = [i for i in range(len(ds)) if max(ds.records[i].shape) == 640][:6]
    batch = gpu_batch(ds, idx)
    for k, i in enumerate(idx):
        image, labels, _ = ds[i]
        diff = (batch.images[k].int() - image.int()).abs()
        assert diff.max() <= 1 or (diff > 1).float().mean() < 1e-4, (i, diff.max())
        np.testing.assert_allclose(batch.targets[batch.targets[:, 0] == k, 1:].numpy(), labels.numpy(),
                                   atol=1e-4)


# ---------------------------------------------------------------- distributions
@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["base", "yolo9"])
def test_distribution_matches_the_cpu_loader(coco, recipe) -> None:
    """The statistics of test_data_distribution.py (boxes per image, box sizes and centres,
    per-image pixel means and variances; two epochs of coco128 at imgsz 160), GPU path vs
    CPU pipeline, with that test's tolerances: 4 standard errors for means and spreads of
    per-image statistics, a KS test at alpha = 0.001 for box sizes and centres (see
    ``Z_MAX``/``KS_C`` there for why).

    The box statistics agree by construction (both paths make the same draws and boxes,
    checked per sample above); what this test adds is the pixels. Since the samples are
    paired (same seed, same tiles, same matrix), a paired check is much sharper than the
    unpaired one: the mean over all samples of the per-image channel-mean difference must
    stay under 1 grey level, and no single image's channel mean may move by 2. Measured:
    +0.13 to +0.27 levels on average, at most 0.8 (the resize filter and HSV rounding). A
    lost or doubled HSV shift moves a channel mean by up to 30 levels, a warp off by a
    pixel or a wrong flip moves single images by far more than 2.
    """
    ds = YOLODataset(coco, 160, augment=True, aug=RECIPES[recipe], seed=0)
    enc, augmenter = EncodedDataset(ds), GPUAugmenter(160, CPU)
    gpu, cpu, paired = [], [], []
    for epoch in range(2):
        ds.set_epoch(epoch)
        for start in range(0, len(ds), 32):
            idx = list(range(start, min(start + 32, len(ds))))
            batch = augmenter(collate_encoded([enc[i] for i in idx]), ds)
            for k, i in enumerate(idx):
                image, labels, _ = ds[i]
                gpu.append((batch.images[k].permute(1, 2, 0).numpy(),
                            batch.targets[batch.targets[:, 0] == k, 1:].numpy()))
                cpu.append((image.permute(1, 2, 0).numpy(), labels.numpy()))
                paired.append((batch.images[k].float().mean((1, 2)) - image.float().mean((1, 2))).numpy())
    new, old = collect(gpu), collect(cpu)
    assert len(new["box_w_all"]) > 1000
    assert distribution_differences(new, old) == []
    paired_arr = np.array(paired)
    assert np.abs(paired_arr.mean(0)).max() < 1.0, paired_arr.mean(0)
    assert np.abs(paired_arr).max() < 2.0, np.abs(paired_arr).max(0)


def test_a_lost_hsv_shift_is_detected(coco) -> None:
    """Negative control of the paired pixel check above: the GPU path with the HSV shifts
    of its plans dropped (what a silently skipped augmentation would give) fails it."""
    ds = YOLODataset(coco, 160, augment=True, aug=RECIPES["base"], seed=0)
    enc, augmenter = EncodedDataset(ds), GPUAugmenter(160, CPU)
    ds.set_epoch(0)
    idx = list(range(32))
    items = [enc[i] for i in idx]
    for plan, _ in items:
        plan.hsv = None
    batch = augmenter(collate_encoded(items), ds)
    moved = [float((batch.images[k].float().mean((1, 2)) - ds[i][0].float().mean((1, 2))).abs().max())
             for k, i in enumerate(idx)]
    assert max(moved) >= 2.0, moved


# ---------------------------------------------------------------- host fallback
def test_png_grey_cmyk_and_rgb_coded_are_decoded_on_the_host_said_once(tmp_path, caplog) -> None:
    """Files nvjpeg should not decode go through the CPU path's decoder: with an identity
    recipe (letterbox only) the sample is the CPU loader's exactly; one warning for all."""
    root = tmp_path / "ds"
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (40, 56, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(root / "images" / "a.png")
    Image.fromarray(rgb[..., 0]).save(root / "images" / "b.jpg")
    Image.fromarray(rgb).convert("CMYK").save(root / "images" / "c.jpg")
    plain = root / "images" / "e.jpg"
    Image.fromarray(rgb).save(plain)
    # an Adobe APP14 segment with transform 0: the three components are RGB, not YCbCr
    raw = plain.read_bytes()
    (root / "images" / "d.jpg").write_bytes(raw[:2] + b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00"
                                            + raw[2:])
    for stem in "abcde":
        (root / "labels" / f"{stem}.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    (root / "data.yaml").write_text("path: .\ntrain: images\nnames: [x]\n")
    identity = AugmentConfig(mosaic=0.0, mixup=0.0, hsv_prob=0.0, fliplr=0.0, flipud=0.0)
    ds = YOLODataset(scan_split(load_data_config(root / "data.yaml"), "train"), 64, augment=True,
                     aug=identity)
    augmenter = GPUAugmenter(64, CPU)
    with caplog.at_level(logging.WARNING, logger="libreyolo_core.data.gpu_loader"):
        batch = gpu_batch(ds, [0, 1, 2, 3, 4], augmenter)
    said = [r for r in caplog.records if "decoded on the host" in r.getMessage()]
    assert len(said) == 1 and augmenter.host_decoded == 4
    for k in range(4):  # host decoded (PNG, grey, CMYK, RGB-coded): the CPU loader's pixels
        assert torch.equal(batch.images[k], ds[k][0])
    assert (batch.images[4].float() - ds[4][0].float()).abs().mean() < 2.0  # device decode


# ---------------------------------------------------------------- refusals and config
def test_loader_key_is_validated() -> None:
    assert resolve_config(loader="GPU").loader == "gpu"
    assert resolve_config().loader == "cpu"
    with pytest.raises(ValueError, match="loader"):
        resolve_config(loader="tpu")
    with pytest.raises(ValueError, match="mosaic_buffer"):
        resolve_config(loader="gpu", mosaic_buffer=16)


def test_cli_takes_the_loader_key(capsys) -> None:
    """``libreyolo cfg loader=gpu`` (the parser ``train`` uses) shows it as the user's; a
    bad value is one line naming the allowed values."""
    from libreyolo_core.cli import run

    assert run(["cfg", "loader=gpu"]) == 0
    assert any(line.startswith("loader") and "'gpu'" in line and "[user]" in line
               for line in capsys.readouterr().out.splitlines())
    assert run(["cfg", "loader=tpu"]) != 0
    assert "'cpu' or 'gpu'" in capsys.readouterr().err


def test_gpu_loader_refuses_a_mosaic_buffer(coco) -> None:
    ds = YOLODataset(coco, 64, augment=True, aug=AugmentConfig(mosaic_buffer=8))
    with pytest.raises(ValueError, match="mosaic_buffer"):
        build_gpu_dataloader(ds, 4, 0, CPU)


def test_prefetch_thread_gives_the_same_batches_and_stops(tmp_path) -> None:
    """The background thread (prefetch=1) yields what rendering inside ``next()`` yields
    (same order, same pixels, same boxes); a loop that breaks early stops the thread."""
    import threading

    from libreyolo_core.data.sample import generate_sample_dataset

    yaml_path = generate_sample_dataset(tmp_path / "ds", n_train=32, n_val=1, imgsz=96, seed=2)
    ds = YOLODataset(scan_split(load_data_config(yaml_path), "train"), 64, augment=True,
                     aug=RECIPES["base"], seed=4)
    ds.set_epoch(0)
    loaders = [build_gpu_dataloader(ds, 8, 1, CPU, prefetch=p, drop_last=True) for p in (0, 1)]
    for loader in loaders:
        loader.sampler.set_epoch(0)
    inline, ahead = list(loaders[0]), list(loaders[1])
    assert len(inline) == len(ahead) == len(ds) // 8
    for a, b in zip(inline, ahead, strict=True):
        assert torch.equal(a.images, b.images) and torch.equal(a.targets, b.targets)
        assert a.metas == b.metas
    for _ in loaders[1]:
        break
    assert not any(t.name == "gpu-loader" for t in threading.enumerate())


# ---------------------------------------------------------------- real training
@pytest.fixture
def tiny_yaml(tmp_path):
    from libreyolo_core.data.sample import generate_sample_dataset

    return generate_sample_dataset(tmp_path / "ds", n_train=8, n_val=2, imgsz=64, seed=1)


@pytest.mark.slow
def test_training_with_loader_gpu_on_cpu(tiny_yaml, tmp_path) -> None:
    """A real run (yolo9-t, imgsz 64, 1 epoch, 2 loader workers) through the GPU loader on
    CPU tensors ends with finite losses; the profile window of a second run times the
    loader's batches as data loading."""
    from libreyolo_core import LibreYOLO

    seen: dict[str, object] = {}

    def on_train_start(trainer):
        seen["loader"] = trainer.parts.train_loader

    def on_epoch_end(trainer):
        seen["losses"] = dict(trainer.outcome.losses)

    LibreYOLO("yolo9-t").train(data=str(tiny_yaml), epochs=1, imgsz=64, batch=4, workers=2,
                               device="cpu", loader="gpu", warmup_epochs=0, no_aug_epochs=0,
                               val=False, plots=False, project=str(tmp_path), name="gpu",
                               callbacks={"on_train_start": [on_train_start],
                                          "on_epoch_end": [on_epoch_end]})
    assert isinstance(seen["loader"], GPULoader)
    losses = seen["losses"]
    assert losses and all(math.isfinite(v) for v in losses.values()), losses

    result = LibreYOLO("yolo9-t").train(data=str(tiny_yaml), epochs=1, imgsz=64, batch=2, workers=0,
                                        device="cpu", loader="gpu", val=False, plots=False,
                                        profile=True, profile_then_stop=True, profile_warmup=1,
                                        profile_steps=2, profile_trace=False,
                                        project=str(tmp_path), name="gpu_profile")
    assert result["profile"]["dataload_ms"] > 0


# ---------------------------------------------------------------- CUDA (bench/gpu_check.py)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="nvjpeg decode needs CUDA")
def test_cuda_renders_what_cpu_tensors_render(tmp_path) -> None:  # pragma: no cover - GPU hosts
    """The same batch on CUDA (nvjpeg, batched) and on CPU tensors (libjpeg): the same boxes
    and metas, pixels within 3 grey levels on average (nvjpeg's IDCT and chroma upsampling
    differ from libjpeg-turbo's, most on the synthetic set's sharp coloured edges); the
    loader itself (2 workers, prefetch thread, side stream) yields uint8 CUDA batches."""
    from libreyolo_core.data.sample import generate_sample_dataset

    yaml_path = generate_sample_dataset(tmp_path / "ds", n_train=16, n_val=1, imgsz=320, seed=0)
    ds = YOLODataset(scan_split(load_data_config(yaml_path), "train"), 160, augment=True,
                     aug=AugmentConfig(), seed=0)
    ds.set_epoch(1)
    idx = list(range(16))
    on_cpu = gpu_batch(ds, idx)
    on_cuda = gpu_batch(ds, idx, GPUAugmenter(160, torch.device("cuda")))
    assert on_cuda.images.is_cuda and on_cuda.images.dtype == torch.uint8
    assert torch.equal(on_cuda.targets.cpu(), on_cpu.targets) and on_cuda.metas == on_cpu.metas
    assert (on_cuda.images.cpu().float() - on_cpu.images.float()).abs().mean() < 3.0
    loader = build_gpu_dataloader(ds, 8, 2, torch.device("cuda"), drop_last=True)
    ds.set_epoch(0)
    batch = next(iter(loader))
    torch.cuda.synchronize()
    assert batch.images.is_cuda and batch.images.shape == (8, 3, 160, 160)
    assert batch.targets.is_cuda and batch.targets.shape[1] == 6
