"""load_data_config: split forms, names forms, and errors that name the yaml and key."""

from __future__ import annotations

from pathlib import Path

import pytest
from data_helpers import write_image

from libreyolo_core.data.config import DataConfigError, load_data_config


def _yaml(tmp_path: Path, text: str, name: str = "data.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """images/train/{a.jpg, sub/b.PNG, notes.txt-ignored}, images/val/c.JPG."""
    write_image(tmp_path / "images/train/a.jpg")
    write_image(tmp_path / "images/train/sub/b.PNG", fmt="PNG")
    (tmp_path / "images/train/notes.md").write_text("not an image")
    write_image(tmp_path / "images/val/c.JPG", fmt="JPEG")
    return tmp_path


def test_folder_split_is_recursive_sorted_and_case_insensitive(tree: Path) -> None:
    cfg = load_data_config(_yaml(tree, "train: images/train\nval: images/val\nnames: [cat, dog]\n"))
    assert cfg.root == tree
    assert cfg.train == [tree / "images/train/a.jpg", tree / "images/train/sub/b.PNG"]
    assert cfg.val == [tree / "images/val/c.JPG"]
    assert cfg.test is None
    assert cfg.names == {0: "cat", 1: "dog"} and cfg.nc == 2


def test_list_of_folders_and_files_dedupes(tree: Path) -> None:
    cfg = load_data_config(
        _yaml(
            tree,
            "path: .\ntrain: [images/train, images/val, images/val/c.JPG]\n"
            "names: {0: cat, 1: dog}\nnc: 2\n",
        )
    )
    assert [p.name for p in cfg.train] == ["a.jpg", "b.PNG", "c.JPG"]


def test_txt_list_relative_to_list_folder_with_comments(tree: Path) -> None:
    lists = tree / "lists"
    lists.mkdir()
    (lists / "train.txt").write_text(
        "# my split\n\n../images/train/a.jpg\n  ../images/val/c.JPG  \n# end\n"
    )
    cfg = load_data_config(_yaml(tree, "train: lists/train.txt\nnames: [x]\n"))
    assert cfg.train == [tree / "images/train/a.jpg", tree / "images/val/c.JPG"]


def test_path_relative_to_yaml_folder(tree: Path, tmp_path: Path) -> None:
    cfgdir = tmp_path / "configs"
    cfgdir.mkdir()
    cfg = load_data_config(_yaml(cfgdir, "path: ..\ntrain: images/val\nnames: [x]\n"))
    assert cfg.root == tree and cfg.train == [tree / "images/val/c.JPG"]


def test_names_map_unordered_keys(tree: Path) -> None:
    cfg = load_data_config(_yaml(tree, "train: images/val\nnames: {1: dog, 0: cat}\n"))
    assert cfg.names == {0: "cat", 1: "dog"}


@pytest.mark.parametrize(
    ("body", "key", "fragment"),
    [
        ("train: images/nope\nnames: [x]\n", "train", "does not exist"),
        ("train: images/val\nval: images/missing\nnames: [x]\n", "val", "images/missing"),
        ("train: images/val\nnames: [a, b]\nnc: 3\n", "nc", "nc=3 but 'names' has 2"),
        ("train: images/val\nnames: {0: a, 2: c}\n", "names", "0..1 without gaps"),
        ("train: images/val\nnames: {a: x}\n", "names", "not an integer"),
        ("train: images/val\n", "names", "missing"),
        ("train: images/val\nnames: []\n", "names", "empty"),
        ("path: nowhere\ntrain: images/val\nnames: [x]\n", "path", "does not exist"),
        ("train: images/train/notes.md\nnames: [x]\n", "train", "neither a folder"),
        ("train: empty\nnames: [x]\n", "train", "contains no images"),
        ("train: list.txt\nnames: [x]\n", "train", "list.txt:2"),
    ],
)
def test_errors_name_yaml_and_key(tree: Path, body: str, key: str, fragment: str) -> None:
    (tree / "empty").mkdir()
    (tree / "list.txt").write_text("images/val/c.JPG\nimages/val/gone.jpg\n")
    y = _yaml(tree, body, name="coco.yaml")
    with pytest.raises(DataConfigError) as ei:
        load_data_config(y)
    msg = str(ei.value)
    assert msg.startswith(f"{y}: key '{key}': "), msg
    assert fragment in msg, msg
    assert isinstance(ei.value, ValueError)


def test_missing_yaml_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(DataConfigError, match="does not exist"):
        load_data_config(tmp_path / "nope.yaml")
    with pytest.raises(DataConfigError, match="a folder, not a dataset yaml: give its data.yaml"):
        load_data_config(tmp_path)
    _yaml(tmp_path, "names: [x]\n")
    with pytest.raises(DataConfigError, match="a folder, not a dataset yaml.*; it holds data.yaml"):
        load_data_config(tmp_path)
    with pytest.raises(DataConfigError, match="not valid YAML"):
        load_data_config(_yaml(tmp_path, "train: [unclosed\n"))
    with pytest.raises(DataConfigError, match="top level must be a mapping"):
        load_data_config(_yaml(tmp_path, "- a\n- b\n"))
    with pytest.raises(DataConfigError, match="the file is empty"):
        load_data_config(_yaml(tmp_path, "# nothing yet\n"))


def test_yaml_is_safe_loaded(tree: Path) -> None:
    y = _yaml(tree, "train: !!python/object/apply:os.system ['echo hi']\nnames: [x]\n")
    with pytest.raises(DataConfigError, match="not valid YAML"):
        load_data_config(y)


def test_split_accessor(tree: Path) -> None:
    cfg = load_data_config(_yaml(tree, "train: images/val\nnames: [x]\n"))
    assert cfg.split("train") == cfg.train
    with pytest.raises(DataConfigError, match="key 'val' is not defined"):
        cfg.split("val")


def test_coco128_yaml(coco128_ro: Path) -> None:
    cfg = load_data_config(coco128_ro / "coco128.yaml")
    assert len(cfg.train) == 128 and cfg.val == cfg.train
    assert cfg.nc == 80 and cfg.names[0] == "person" and cfg.names[79] == "toothbrush"


def test_image_list_with_a_byte_order_mark_is_read(tmp_path) -> None:
    from data_helpers import write_image

    write_image(tmp_path / "images" / "a.jpg", fmt="JPEG")
    (tmp_path / "train.txt").write_bytes("\ufeffimages/a.jpg\r\n".encode())
    (tmp_path / "data.yaml").write_text("train: train.txt\nnames: [a]\n")
    assert load_data_config(tmp_path / "data.yaml").train == [tmp_path / "images" / "a.jpg"]


def test_unreadable_list_entry_is_printed_with_repr(tmp_path) -> None:
    (tmp_path / "train.txt").write_text("images/\u200bb.jpg\n")  # an invisible character
    (tmp_path / "data.yaml").write_text("train: train.txt\nnames: [a]\n")
    with pytest.raises(DataConfigError, match=r"train.txt:1: image '.*images/\\u200bb.jpg' does not exist"):
        load_data_config(tmp_path / "data.yaml")


def test_missing_split_folder_names_value_resolved_path_and_rule(tmp_path) -> None:
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "data.yaml").write_text("train: ../train/images\nnames: [a]\n")
    with pytest.raises(DataConfigError) as err:
        load_data_config(tmp_path / "cfg" / "data.yaml")
    msg = str(err.value)
    assert "key 'train': folder '../train/images' resolves to " in msg
    assert repr(str(tmp_path / "train" / "images")) in msg
    assert f"relative to 'path:' {str(tmp_path / 'cfg')!r} (which defaults to the yaml's folder)" in msg
