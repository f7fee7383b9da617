"""Evaluation datasets read as ultralytics reads them, and every malformed one refused in one line naming what is
wrong (never a traceback, never a score of the wrong thing): no model runs here."""

from __future__ import annotations

import json

import pytest
from PIL import Image
from support import run_cli

from yolojet.errors import DatasetError, EngineConfigError
from yolojet.eval.datasets import Dataset, load_dataset
from yolojet.eval.val import category_map, check_val_options


def write_yolo_dataset(root, names=("person", "bus", "tie"), size=(64, 48), orientation=None, yaml_path=True):
    """One JPEG of `size` (width, height) with one labelled box, under root/images/val; the data YAML's path."""
    images, labels = root / "images" / "val", root / "labels" / "val"
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    Image.new("RGB", size, (90, 120, 150)).save(images / "a.jpg", exif=exif)
    (labels / "a.txt").write_text("1 0.5 0.25 0.5 0.25\n")
    where = f"path: {root}\n" if yaml_path else ""
    (root / "data.yaml").write_text(f"{where}val: images/val\nnames: {list(names)}\n")
    return root / "data.yaml"


@pytest.mark.parametrize(("orientation", "read_size"), [(None, (64, 48)), (1, (64, 48)), (6, (48, 64)), (8, (48, 64))])
def test_a_photo_turned_by_its_exif_is_labelled_at_the_size_it_is_read(tmp_path, orientation, read_size):
    """A phone's photo stored 64 wide and 48 high with EXIF orientation 6 is read (cv2.imread, ultralytics) 48 wide
    and 64 high; its normalised labels are scaled by that size, as ultralytics' validator scales them."""
    dataset = load_dataset(write_yolo_dataset(tmp_path, orientation=orientation))
    (image,) = dataset.images
    assert (image.width, image.height) == read_size
    (annotation,) = dataset.ground_truth["annotations"]
    width, height = read_size
    assert annotation["bbox"] == pytest.approx([0.25 * width, 0.125 * height, 0.5 * width, 0.25 * height])


def test_a_relative_yaml_without_a_path_is_read_from_its_own_folder(tmp_path, monkeypatch):
    write_yolo_dataset(tmp_path / "ds", yaml_path=False)
    monkeypatch.chdir(tmp_path)
    dataset = load_dataset("ds/data.yaml")
    assert [image.path.resolve() for image in dataset.images] == [tmp_path / "ds" / "images" / "val" / "a.jpg"]


def coco(tmp_path, **changes) -> str:
    """A valid COCO instances file of one image and one box, with `changes` made to it; its path."""
    Image.new("RGB", (64, 48)).save(tmp_path / "a.png")
    document = {
        "images": [{"id": 1, "file_name": "a.png", "width": 64, "height": 48}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 2, 10, 20]}],
        "categories": [{"id": 3, "name": "car"}],
    }
    for key, value in changes.items():
        document[key] = value
    (tmp_path / "instances.json").write_text(json.dumps(document))
    return str(tmp_path / "instances.json")


IMAGE = {"id": 1, "file_name": "a.png", "width": 64, "height": 48}
BOX = {"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 2, 10, 20]}
MALFORMED_COCO = {
    "a category without a name": ({"categories": [{"id": 3}]}, r"category \{'id': 3\} needs an integer id and a name"),
    "a category without an id": ({"categories": [{"name": "car"}]}, "needs an integer id and a name"),
    "a category id given twice": (
        {"categories": [{"id": 3, "name": "car"}, {"id": 3, "name": "bus"}]},
        r"category id 3 is given twice \(car, bus\)",
    ),
    "an annotation that is not an object": ({"annotations": [7]}, "an entry of 'annotations' is not an object: 7"),
    "annotations that are not a list": ({"annotations": {"id": 1}}, "'annotations' is not a list"),
    "a null bbox": ({"annotations": [{**BOX, "bbox": None}]}, r"bbox None, expected \[x, y, w, h\]"),
    "a bbox of strings": ({"annotations": [{**BOX, "bbox": ["1", "2", "3", "4"]}]}, "expected \\[x, y, w, h\\]"),
    "keypoints of strings": ({"annotations": [{**BOX, "keypoints": ["1", "2", "2"]}]}, "triples of numbers"),
    "an image id that is a string": (
        {"images": [{**IMAGE, "id": "1"}], "annotations": [{**BOX, "image_id": "1"}]},
        "its id is not an integer",
    ),
    "an image id given twice": (
        {"images": [IMAGE, {**IMAGE, "file_name": "a.png"}]},
        r"image ids \[1\] are given to more than one image",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED_COCO))
def test_a_malformed_coco_file_is_refused_naming_what_is_wrong(tmp_path, case):
    changes, message = MALFORMED_COCO[case]
    with pytest.raises(DatasetError, match=message):
        load_dataset(coco(tmp_path, **changes))


@pytest.mark.parametrize(
    ("label", "message"),
    [
        (b"nan 0.5 0.5 0.2 0.2\n", "expected finite numbers"),
        (b"1 inf 0.5 0.2 0.2\n", "expected finite numbers"),
        (b"\xff\xfe1 0.5 0.5 0.2 0.2\n", "a.txt: not a UTF-8 text file"),
    ],
)
def test_a_label_file_that_is_not_finite_numbers_in_text_is_refused(tmp_path, label, message):
    data = write_yolo_dataset(tmp_path)
    (tmp_path / "labels" / "val" / "a.txt").write_bytes(label)
    with pytest.raises(DatasetError, match=message):
        load_dataset(data)


def test_a_class_name_given_twice_is_matched_by_order_or_refused():
    """Names matched by name would send two classes to one category and score the other's boxes against nothing: with
    as many categories as classes they match by order (ultralytics' validator matches class indices), otherwise the
    dataset is refused."""
    model = {0: "person", 1: "bus", 2: "tie"}
    repeated = Dataset([], {0: "person", 1: "person", 2: "tie"}, {}, "dup.yaml")
    assert category_map(model, repeated) == [0, 1, 2]
    fewer = Dataset([], {0: "person", 1: "person"}, {}, "dup.yaml")
    with pytest.raises(DatasetError, match="the class names person are given more than once"):
        category_map(model, fewer)
    assert category_map(model, Dataset([], {5: "tie", 9: "person"}, {}, "subset.json")) == [9, None, 5]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"conf": 1.5}, r"conf 1.5: expected a number in \[0, 1\]"),
        ({"conf": -1.0}, r"conf -1.0: expected a number in \[0, 1\]"),
        ({"iou": 2.0}, r"iou 2.0: expected a number in \[0, 1\]"),
        ({"max_det": 0}, r"max_det 0: expected an int in 1..300"),
        ({"max_det": 301}, r"max_det 301: expected an int in 1..300"),
    ],
)
def test_val_options_out_of_range_are_refused_before_the_model_loads(tmp_path, capsys, options, message):
    given = {"conf": 0.001, "iou": 0.7, "max_det": 300, **options}
    with pytest.raises(EngineConfigError, match=message):
        check_val_options(**given)
    flag, value = next(iter(options.items()))
    code, _, stderr = run_cli(
        capsys, "val", tmp_path / "no_model", "--data", tmp_path / "none.json", f"--{flag.replace('_', '-')}", value
    )
    assert code == 2 and "expected" in stderr and "no_model" not in stderr, stderr
