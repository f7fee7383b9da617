"""Detections of one image, with ultralytics' attribute names (`boxes.xyxy`, `boxes.conf`, `boxes.cls`, `names`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Boxes:
    """n boxes as rows [x1, y1, x2, y2, conf, cls] in original-image pixels."""

    data: np.ndarray
    orig_shape: tuple[int, int]

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

    @property
    def xywh(self) -> np.ndarray:
        xyxy = self.xyxy
        return np.concatenate([(xyxy[:, :2] + xyxy[:, 2:]) / 2, xyxy[:, 2:] - xyxy[:, :2]], 1)

    @property
    def xyxyn(self) -> np.ndarray:
        h, w = self.orig_shape
        return self.xyxy / np.array([w, h, w, h], dtype=self.data.dtype)


@dataclass
class Results:
    """What the model found in one image."""

    boxes: Boxes
    names: dict[int, str]
    path: str = ""
    orig_img: np.ndarray | None = field(default=None, repr=False)  # RGB uint8, kept for plot()
    error: str | None = None  # why this image could not be read; the result is then empty

    @property
    def orig_shape(self) -> tuple[int, int]:
        return self.boxes.orig_shape

    def __len__(self) -> int:
        return len(self.boxes)

    def summary(self) -> list[dict]:
        """One dict per detection: class name, class id, confidence, box corners."""
        rows = []
        for xyxy, conf, cls in zip(self.boxes.xyxy, self.boxes.conf, self.boxes.cls, strict=True):
            corners = dict(zip(("x1", "y1", "x2", "y2"), (round(float(v), 2) for v in xyxy), strict=True))
            name = self.names.get(int(cls), str(int(cls)))
            rows.append({"name": name, "class": int(cls), "confidence": round(float(conf), 5), "box": corners})
        return rows

    def to_json(self) -> str:
        return json.dumps(self.summary())

    def plot(self, line_width: int | None = None) -> np.ndarray:
        """The original image with boxes and labels drawn, as a BGR uint8 array (OpenCV's order, as ultralytics)."""
        from PIL import Image, ImageDraw

        if self.orig_img is None:
            raise ValueError("this result holds no image to draw on")
        image = Image.fromarray(self.orig_img)
        draw = ImageDraw.Draw(image)
        width = line_width or max(round(sum(image.size) / 2 * 0.003), 2)
        for row in self.summary():
            box = row["box"]
            color = _PALETTE[row["class"] % len(_PALETTE)]
            draw.rectangle((box["x1"], box["y1"], box["x2"], box["y2"]), outline=color, width=width)
            label = f"{row['name']} {row['confidence']:.2f}"
            left, top, right, bottom = draw.textbbox((box["x1"], box["y1"]), label)
            lift = bottom - top + 2
            draw.rectangle((left, top - lift, right + 2, bottom - lift), fill=color)
            draw.text((box["x1"] + 1, box["y1"] - lift), label, fill=(255, 255, 255))
        return np.asarray(image)[..., ::-1].copy()


_PALETTE = [
    (255, 56, 56), (255, 157, 151), (255, 112, 31), (255, 178, 29), (207, 210, 49), (72, 249, 10), (146, 204, 23),
    (61, 219, 134), (26, 147, 52), (0, 212, 187), (44, 153, 168), (0, 194, 255), (52, 69, 147), (100, 115, 255),
    (0, 24, 236), (132, 56, 255), (82, 0, 133), (203, 56, 255), (255, 149, 200), (255, 55, 199),
]  # fmt: skip
