"""Result types per task and their conversions (xyxy/xywh, JSON). Plain numpy: no torch, no GPU."""

from yolojet.tasks.results import Boxes, Results

__all__ = ["Boxes", "Results"]
