"""Model families. Importing this package is torch-free: only the registry metadata."""

from libreyolo_core.models.registry import (
    FamilySpec,
    ModelNameError,
    get_family,
    list_models,
    load_family,
    parse_model_name,
)

__all__ = ["FamilySpec", "ModelNameError", "get_family", "list_models", "load_family", "parse_model_name"]
