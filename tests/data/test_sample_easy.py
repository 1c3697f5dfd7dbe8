"""The synthetic sample set's knobs (``nc``, ``size_range``, ``max_shapes``) used by
``make demo``'s easy set."""

from __future__ import annotations

import pytest
import yaml

from libreyolo_core.data.sample import generate_sample_dataset


def test_easy_variant_has_two_classes_and_large_shapes(tmp_path):
    path = generate_sample_dataset(tmp_path / "easy", n_train=12, n_val=2, imgsz=128, seed=0,
                                   nc=2, size_range=(0.3, 0.6), max_shapes=2)
    doc = yaml.safe_load(path.read_text())
    assert doc["nc"] == 2 and doc["names"] == {0: "circle", 1: "square"}
    rows = [ln.split() for f in (tmp_path / "easy" / "labels").rglob("*.txt")
            for ln in f.read_text().splitlines()]
    assert rows and {r[0] for r in rows} <= {"0", "1"}
    per_image = [len(f.read_text().splitlines())
                 for f in (tmp_path / "easy" / "labels").rglob("*.txt")]
    assert max(per_image) <= 2
    # a side is 30-60 % of the short side (60-100 % of the width): >= 0.17 of the width
    assert min(float(r[3]) for r in rows) >= 0.17


@pytest.mark.parametrize("bad", [{"nc": 0}, {"nc": 5}, {"size_range": (0.5, 0.2)},
                                 {"max_shapes": 0}])
def test_bad_knobs_are_value_errors(tmp_path, bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        generate_sample_dataset(tmp_path / "x", n_train=1, n_val=0, imgsz=64, **bad)
