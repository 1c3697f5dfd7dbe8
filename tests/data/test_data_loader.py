"""collate / build_dataloader: batch layout, determinism across worker counts, and
epoch/close_mosaic state reaching persistent workers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler

from libreyolo_core.config import AugmentConfig
from libreyolo_core.data import (
    Batch,
    YOLODataset,
    build_dataloader,
    collate,
    generate_sample_dataset,
    load_data_config,
    scan_split,
)

S = 64


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("sample")
    cfg = load_data_config(generate_sample_dataset(out, n_train=12, n_val=2, imgsz=96, seed=1))
    return scan_split(cfg, "train", cache=False)


def _epoch(loader, ds, epoch: int) -> list[Batch]:
    ds.set_epoch(epoch)
    loader.sampler.set_epoch(epoch)
    return list(loader)


def test_collate_layout() -> None:
    img = torch.zeros(3, S, S, dtype=torch.uint8)
    samples = [
        (img, torch.tensor([[1.0, 1, 2, 3, 4], [2.0, 5, 6, 7, 8]]), {"path": "a"}),
        (img + 1, torch.zeros(0, 5), {"path": "b"}),
        (img + 2, torch.tensor([[0.0, 9, 9, 10, 10]]), {"path": "c"}),
    ]
    b = collate(samples)
    assert b.images.shape == (3, 3, S, S) and b.images.dtype == torch.uint8
    assert b.targets.dtype == torch.float32 and b.targets.shape == (3, 6)
    assert b.targets[:, 0].tolist() == [0, 0, 2]
    assert b.targets[0, 1:].tolist() == [1, 1, 2, 3, 4]
    assert [m["path"] for m in b.metas] == ["a", "b", "c"] and len(b) == 3
    assert collate(samples[1:2]).targets.shape == (0, 6)
    with pytest.raises(ValueError, match="equal image shapes"):
        collate([samples[0], (torch.zeros(3, 32, 32, dtype=torch.uint8), torch.zeros(0, 5), {})])
    with pytest.raises(ValueError, match="no samples"):
        collate([])


def test_workers_see_epoch_and_close_mosaic_and_match_workers_0(report) -> None:
    aug = AugmentConfig(mosaic=1.0, mixup=0.0)
    ds0 = YOLODataset(report, S, augment=True, aug=aug, seed=7)
    ds2 = YOLODataset(report, S, augment=True, aug=aug, seed=7)
    l0 = build_dataloader(ds0, batch_size=4, workers=0, shuffle=True, seed=7)
    l2 = build_dataloader(ds2, batch_size=4, workers=2, shuffle=True, seed=7)
    assert l2.num_workers == 2 and l2.persistent_workers and not l0.persistent_workers
    assert isinstance(l2.sampler, DistributedSampler)

    e0_w2 = _epoch(l2, ds2, 0)
    e1_w2 = _epoch(l2, ds2, 1)  # same persistent workers, new epoch
    e1_w0 = _epoch(l0, ds0, 1)
    assert len(e1_w2) == len(e1_w0) == 3
    for a, b in zip(e1_w2, e1_w0, strict=True):
        assert torch.equal(a.images, b.images) and torch.equal(a.targets, b.targets)
        assert [m["path"] for m in a.metas] == [m["path"] for m in b.metas]
    # epochs differ (order and augmentation)
    assert not torch.equal(e0_w2[0].images, e1_w2[0].images)
    assert all(m["mosaic"] for b in e0_w2 + e1_w2 for m in b.metas)

    ds2.close_mosaic()  # between epochs, in the main process
    e2 = _epoch(l2, ds2, 2)
    assert not any(m["mosaic"] for b in e2 for m in b.metas)
    ds0.close_mosaic()
    e2_w0 = _epoch(l0, ds0, 2)
    assert all(torch.equal(a.images, b.images) for a, b in zip(e2, e2_w0, strict=True))


def test_sampler_order_is_seeded_and_per_epoch(report) -> None:
    ds = YOLODataset(report, S, augment=False)
    loader = build_dataloader(ds, batch_size=12, workers=0, shuffle=True, seed=3)

    def order(epoch: int) -> list[str]:
        loader.sampler.set_epoch(epoch)
        return [m["path"] for b in loader for m in b.metas]

    assert order(0) == order(0) and order(0) != order(1)
    val = build_dataloader(ds, batch_size=5, workers=0, shuffle=False)
    paths = [m["path"] for b in val for m in b.metas]
    assert paths == [str(r.im_file) for r in report.records]
    assert [len(b) for b in val] == [5, 5, 2]
    dropped = build_dataloader(ds, batch_size=5, workers=0, shuffle=False, drop_last=True)
    assert [len(b) for b in dropped] == [5, 5]


def test_ranks_partition_the_dataset(report) -> None:
    ds = YOLODataset(report, S, augment=False)
    seen = []
    for rank in range(3):
        loader = build_dataloader(ds, 2, 0, shuffle=True, seed=1, rank=rank, world_size=3)
        loader.sampler.set_epoch(4)
        seen.append([m["path"] for b in loader for m in b.metas])
    assert all(len(s) == 4 for s in seen)
    flat = [p for s in seen for p in s]
    assert sorted(flat) == sorted(str(r.im_file) for r in report.records)


def test_build_dataloader_arguments(report) -> None:
    ds = YOLODataset(report, S, augment=False)
    loader = build_dataloader(ds, 4, workers=10_000, shuffle=False)
    import os

    assert loader.num_workers == (os.cpu_count() or 1)
    assert loader.pin_memory is torch.cuda.is_available()
    with pytest.raises(ValueError, match="batch_size"):
        build_dataloader(ds, 0, 0, False)
    with pytest.raises(ValueError, match="rank"):
        build_dataloader(ds, 1, 0, False, rank=2, world_size=2)
    with pytest.raises(ValueError, match="workers"):
        build_dataloader(ds, 1, -1, False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs CUDA")
def test_pin_memory_batches(report) -> None:  # pragma: no cover - GPU hosts only
    ds = YOLODataset(report, S, augment=False)
    b = next(iter(build_dataloader(ds, 4, 0, shuffle=False, pin_memory=True)))
    assert isinstance(b, Batch) and b.images.is_pinned() and b.targets.is_pinned()


def test_batch_to_keeps_metas(report, tmp_path: Path) -> None:
    ds = YOLODataset(report, S, augment=False)
    b = next(iter(build_dataloader(ds, 2, 0, shuffle=False)))
    moved = b.to("cpu")
    assert moved.metas is b.metas and torch.equal(moved.images, b.images)
