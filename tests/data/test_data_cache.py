"""cache=ram|disk: the estimate said before filling, the fallbacks when it does not fit,
and one RAM cache shared by the loader workers (not a copy in each)."""

from __future__ import annotations

import logging
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from libreyolo_core.data import generate_sample_dataset, load_data_config, scan_split
from libreyolo_core.data import image_cache as IC
from libreyolo_core.data.dataset import YOLODataset
from libreyolo_core.data.loader import build_dataloader
from libreyolo_core.data.report import DatasetWarning

S = 64


@pytest.fixture
def report(tmp_path: Path):
    cfg = load_data_config(generate_sample_dataset(tmp_path / "ds", n_train=6, n_val=2, imgsz=96, seed=2))
    return scan_split(cfg, "train", cache=False)


def _dataset_warnings(rec) -> list[str]:
    return [str(w.message) for w in rec if issubclass(w.category, DatasetWarning)]


def test_ram_estimate_is_said_before_filling(report, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="libreyolo_core.data.dataset"):
        ds = YOLODataset(report, S, augment=False, cache="ram")
    need = sum(h * w * 3 for h, w in (ds._target_hw(i) for i in range(len(ds))))
    msgs = [r.getMessage() for r in caplog.records]
    est = next(i for i, m in enumerate(msgs) if m.startswith("cache=ram:"))
    filled = next(i for i, m in enumerate(msgs) if m.startswith("cached "))
    assert est < filled
    assert f"{len(ds)} images at imgsz {S} need {need / 2**20:.1f} MiB;" in msgs[est]
    assert "memory available" in msgs[est]
    assert ds.cache == "ram" and ds._ram is not None and ds._ram.nbytes == need
    # each image decoded once into the block, read-only views out of it
    img = ds.load_image(0)
    assert not img.flags.writeable and img.shape == (*ds._target_hw(0), 3)


def test_ram_cache_that_does_not_fit_falls_back_to_disk(report, monkeypatch) -> None:
    monkeypatch.setattr(IC, "RAM_SHARE", 1e-12)  # a machine with (almost) no memory to spare
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        ds = YOLODataset(report, S, augment=False, cache="ram")
    msgs = _dataset_warnings(rec)
    assert len(msgs) == 1 and "does not fit; falling back to cache=disk" in msgs[0], msgs
    assert ds.cache == "disk" and ds._ram is None
    plain = YOLODataset(report, S, augment=False)
    assert all(torch.equal(ds[i][0], plain[i][0]) for i in range(len(ds)))
    assert len(list(report.records[0].im_file.parent.glob(f"*.{S}.npy"))) == len(ds)


def test_nothing_fits_refuses_with_one_warning(report, monkeypatch) -> None:
    monkeypatch.setattr(IC, "RAM_SHARE", 1e-12)
    monkeypatch.setattr(IC, "DISK_SHARE", 1e-12)
    for mode in ("ram", "disk"):
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            ds = YOLODataset(report, S, augment=False, cache=mode)
        msgs = _dataset_warnings(rec)
        assert len(msgs) == 1 and "does not fit" in msgs[0] and "disabled" in msgs[0], msgs
        assert ds.cache is False
    assert not list(report.records[0].im_file.parent.glob("*.npy"))


