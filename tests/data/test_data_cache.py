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
    assert f"{len(ds)} images at imgsz {S} need {need / 2**30:.2f} GiB" in msgs[est]
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
