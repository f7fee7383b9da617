"""What a model found in one image, with ultralytics' attribute names.

`boxes` (detect, segment, pose), `masks` (segment), `keypoints` (pose), `obb` (oriented boxes),
`probs` (classify); whichever the task does not produce is None. Coordinates are original-image
pixels. `summary()`/`to_json()` give one plain dict per instance, `plot()` an annotated BGR image.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from yolojet.tasks.arrays import HostData, host


@dataclass
class Boxes(HostData):
    """n boxes as rows [x1, y1, x2, y2, conf, cls] in original-image pixels."""

    data: np.ndarray
    orig_shape: tuple[int, int]

    def __post_init__(self) -> None:
        self.data = host(self.data)

    def __len__(self) -> int:
        return len(self.data)

    @property
    def xyxy(self) -> np.ndarray:
        return self.data[:, :4]

    @property
    def conf(self) -> np.ndarray:
        return self.data[:, 4]

    @property
    def cls(self) -> np.ndarray:
        return self.data[:, 5]

    # Track ids, as ultralytics' tracker sets them: yolojet does not track, so there are none (code written for both
    # checks `boxes.id is not None`, or `is_track`).
    id = None
    is_track = False

    @property
    def xywh(self) -> np.ndarray:
        xyxy = self.xyxy
        return host(np.concatenate([(xyxy[:, :2] + xyxy[:, 2:]) / 2, xyxy[:, 2:] - xyxy[:, :2]], 1))

    @property
    def xyxyn(self) -> np.ndarray:
        h, w = self.orig_shape
        return self.xyxy / np.array([w, h, w, h], dtype=self.data.dtype)

    @property
    def xywhn(self) -> np.ndarray:
        h, w = self.orig_shape
        return self.xywh / np.array([w, h, w, h], dtype=self.data.dtype)


def _rounded(values: np.ndarray, decimals: int) -> list:
    """Nested lists of Python floats rounded to `decimals` (in float64: a float32 rounded to 45.63 prints as
    45.630001068115234)."""
    return np.round(np.asarray(values, np.float64), decimals).tolist()


def _corners(xyxy: np.ndarray) -> dict[str, float]:
    return dict(zip(("x1", "y1", "x2", "y2"), (round(float(v), 2) for v in xyxy), strict=True))


@dataclass
class Results:
    """One image's results; `error` is set (and everything else empty) when the image could not be read."""

    names: dict[int, str]
    orig_shape: tuple[int, int] = (0, 0)
    boxes: Boxes | None = None
    masks: Any = None  # yolojet.tasks.segment.Masks
    keypoints: Any = None  # yolojet.tasks.pose.Keypoints
    obb: Any = None  # yolojet.tasks.obb.OBB
    probs: Any = None  # yolojet.tasks.classify.Probs
    path: str = ""
    # The original image, BGR uint8 (OpenCV's order, as ultralytics' orig_img), or what makes it when first asked for
    # (the engine keeps the file's bytes, or the caller's array, rather than decoded pixels).
    image: np.ndarray | Callable[[], np.ndarray] | None = field(default=None, repr=False)
    error: str | None = None

    @property
    def orig_img(self) -> np.ndarray | None:
        """The original image as a BGR uint8 (H, W, 3) array, as ultralytics' `orig_img`."""
        if callable(self.image):
            self.image = self.image()
        return self.image

    def cpu(self) -> Results:
        """The results themselves: they are in host memory already (ultralytics-style `r.cpu()` runs as is)."""
        return self

    def numpy(self) -> Results:
        return self

    def __len__(self) -> int:
        for part in (self.boxes, self.obb):
            if part is not None:
                return len(part)
        return 0 if self.probs is None else len(self.probs)  # a classifier's: its class count, as ultralytics

    def _name(self, cls: float) -> str:
        return self.names.get(int(cls), str(int(cls)))

    def summary(self) -> list[dict]:
        """One dict per instance (per top-5 class for classification)."""
        if self.probs is not None:
            return [
                {"name": self._name(c), "class": int(c), "confidence": round(float(p), 5)}
                for c, p in zip(self.probs.top5, self.probs.top5conf, strict=True)
            ]
        rows = []
        if self.obb is not None:
            for xywhr, corners, conf, cls in zip(
                self.obb.xywhr, self.obb.xyxyxyxy, self.obb.conf, self.obb.cls, strict=True
            ):
                rows.append(
                    {
                        "name": self._name(cls),
                        "class": int(cls),
                        "confidence": round(float(conf), 5),
                        "box": dict(zip(("x", "y", "w", "h", "r"), (round(float(v), 4) for v in xywhr), strict=True)),
                        "corners": _rounded(corners, 2),
                    }
                )
            return rows
        if self.boxes is None:
            return rows
        for i, (xyxy, conf, cls) in enumerate(zip(self.boxes.xyxy, self.boxes.conf, self.boxes.cls, strict=True)):
            row: dict[str, Any] = {
                "name": self._name(cls),
                "class": int(cls),
                "confidence": round(float(conf), 5),
                "box": _corners(xyxy),
            }
            if self.masks is not None:
                polygon = self.masks.xy[i]
                row["segments"] = {"x": _rounded(polygon[:, 0], 2), "y": _rounded(polygon[:, 1], 2)}
            if self.keypoints is not None:
                points = self.keypoints.data[i]
                row["keypoints"] = {"x": _rounded(points[:, 0], 2), "y": _rounded(points[:, 1], 2)}
                if points.shape[1] == 3:
                    row["keypoints"]["visible"] = _rounded(points[:, 2], 4)
            rows.append(row)
        return rows

    def to_json(self) -> str:
        return json.dumps(self.summary())

    def _counts_by_id(self) -> list[tuple[int, int]]:
        """(class id, instances) in class id order; empty for classification or no instances."""
        part = self.obb if self.obb is not None else self.boxes
        if part is None or len(part) == 0:
            return []
        ids, counts = np.unique(np.asarray(part.cls, np.int64), return_counts=True)
        return list(zip(ids.tolist(), counts.tolist(), strict=True))

    def class_counts(self) -> dict[str, int]:
        """Instances per class name, most first (ties by class id); empty for classification."""
        order = sorted(self._counts_by_id(), key=lambda pair: (-pair[1], pair[0]))
        return {self._name(i): n for i, n in order}

    def verbose(self) -> str:
        """What ultralytics' `Results.verbose()` says: "4 persons, 1 bus, " (by class id), "(no detections), ",
        or a classifier's top five "bus 0.92, ...", each part followed by ", "."""
        if self.probs is not None:
            return "".join(
                f"{self._name(c)} {p:.2f}, " for c, p in zip(self.probs.top5, self.probs.top5conf, strict=True)
            )
        counts = self._counts_by_id()
        if not counts:
            return "(no detections), "
        return "".join(f"{n} {self._name(i)}{'s' * (n > 1)}, " for i, n in counts)

    def plot(
        self,
        conf: bool = True,
        line_width: int | None = None,
        labels: bool = True,
        boxes: bool = True,
        masks: bool = True,
        probs: bool = True,
    ) -> np.ndarray:
        """The original image with the results drawn, as a BGR uint8 array (OpenCV's order, as ultralytics); the
        switches are ultralytics' (`conf=False`: labels without the score, `labels=False`: no labels, `boxes`, `masks`,
        `probs`: whether to draw those)."""
        from PIL import Image, ImageDraw

        if self.orig_img is None:
            raise ValueError("this result holds no image to draw on")
        canvas = self.orig_img[..., ::-1].astype(np.float32)  # drawn in RGB (the palette's order and PIL's)
        if self.masks is not None and masks:
            for i, mask in enumerate(self.masks.data):
                assert self.boxes is not None  # segment results: a mask per box
                color = np.array(_PALETTE[int(self.boxes.cls[i]) % len(_PALETTE)], dtype=np.float32)
                canvas[mask] = canvas[mask] * 0.5 + color * 0.5
        image = Image.fromarray(canvas.astype(np.uint8))
        draw = ImageDraw.Draw(image)
        width = line_width or max(round(sum(image.size) / 2 * 0.003), 2)
        font = _font(max(round(sum(image.size) / 2 * 0.02), 12))
        if self.probs is not None and probs:
            text = "\n".join(f"{r['name']} {r['confidence']:.2f}" if conf else r["name"] for r in self.summary())
            draw.text((8, 8), text, fill=(255, 255, 255), font=font)
        for i, row in enumerate(self.summary() if self.probs is None else []):
            color = _PALETTE[row["class"] % len(_PALETTE)]
            if "corners" in row:
                anchor = tuple(row["corners"][0])
                if boxes:
                    draw.polygon([tuple(p) for p in row["corners"]], outline=color, width=width)
            else:
                box = row["box"]
                anchor = (box["x1"], box["y1"])
                if boxes:
                    draw.rectangle((box["x1"], box["y1"], box["x2"], box["y2"]), outline=color, width=width)
            if boxes and labels:
                label = f"{row['name']} {row['confidence']:.2f}" if conf else row["name"]
                left, top, right, bottom = draw.textbbox(anchor, label, font=font)
                lift = bottom - anchor[1] + 2
                if anchor[1] - lift < 0:  # no room above the box (it touches the image's top): inside it instead
                    lift = 0
                draw.rectangle((left, top - lift, right + 2, bottom - lift), fill=color)
                draw.text((anchor[0] + 1, anchor[1] - lift), label, fill=(255, 255, 255), font=font)
            if self.keypoints is not None:
                for x, y, *visible in self.keypoints.data[i]:
                    if not visible or visible[0] >= 0.5:
                        draw.ellipse((x - width, y - width, x + width, y + width), fill=color)
        return np.asarray(image)[..., ::-1].copy()


def _font(size: int) -> Any:
    """Pillow's built-in scalable font at `size` pixels (its small bitmap font where FreeType is missing)."""
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except (ImportError, OSError, TypeError):
        return ImageFont.load_default()


_PALETTE = [
    (255, 56, 56),
    (255, 157, 151),
    (255, 112, 31),
    (255, 178, 29),
    (207, 210, 49),
    (72, 249, 10),
    (146, 204, 23),
    (61, 219, 134),
    (26, 147, 52),
    (0, 212, 187),
    (44, 153, 168),
    (0, 194, 255),
    (52, 69, 147),
    (100, 115, 255),
    (0, 24, 236),
    (132, 56, 255),
    (82, 0, 133),
    (203, 56, 255),
    (255, 149, 200),
    (255, 55, 199),
]
