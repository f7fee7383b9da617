"""`yolojet plot labels.jsonl --out DIR`: what a labeling run found, to look at rather than read.

- `grid.png`: up to 16 images sampled from the records (seeded, so a plot made twice is the same), each drawn with its
  detections (boxes, masks, keypoints, rotated boxes) or its top-5 classes, in a 4-wide grid;
- `classes.png`: detections (or top-1 classes) per class, the 30 most frequent;
- `scores.png`: a histogram of the confidences.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np

from yolojet.client.records import iter_records
from yolojet.errors import DatasetError, ImageReadError, RecordsError
from yolojet.outputs import check_output_folder, write_atomically
from yolojet.tasks import Boxes, Keypoints, Masks, Results
from yolojet.tasks.obb import OBB
from yolojet.tasks.segment import decode_rle

TILE = 320  # pixels across a grid cell
COLUMNS = 4
SCORE_BINS = 20


def results_of(record: dict) -> Results:
    """A record as a `Results` (no probabilities: a record keeps the top 5 only)."""
    shape = (record["height"], record["width"])
    names = {d["class"]: d["name"] for d in record.get("detections", []) + record.get("top5", [])}
    detections = record.get("detections", [])
    parts: dict = {}
    if detections and "rotated_box" in detections[0]:
        parts["obb"] = OBB(
            np.array([[*d["rotated_box"], d["confidence"], d["class"]] for d in detections], np.float32), shape
        )
    elif detections or record.get("task") not in ("classify", "obb"):
        rows = np.array([[*d["box"], d["confidence"], d["class"]] for d in detections], np.float32).reshape(-1, 6)
        parts["boxes"] = Boxes(rows, shape)
        if detections and "mask" in detections[0]:
            parts["masks"] = Masks(np.stack([decode_rle(d["mask"]) for d in detections]))
        if detections and "keypoints" in detections[0]:
            parts["keypoints"] = Keypoints(np.array([d["keypoints"] for d in detections], np.float32), shape)
    return Results(names=names, orig_shape=shape, path=record["path"], **parts)


def _tile(record: dict) -> np.ndarray:
    from PIL import Image, ImageDraw

    from yolojet.images import load_frame

    result = results_of(record)
    result.image = load_frame(record["path"]).original_bgr()
    drawn = Image.fromarray(result.plot()[..., ::-1])
    if record.get("top5"):
        lines = "\n".join(f"{t['name']} {t['confidence']:.2f}" for t in record["top5"])
        ImageDraw.Draw(drawn).text((8, 8), lines, fill=(255, 255, 255))
    drawn.thumbnail((TILE, TILE))
    cell = Image.new("RGB", (TILE, TILE), (32, 32, 32))
    cell.paste(drawn, ((TILE - drawn.width) // 2, (TILE - drawn.height) // 2))
    return np.asarray(cell)


def plot(labels: Path, out: Path, samples: int = 16, seed: int = 0) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    check_output_folder(out, "--out")
    if not labels.is_file():
        raise DatasetError(f"{labels}: no such file")
    # One pass, a record at a time (a million-image run's records are never all in memory): a seeded reservoir
    # sample for the grid, counts by class and a histogram of the confidences.
    rng = random.Random(seed)
    chosen: list[dict] = []
    counts: dict[str, int] = {}
    edges = np.linspace(0.0, 1.0, SCORE_BINS + 1)
    scores = np.zeros(SCORE_BINS, np.int64)
    pending: list[float] = []
    images = found = 0
    first: dict | None = None
    for images, record in enumerate(iter_records(labels), start=1):
        if not isinstance(record.get("width"), int) or not isinstance(record.get("height"), int):
            raise RecordsError(f"{labels}: the record of {record['path']} is not one yolojet label writes (no size)")
        if first is None:
            first = record
        if len(chosen) < samples:
            chosen.append(record)
        elif (at := rng.randrange(images)) < samples:
            chosen[at] = record
        for d in record.get("detections") or record.get("top5", [])[:1]:
            if not isinstance(d, dict) or not isinstance(d.get("confidence"), (int, float)):
                raise RecordsError(f"{labels}: a detection of {record['path']} is not one yolojet label writes")
            if isinstance(d.get("box"), dict):  # ultralytics' summary() rows, as `yolojet detect --json` writes them
                raise RecordsError(
                    f"{labels}: the lines of `yolojet detect --json`; plot reads the records of `yolojet label` "
                    "(yolojet label IMAGES --local --model MODEL --out FILE)"
                )
            name = str(d.get("name", d.get("class")))
            counts[name] = counts.get(name, 0) + 1
            pending.append(d["confidence"])
        if len(pending) >= 1 << 16:
            scores += np.histogram(pending, SCORE_BINS, (0.0, 1.0))[0]
            found += len(pending)
            pending.clear()
    scores += np.histogram(pending, SCORE_BINS, (0.0, 1.0))[0]
    found += len(pending)
    if first is None:
        raise DatasetError(f"{labels}: no records to plot")
    tiles, missing = [], []
    for record in chosen:
        try:
            tiles.append(_tile(record))
        except ImageReadError:
            missing.append(record["path"])  # moved or deleted since it was labeled: the grid shows the others
        except (KeyError, TypeError, IndexError, ValueError) as e:
            named = f"{labels}: the record of {record['path']}"
            raise RecordsError(f"{named} is not one yolojet label writes ({e!r})") from e
    if missing:
        unread = f"{len(missing)} of the {len(chosen)} sampled images could not be read"
        shown = "the grid shows the others" if tiles else "no grid is drawn"
        print(f"plot: {unread} (first: {missing[0]}); {shown}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if tiles:
        rows = -(-len(tiles) // COLUMNS)
        grid = np.full((rows * TILE, min(len(tiles), COLUMNS) * TILE, 3), 16, np.uint8)
        for i, tile in enumerate(tiles):
            r, c = divmod(i, COLUMNS)
            grid[r * TILE : (r + 1) * TILE, c * TILE : (c + 1) * TILE] = tile
        write_atomically(out / "grid.png", lambda p: Image.fromarray(grid).save(p, format="PNG"))
        written.append(out / "grid.png")
    elif (out / "grid.png").is_file():  # an earlier plot's grid would pass for this one's
        (out / "grid.png").unlink()
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:30]
    figure, axis = plt.subplots(figsize=(10, 4))
    axis.bar([name for name, _ in top], [n for _, n in top], color="#3b7dd8")
    axis.set_title(
        f"{found} {'detections' if first.get('detections') is not None else 'top-1 classes'} "
        f"in {images} images, by class"
    )
    axis.tick_params(axis="x", rotation=60)
    figure.tight_layout()
    write_atomically(out / "classes.png", lambda p: figure.savefig(p, format="png", dpi=100))
    plt.close(figure)
    figure, axis = plt.subplots(figsize=(6, 4))
    axis.hist(edges[:-1], bins=edges.tolist(), weights=scores, color="#d8743b")
    axis.set_title("confidences" if found else "confidences (no detections)")
    axis.set_xlabel("confidence")
    figure.tight_layout()
    write_atomically(out / "scores.png", lambda p: figure.savefig(p, format="png", dpi=100))
    plt.close(figure)
    return [*written, out / "classes.png", out / "scores.png"]
