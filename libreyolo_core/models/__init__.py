"""Model families. Importing this package is torch-free: it registers the built-in
families (their classes import torch only inside their builders)."""

from libreyolo_core.models.family import Family
from libreyolo_core.models.registry import (
    ModelNameError,
    families,
    get_family,
    list_models,
    parse_model_name,
)
from libreyolo_core.models.yolo9.family import Yolo9
from libreyolo_core.models.yolox.family import Yolox

__all__ = ["Family", "ModelNameError", "Yolo9", "Yolox", "families", "get_family", "list_models",
           "parse_model_name"]
