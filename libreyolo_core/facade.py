"""``LibreYOLO``: the Python entry point (build, train, validate, predict, export).

    model = LibreYOLO("yolo9-t")                      # from the registry
    model.train(data="coco128.yaml", epochs=3, imgsz=320)
    model = LibreYOLO("runs/train/exp/weights/best.pt")  # from a checkpoint
    model = LibreYOLO("yolox_s.pth")                  # or published weights (LibreYOLO 1.x,
                                                      # upstream YOLOv9, Megvii YOLOX)
    results = model.predict("images/", conf=0.25)
    model.export(format="onnx", imgsz=640)            # best.onnx, checked by onnxruntime
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from libreyolo_core.config import TrainConfig
from libreyolo_core.distributed.context import torchrun_env
from libreyolo_core.predict import Prediction, as_rgb
from libreyolo_core.records.train import TrainResult
from libreyolo_core.weights.detector import Detector, is_weights_path

__all__ = ["LibreYOLO", "Prediction", "is_weights_path"]

log = logging.getLogger(__name__)

#: Images per forward pass of :meth:`LibreYOLO.predict` (val's default batch).
PREDICT_BATCH = 16


class LibreYOLO(Detector):
    """The public facade: a :class:`~libreyolo_core.weights.detector.Detector` (its
    constructor takes the same ``model``, ``nc``, ``names`` and ``expect`` and raises the
    same errors) with ``train``, ``val``, ``predict``, ``export`` and ``info``.
    """

    def __repr__(self) -> str:
        src = f", checkpoint={str(self.checkpoint)!r}" if self.checkpoint else ""
        return f"LibreYOLO({self.name!r}, nc={self.nc}{src})"

    # -- training -----------------------------------------------------------------------
    def train(
        self,
        data: str | Path | None = None,
        callbacks: dict[str, list[Callable]] | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """Train on ``data`` (a dataset yaml) with TrainConfig ``overrides``.

        The weights of this object are the starting point (matching layers are kept when
        the dataset's class count differs). After training, the best checkpoint is loaded
        back into this object.

        Returns:
            Final metrics: ``mAP50``, ``mAP50-95``, ``precision``, ``recall`` of the best
            epoch, plus ``best_epoch``, ``save_dir``, ``best_checkpoint``,
            ``last_checkpoint``.

        Several CUDA devices (``device="0,1"`` or ``[0, 1]``) without a torchrun
        environment start one DDP process per device (:func:`~libreyolo_core.distributed.
        spawn.spawn_train`); call it under ``if __name__ == "__main__":`` and pass only
        picklable ``callbacks``. Under torchrun this process is one rank and trains as such.

        Raises:
            ConfigError: a bad key or value. DataConfigError / DatasetError: bad dataset.
            DeviceError: a device that does not exist. ValueError: a global ``batch`` not
                divisible by the number of devices.
            MainGuardError: several devices from an unguarded script (see above).
            RuntimeError: an unpicklable callback (several devices).
            TrainingInterrupted: SIGTERM; ``last.pt`` was saved first.
        """
        from libreyolo_core.engine.train_run import train_config

        return self.train_resolved(train_config(self, data, overrides), callbacks).to_dict()

    def train_resolved(self, cfg: TrainConfig, callbacks: dict[str, list[Callable]] | None = None) -> TrainResult:
        """Train with a config already resolved (:func:`~libreyolo_core.config.resolve_config`
        for this model): :meth:`train` after its keys are resolved, and the way in of
        ``libreyolo train``, which resolves them before it builds the model. The preflight
        runs when ``cfg.preflight`` asks for it.

        Returns:
            The run's :class:`~libreyolo_core.records.train.TrainResult` (:meth:`train`
            returns its ``to_dict()``).

        Raises:
            As :meth:`train`, less ConfigError (the keys are resolved).
        """
        from libreyolo_core.engine.train_run import train_run

        return train_run(self, cfg, callbacks, preflight_fn=self._preflight)

    def _preflight(self, cfg: Any, devices: list[str], resumed: bool) -> Any:
        """The preflight estimate of ``cfg`` when it asks for one (``preflight=True``): one
        short profile trial of this model on one device before training
        (:func:`~libreyolo_core.profiler.preflight.run_preflight`). ``None`` without
        ``preflight``, for a resumed run (its earlier attempt had one) and with several
        devices or ranks (the estimate is for one device: logged)."""
        if not cfg.preflight:
            return None
        if resumed:
            log.info("preflight: skipped for a resumed run")
            return None
        env = torchrun_env()
        if len(devices) > 1 or (env is not None and env[2] > 1):
            log.warning("preflight: skipped; it estimates a run on one device, not %s",
                        f"{env[2]} ranks" if env is not None else f"{len(devices)} devices")
            return None
        from libreyolo_core.profiler.preflight import run_preflight

        model = str(self.checkpoint) if self.checkpoint is not None else self.name
        return run_preflight(model, cfg)  # raises TrainingInterrupted on SIGTERM

    # -- validation -----------------------------------------------------------------------
    def val(
        self,
        data: str | Path,
        split: str = "val",
        batch: int = 16,
        imgsz: int | None = None,
        conf: float = 0.001,
        iou: float = 0.6,
        max_det: int = 300,
        device: str = "auto",
        workers: int = 2,
        save: bool = True,
        plots: bool = True,
        plot_images: int = 16,
        project: str | Path = "runs/val",
        name: str = "exp",
        exist_ok: bool = False,
        verbose: bool = True,
    ) -> dict[str, Any]:
        """COCO metrics of this model on a split of ``data``, and its validation report.

        With ``save`` the report (:mod:`~libreyolo_core.eval.report`: ``report.json``,
        ``predictions.json``, the curves, confusion matrices and ``plot_images`` pictures
        of detections unless ``plots=False``) goes to ``project/name`` (``runs/val/exp``,
        ``exp2``, ... unless ``exist_ok``); ``verbose`` prints its per-class table.

        Returns:
            ``mAP50-95``, ``mAP50``, ``precision``, ``recall``, ``per_class_AP``; with
            ``save``, ``save_dir`` (the report's folder) too.

        Raises:
            DataConfigError: the yaml has no such split.
        """
        from libreyolo_core.data.config import DataConfigError, load_data_config
        from libreyolo_core.data.dataset import YOLODataset
        from libreyolo_core.data.loader import build_dataloader
        from libreyolo_core.data.scan import scan_split
        from libreyolo_core.distributed.device import select_device
        from libreyolo_core.eval.validate import ValPredictions, validate

        dc = load_data_config(data)
        if len(dc.names) != self.nc:
            raise DataConfigError(f"{dc.yaml_path}: {len(dc.names)} classes but the model has {self.nc}")
        dev = select_device(device)
        report = scan_split(dc, split)
        ds = YOLODataset(report, self._inference_size(imgsz), augment=False, cache=False)
        loader = build_dataloader(ds, batch, workers, shuffle=False)
        self.model.to(dev)
        kept = ValPredictions() if save else None
        try:
            t0 = time.perf_counter()
            metrics = validate(self.model, self.family, loader, dev, self.nc, conf=conf, iou=iou,
                               max_det=max_det, keep=kept)
            val_s = time.perf_counter() - t0
        finally:
            self.model.cpu().eval()
        if kept is not None:
            from libreyolo_core.engine.rundir import make_run_dir
            from libreyolo_core.eval.report import format_table, write_report

            out = make_run_dir(project, name, exist_ok, weights=False)
            train_labels = None
            if plots and dc.train:
                train_labels = [r.labels for r in scan_split(dc, "train").records]
            meta = {"epoch": None, "model": self.name, "imgsz": ds.imgsz, "split": split, "data": str(dc.yaml_path),
                    "val_time_s": round(val_s, 3)}
            written = write_report(out, kept, dict(self.names), plot_images, train_labels, meta, plots=plots)
            if verbose:
                print(format_table(written), flush=True)
                print(f"report: {out} ({written['timing']['total_s']:.2f} s; validation {val_s:.2f} s)", flush=True)
            metrics["save_dir"] = str(out)
        return metrics

    # -- inference ------------------------------------------------------------------------
    def predict(
        self,
        source: Any,
        conf: float = 0.25,
        iou: float = 0.45,
        imgsz: int | None = None,
        max_det: int = 300,
        device: str = "auto",
        save: bool = False,
        save_txt: bool = False,
        save_conf: bool = False,
        save_json: bool = False,
        project: str | Path = "runs/predict",
        name: str = "exp",
        exist_ok: bool = False,
        stream: bool = False,
        verbose: bool = False,
    ) -> Any:
        """Detect objects in ``source``.

        Args:
            source: an image path, a folder, a glob, a list file (``.txt``), a video file
                (decoded frame by frame), a PIL image, a numpy array (H, W, 3) uint8
                **RGB**, or a list of these (:mod:`~libreyolo_core.predict`).
            conf: score threshold. iou: NMS IoU threshold. max_det: cap per image.
            imgsz: inference size (default: the training size).
            save: annotated images / videos; save_txt: YOLO label files (save_conf adds
                the score); save_json: ``predictions.json`` (COCO results). Saved under
                ``project/name`` (``runs/predict/exp``, ``exp2``, ... unless ``exist_ok``).
            stream: return a generator (one :class:`Prediction` per image or frame, memory
                flat over a long video) instead of a list.
            verbose: a progress bar on stderr (images and frames).

        Returns:
            One :class:`Prediction` per image or video frame, in source order
            (``extra["frame"]`` for a frame), boxes in original-image pixels; a list, or a
            generator with ``stream``. With a save option each prediction's
            ``extra["save_dir"]`` is the output folder. The images go through the network
            :data:`PREDICT_BATCH` at a time (letterboxed to one ``imgsz`` square, so they
            stack); memory stays flat over a long video.

        Raises:
            FileNotFoundError: a path that does not exist, or a folder without images.
            SourceError: a video OpenCV cannot open.
        """
        gen = self._predict_iter(source, conf, iou, imgsz, max_det, device,
                                 dict(save=save, save_txt=save_txt, save_conf=save_conf, save_json=save_json),
                                 (project, name, exist_ok), verbose)
        return gen if stream else list(gen)

    @torch.no_grad()
    def _predict_iter(self, source: Any, conf: float, iou: float, imgsz: int | None, max_det: int,
                      device: str, saves: dict[str, bool], where: tuple[Any, str, bool],
                      verbose: bool) -> Any:
        from tqdm import tqdm

        from libreyolo_core.data.augment import letterbox
        from libreyolo_core.distributed.device import select_device
        from libreyolo_core.models.postprocess import scale_boxes
        from libreyolo_core.predict import PredictSaver, expand_source, iter_frames, total_frames

        sources = expand_source(source)
        size = self._inference_size(imgsz)
        saver = None
        if any(saves.values()):
            from libreyolo_core.engine.rundir import make_run_dir

            out = make_run_dir(where[0], where[1], where[2], weights=False)
            saver = PredictSaver(out, dict(self.names), **saves)
        dev = select_device(device)
        net = self.model.to(dev).eval()
        bar = tqdm(total=total_frames(sources), unit="img", disable=not verbose, file=sys.stderr)
        chunk: list[tuple[np.ndarray, np.ndarray, float, tuple[int, int], Any, Any, Any]] = []

        def flush() -> Any:
            # one forward pass per PREDICT_BATCH images, as val does: image by image, every
            # layer's thread pool wakes 16x as often; on a loaded machine that cost 20x
            x = torch.from_numpy(np.stack([c[1] for c in chunk]).transpose(0, 3, 1, 2)).to(dev)
            preds = self.family.postprocess(net(self.family.preprocess(x)), conf=conf, iou=iou,
                                            max_det=max_det)
            for (img, _, ratio, pad, src, frame, fps), pred in zip(chunk, preds, strict=True):
                h0, w0 = img.shape[:2]
                pred = pred.float().cpu()
                boxes = scale_boxes(pred[:, :4].clone(), ratio, pad, (h0, w0))
                classes = pred[:, 5].long().numpy()
                p = Prediction(boxes.numpy().astype(np.float32), pred[:, 4].numpy().astype(np.float32),
                               classes, [self.names.get(int(c), str(int(c))) for c in classes],
                               str(src.path) if src.kind != "array" else None, (h0, w0))
                if frame is not None:
                    p.extra["frame"] = frame
                if saver is not None:
                    saver.add(img, p, src, frame, fps)
                    p.extra["save_dir"] = str(saver.out)
                bar.update(1)
                yield p
            chunk.clear()

        try:
            for img, src, frame, fps in iter_frames(sources, self._as_rgb):
                canvas, _, ratio, pad = letterbox(img, size)
                chunk.append((img, np.ascontiguousarray(canvas), ratio, pad, src, frame, fps))
                if len(chunk) == PREDICT_BATCH:
                    yield from flush()
            if chunk:
                yield from flush()
        finally:
            bar.close()
            if saver is not None:
                saver.close()
            self.model.cpu()

    _as_rgb = staticmethod(as_rgb)

    # -- export ---------------------------------------------------------------------------
    def export(
        self,
        format: str = "onnx",
        file: str | Path | None = None,
        imgsz: int | None = None,
        dynamic: bool = False,
        half: bool = False,
        opset: int | None = None,
        nms: bool = False,
        simplify: str | bool | None = None,
        conf: float = 0.25,
        iou: float = 0.45,
        max_det: int = 300,
        batch: int = 1,
    ) -> Any:
        """Export this model (``format="onnx"``), checked by onnxruntime before it is kept.

        Args:
            file: the output path (default: the checkpoint's path with ``.onnx``, or
                ``<name>.onnx`` in the current folder for a registry model).
            imgsz: input size (default: the training size; rounded up to the stride).
            dynamic: dynamic batch, height and width. half: float16 network.
            opset: ONNX opset (default 17). nms: final detections in the graph (layout
                ``nms``) instead of the decoded boxes and raw maps (``raw``).
            simplify: onnxslim / onnxsim (default: when installed; False: never).
            conf, iou, max_det: the thresholds of the ``nms`` layout.
            batch: the batch of a static export.

        Returns:
            :class:`~libreyolo_core.export.onnx.ExportResult` (path, check figure, layout).
            The layouts and metadata are described in docs/export.md.

        Raises:
            ValueError: an unknown format. ExportError: onnx/onnxruntime missing (one line
                saying what to install) or the exporter failing. ExportCheckError: the file's
                outputs differ from PyTorch's beyond tolerance (no file is left).
        """
        from libreyolo_core.export.model import export_detector

        return export_detector(self, format=format, file=file, imgsz=imgsz, dynamic=dynamic, half=half,
                               opset=opset, nms=nms, simplify=simplify, conf=conf, iou=iou,
                               max_det=max_det, batch=batch)

    # -- misc -------------------------------------------------------------------------------
    def info(self, imgsz: int | None = None) -> dict[str, Any]:
        """Parameter count and GFLOPs (2 x MAC) at ``imgsz`` (rounded up to a multiple of the
        stride); the size used is returned as ``imgsz``."""
        from libreyolo_core.models.flops import model_info

        size = self._inference_size(imgsz)
        return {**model_info(self.model, size), "imgsz": size}
