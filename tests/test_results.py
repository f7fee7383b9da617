"""Results as a user reads and draws them: ultralytics' attribute names and meanings, and plot()."""

from __future__ import annotations

import numpy as np

from yolojet.tasks.classify import Probs
from yolojet.tasks.results import Boxes, Results

BACKGROUND = 90


def _image() -> np.ndarray:
    rng = np.random.default_rng(0)
    image = np.full((200, 300, 3), BACKGROUND, np.uint8)
    image[150:, :, :] = rng.integers(0, 255, (50, 300, 3), dtype=np.uint8)  # some texture far from the boxes
    return image


def test_plot_keeps_the_image_bgr_and_labels_boxes_at_the_top_edge():
    """A box touching the image's top still gets its label (drawn inside the box); away from the boxes the BGR
    image comes back unchanged."""
    image = _image()
    boxes = Boxes(np.array([[10, 0, 120, 100, 0.9, 0], [160, 60, 280, 120, 0.8, 1]], np.float32), (200, 300))
    result = Results(names={0: "person", 1: "car"}, image=image, orig_shape=(200, 300), boxes=boxes)
    drawn = result.plot()
    assert drawn.shape == image.shape and drawn.dtype == np.uint8
    np.testing.assert_array_equal(drawn[150:], image[150:])  # untouched, in the caller's channel order
    label_area = drawn[2:12, 14:50]
    assert (label_area != BACKGROUND).any(axis=2).mean() > 0.5, "the top box's label is missing"
    above_second = drawn[50:58, 162:200]  # the second box has room above it: its label goes there
    assert (above_second != BACKGROUND).any(axis=2).mean() > 0.5


def test_plot_takes_ultralytics_switches_and_boxes_say_they_are_not_tracked():
    """ultralytics' `plot(conf=False)` draws labels without scores (narrower), `labels=False` none, `boxes=False`
    neither boxes nor labels; `boxes.id` is None and `is_track` False, as ultralytics' untracked boxes say."""
    image = _image()
    boxes = Boxes(np.array([[10, 20, 120, 100, 0.9, 0], [160, 60, 280, 120, 0.8, 1]], np.float32), (200, 300))
    result = Results(names={0: "person", 1: "car"}, image=image, orig_shape=(200, 300), boxes=boxes)
    changed = {
        name: (result.plot(**switch) != image).any(axis=2)
        for name, switch in (
            ("all", {}),
            ("no conf", {"conf": False}),
            ("no labels", {"labels": False}),
            ("no boxes", {"boxes": False}),
        )
    }
    assert not changed["no boxes"].any()
    assert changed["no labels"].sum() < changed["no conf"].sum() < changed["all"].sum()
    assert not changed["no labels"][8:18, 14:50].any() and changed["all"][8:18, 14:50].any()  # the first label's place
    assert boxes.id is None and boxes.is_track is False


def test_classifier_length_is_its_class_count_and_boxes_normalise():
    probs = Results(names={i: str(i) for i in range(7)}, orig_shape=(4, 5), probs=Probs(np.full(7, 1 / 7)))
    assert len(probs) == 7  # as ultralytics' Results
    boxes = Boxes(np.array([[0, 0, 50, 20, 0.5, 0]], np.float32), (40, 100))
    np.testing.assert_allclose(boxes.xywhn, [[0.25, 0.25, 0.5, 0.5]])


def test_json_numbers_are_rounded_as_printed():
    """float32 coordinates rounded in float64: 45.63, not 45.630001068115234."""
    import json

    from yolojet.tasks.pose import Keypoints

    boxes = Boxes(np.array([[1.234567, 2, 30, 40, 0.5, 0]], np.float32), (50, 60))
    points = Keypoints(np.array([[[45.63, 12.3456, 0.98771]]], np.float32), (50, 60))
    row = json.loads(Results(names={0: "a"}, orig_shape=(50, 60), boxes=boxes, keypoints=points).to_json())[0]
    assert row["keypoints"] == {"x": [45.63], "y": [12.35], "visible": [0.9877]}
    assert row["box"]["x1"] == 1.23
