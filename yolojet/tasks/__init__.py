"""Result types per task and their conversions (xyxy/xywh, polygons, RLE, JSON). Plain numpy: no torch, no GPU."""

from yolojet.tasks.classify import Probs
from yolojet.tasks.obb import OBB
from yolojet.tasks.pose import Keypoints
from yolojet.tasks.results import Boxes, Results
from yolojet.tasks.segment import Masks

__all__ = ["OBB", "Boxes", "Keypoints", "Masks", "Probs", "Results"]