def test_estimate_counts_one_copy_per_rank(monkeypatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    est = IC.estimate_cache("ram", [(10, 20), (30, 40)], 40, copies=2)
    assert est.need == (200 + 1200) * 3 and "x 2 ranks" in est.describe()
    small = IC.CacheEstimate("ram", 2, 40, est.need, 2, available=est.need * 3, share=0.5)
    assert not small.fits  # 2 copies = 2 x need > 0.5 x 3 x need


def test_workers_share_the_parent_ram_cache(report) -> None:
    """The workers read the parent's pages: a change the parent makes to the block after
    they started shows in their samples (a per-worker copy, even copy-on-write, would keep
    the old pixels)."""
    ds = YOLODataset(report, S, augment=False, cache="ram")
    loader = build_dataloader(ds, 2, 2, shuffle=False)
    ds.set_epoch(0)
    loader.sampler.set_epoch(0)
    first = next(iter(loader))
    assert first.images.shape == (2, 3, S, S)
    h, w = ds._target_hw(0)
    block = ds._ram._flat  # the shared block (writable in the parent only here, for the test)
    block[ds._ram.offsets[0] : ds._ram.offsets[1]] = 7
    again = next(iter(loader))  # the same persistent workers, a new epoch iterator
    top, left = (S - h) // 2, (S - w) // 2
    assert (again.images[0, :, top : top + h, left : left + w] == 7).all()
    del loader


def test_cache_survives_pickling_for_spawned_workers(report) -> None:
    ds = YOLODataset(report, S, augment=False, cache="ram")
    copy = pickle.loads(pickle.dumps(ds._ram))
    assert len(copy) == len(ds._ram)
    for i in range(len(copy)):
        np.testing.assert_array_equal(copy[i], ds._ram[i])


# ------------------------------------------------------------------ cache_recent_mb
def _img(nbytes: int, value: int = 0) -> np.ndarray:
    return np.full((1, nbytes // 3, 3), value, np.uint8)


def test_recent_images_drop_the_least_recently_used_by_bytes() -> None:
    loads: list[int] = []

    def load(i: int) -> np.ndarray:
        loads.append(i)
        return _img(300, i)

    cache = IC.RecentImages(900)  # room for three images of 300 bytes
    for i in (0, 1, 2, 0, 3):  # 0 was used again: 1 is the least recently used when 3 comes
        assert cache.get(i, load)[0, 0, 0] == i
    assert loads == [0, 1, 2, 3] and len(cache) == 3 and cache.nbytes == 900
    cache.get(1, load)  # dropped, so decoded again; 2 goes now
    cache.get(0, load)
    assert loads == [0, 1, 2, 3, 1] and (cache.hits, cache.misses) == (2, 5)
    cache.get(2, load)
    assert loads[-1] == 2
    # a cached image is read-only: a change in place would alter later samples
    with pytest.raises(ValueError, match="read-only"):
        cache.get(2, load)[0, 0, 0] = 9
    # an image larger than the whole budget is returned, not kept, and drops nothing
    big = IC.RecentImages(100)
    assert big.get(7, load).flags.writeable and len(big) == 0 and big.nbytes == 0
    with pytest.raises(ValueError, match=">= 0"):
        IC.RecentImages(-1)


def test_recent_images_pickle_empty_with_their_budget() -> None:
    cache = IC.RecentImages(1000)
    cache.get(0, lambda i: _img(300))
    copy = pickle.loads(pickle.dumps(cache))
    assert copy.budget == 1000 and len(copy) == 0 and copy.nbytes == 0


def test_recent_cache_changes_no_sample_and_decodes_each_image_once(report, monkeypatch) -> None:
    """Mosaic, mixup and the affine draw partners from the whole set: with the recent cache
    every sample is byte for byte what it is without, and each image is decoded once."""
    from libreyolo_core.config import AugmentConfig

    aug = AugmentConfig(mosaic=1.0, mixup=1.0)
    plain = YOLODataset(report, S, augment=True, aug=aug, seed=3)
    cached = YOLODataset(report, S, augment=True, aug=aug, seed=3, cache_recent_mb=1)
    decoded: list[int] = []
    decode = cached._decode_resized
    monkeypatch.setattr(cached, "_decode_resized", lambda i: decoded.append(i) or decode(i))
    for epoch in range(3):
        plain.set_epoch(epoch)
        cached.set_epoch(epoch)
        for i in range(len(plain)):
            a, b = plain[i], cached[i]
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2]
    assert sorted(decoded) == sorted(set(decoded)) and len(decoded) <= len(cached)
    assert cached._recent is not None and cached._recent.hits > 2 * len(decoded)
    # the validation letterbox reads the same store, and ram already holds every image
    assert YOLODataset(report, S, augment=False, cache_recent_mb=1)._recent is not None
    assert YOLODataset(report, S, augment=False, cache="ram", cache_recent_mb=1)._recent is None
    with pytest.raises(ValueError, match="cache_recent_mb"):
        YOLODataset(report, S, augment=False, cache_recent_mb=-1)


def test_recent_cache_gives_the_same_batches_through_loader_workers(report) -> None:
    """Each worker keeps its own store (a spawned one starts empty): batches equal the
    uncached ones for 0 and 2 workers over two epochs."""
    from libreyolo_core.config import AugmentConfig

    aug = AugmentConfig(mosaic=1.0, mixup=0.5)

    def batches(recent_mb: float, workers: int) -> list[torch.Tensor]:
        ds = YOLODataset(report, S, augment=True, aug=aug, seed=1, cache_recent_mb=recent_mb)
        loader = build_dataloader(ds, 3, workers, shuffle=True, seed=1)
        out = []
        for epoch in range(2):
            ds.set_epoch(epoch)
            loader.sampler.set_epoch(epoch)
            out += [torch.cat([b.images.flatten(), b.targets.flatten().float()]) for b in loader]
        del loader
        return out

    ref = batches(0, 0)
    for workers in (0, 2):
        got = batches(1, workers)
        assert len(got) == len(ref) and all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))


def test_recent_cache_is_said_in_one_line(report) -> None:
    ds = YOLODataset(report, S, augment=True, cache_recent_mb=1)
    need = sum(h * w * 3 for h, w in (ds._target_hw(i) for i in range(len(ds))))
    line = ds.describe_recent()
    assert line is not None and line.startswith("cache_recent_mb=1: ")
    assert f"the {len(ds)} images at imgsz {S} need {need / 2**20:.0f} MiB, all fit" in line
    assert YOLODataset(report, S, augment=True).describe_recent() is None
    small = YOLODataset(report, S, augment=True, cache_recent_mb=need / 2 / 2**20)
    assert "about 50% of decodes are saved" in (small.describe_recent() or "")
