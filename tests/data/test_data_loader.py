"""collate / build_dataloader: batch layout, determinism across worker counts, and
epoch/close_mosaic state reaching persistent workers."""

from __future__ import annotations

import warnings
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


@pytest.mark.parametrize("augment", [True, False])
def test_whole_batch_path_equals_samples_collated(report, augment: bool) -> None:
    """``YOLODataset.__getitems__`` writes each image straight into the batch tensor (in
    shared memory inside a worker): the batches are the ones ``__getitem__`` + ``collate``
    give, with workers and without."""
    aug = AugmentConfig(mosaic=1.0, mixup=0.5)
    ds = YOLODataset(report, S, augment=augment, aug=aug, seed=5)
    ds.set_epoch(3)
    idx = [4, 0, 11, 4, 7]
    whole = ds.__getitems__(idx)
    single = collate([ds[i] for i in idx])
    assert whole.images.shape == (5, 3, S, S) and whole.images.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(whole.images, single.images)
    assert torch.equal(whole.targets, single.targets)
    assert whole.metas == single.metas
    assert collate(whole) is whole
    with pytest.raises(IndexError, match="out of range"):
        ds.__getitems__([0, 12])

    class PerSample(YOLODataset):
        __getitems__ = None  # DataLoader falls back to __getitem__ + collate

    for workers in (0, 2):
        loaders = []
        for cls in (YOLODataset, PerSample):
            d = cls(report, S, augment=augment, aug=aug, seed=5)
            loaders.append((build_dataloader(d, batch_size=4, workers=workers, shuffle=True, seed=5), d))
        got, want = (_epoch(ld, d, 1) for ld, d in loaders)
        assert len(got) == len(want) == 3
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a.images, b.images) and torch.equal(a.targets, b.targets)
            assert a.metas == b.metas


def test_batch_partners_come_from_the_batch_and_do_not_depend_on_workers(report, monkeypatch) -> None:
    """``mosaic_partners="batch"``: every tile of a batch's mosaics (and of a mosaic mixup)
    is an image of that batch, each decoded once per batch; batches stay identical with 0
    or 2 workers; a batch under MIN_BATCH_PARTNERS draws from the dataset."""
    from libreyolo_core.data import dataset as dataset_mod

    aug = AugmentConfig(mosaic=1.0, mixup=1.0, mosaic_partners="batch")
    ds = YOLODataset(report, S, augment=True, aug=aug, seed=2)
    seen: list[list[int]] = []
    decoded: list[int] = []
    plan, load = ds._mosaic_plan, ds.load_image

    def spy_plan(i, rng):
        p = plan(i, rng)
        seen.append(p.idx)
        return p

    def spy_load(j):
        decoded.append(j)
        return load(j)

    monkeypatch.setattr(ds, "_mosaic_plan", spy_plan)
    monkeypatch.setattr(ds, "load_image", spy_load)
    idx = [3, 1, 4, 0, 5, 9, 2, 6]
    ds.__getitems__(idx)
    assert len(seen) == 16  # one mosaic per sample and one for its mixup
    assert {j for tiles in seen for j in tiles} <= set(idx)
    assert len(decoded) == len(set(decoded)) <= len(idx)
    seen.clear()
    ds.__getitems__(idx[:7])  # under MIN_BATCH_PARTNERS: partners from the whole set
    assert dataset_mod.MIN_BATCH_PARTNERS == 8
    assert not {j for tiles in seen for j in tiles} <= set(idx[:7])
    monkeypatch.undo()

    batches = []
    for workers in (0, 2):
        d = YOLODataset(report, S, augment=True, aug=aug, seed=2)
        batches.append(_epoch(build_dataloader(d, batch_size=8, workers=workers, shuffle=True, seed=2), d, 1))
    for a, b in zip(*batches, strict=True):
        assert torch.equal(a.images, b.images) and torch.equal(a.targets, b.targets)


def test_batch_partners_under_the_minimum_batch_say_so(report) -> None:
    from libreyolo_core.data.report import DatasetWarning

    ds = YOLODataset(report, S, augment=True, aug=AugmentConfig(mosaic_partners="batch"), seed=2)
    with pytest.warns(DatasetWarning, match="mosaic_partners=batch needs batches of 8 or more; this rank's batches hold 4"):
        build_dataloader(ds, batch_size=4, workers=0, shuffle=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_dataloader(ds, batch_size=8, workers=0, shuffle=True)
        build_dataloader(YOLODataset(report, S, augment=False, aug=AugmentConfig(mosaic_partners="batch")),
                         batch_size=2, workers=0, shuffle=False)


def test_batch_partners_refused_with_a_buffer_or_the_gpu_loader() -> None:
    from libreyolo_core.config import resolve_config

    assert resolve_config(model="yolo9-t", mosaic_partners="batch").augment.mosaic_partners == "batch"
    with pytest.raises(Exception, match="mosaic_partners=batch does not combine with mosaic_buffer=64"):
        resolve_config(model="yolo9-t", mosaic_partners="batch", mosaic_buffer=64)
    with pytest.raises(Exception, match="mosaic_partners=batch does not combine with loader=gpu"):
        resolve_config(model="yolo9-t", mosaic_partners="batch", loader="gpu")
    with pytest.raises(Exception, match="mosaic_partners"):
        resolve_config(model="yolo9-t", mosaic_partners="everywhere")
