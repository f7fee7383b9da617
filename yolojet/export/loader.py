"""Turn what the user typed (a `.pt` path, an ultralytics name, an architecture YAML) into an eval-mode model."""

from __future__ import annotations

import logging
import pickle
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from torch import nn

from yolojet.errors import CheckpointError, ModelNotFoundError, NotAYoloModelError
from yolojet.ir import GRAPH_FILE

log = logging.getLogger("yolojet")


@dataclass
class LoadedModel:
    model: nn.Module
    source: str
    random_weights: bool


def is_bare_name(source: str) -> bool:
    """A name without a folder (yolo11n.pt): where no such file is here, ultralytics may fetch it."""
    return Path(source).name == source


def _check_architecture_yaml(path: Path) -> None:
    """A local YAML must parse and have ultralytics' model sections; a dataset YAML is the usual mix-up."""
    import yaml

    try:
        config = yaml.safe_load(path.read_text(errors="replace"))
    except yaml.YAMLError as e:
        raise NotAYoloModelError(f"{path}: not valid YAML ({_first_line(e)})") from e
    if not isinstance(config, dict) or not {"backbone", "head"} <= set(config):
        hint = ""
        if isinstance(config, dict) and ({"train", "val", "names"} & set(config)):
            hint = ": it looks like a dataset YAML, which goes to --data (val, report)"
        raise NotAYoloModelError(f"{path}: not a model architecture file (no 'backbone' and 'head' sections){hint}")


def _load_yaml(source: str) -> LoadedModel:
    from ultralytics import YOLO
    from ultralytics.utils import LOGGER

    path = Path(source)
    if path.is_file():
        _check_architecture_yaml(path)
    elif not is_bare_name(source):
        raise ModelNotFoundError(f"{source}: no such architecture file")
    level = LOGGER.level
    LOGGER.setLevel(logging.ERROR)  # the model summary ultralytics logs while building: not our output
    try:
        # ultralytics' Model.model is inferred as str | None (from its __init__); built from a YAML, it is the module
        model = cast(nn.Module, YOLO(source, verbose=False).model)
    except FileNotFoundError as e:
        raise ModelNotFoundError(
            f"{source}: not a file here and not an architecture name ultralytics knows (e.g. yolo11n.yaml)"
        ) from e
    except (OSError, ConnectionError) as e:  # a backbone whose pretrained weights must be downloaded
        raise ModelNotFoundError(
            f"{source}: building it needs a download that failed ({type(e).__name__}: {_first_line(e)})"
        ) from e
    except Exception as e:  # whatever ultralytics raises for a file it cannot build: one line, not a traceback
        raise NotAYoloModelError(
            f"{source}: ultralytics cannot build this architecture as a YOLO model ({type(e).__name__}: "
            f"{_first_line(e)})"
        ) from e
    finally:
        LOGGER.setLevel(level)
    print(
        f"NOTICE: {source} is an architecture file: the model has RANDOM weights and its detections mean nothing. "
        "Pass a trained .pt checkpoint for real results.",
        file=sys.stderr,
    )
    return LoadedModel(model, source, random_weights=True)


def _fetch_named_checkpoint(source: str) -> Path:
    """Let ultralytics download an official checkpoint by name; say plainly when it cannot."""
    from ultralytics.utils import LOGGER
    from ultralytics.utils.downloads import attempt_download_asset

    level = LOGGER.level
    LOGGER.setLevel(logging.ERROR)  # its warnings about unreachable GitHub: the error below says it in one line
    try:
        fetched = Path(attempt_download_asset(source))
    except Exception as e:  # network failures surface as many different exception types
        raise ModelNotFoundError(
            f"{source}: not found locally, and ultralytics could not download it ({type(e).__name__}: {e}). "
            "Check the name and your network, or pass the path of a local .pt file."
        ) from e
    finally:
        LOGGER.setLevel(level)
    if not fetched.is_file():
        raise ModelNotFoundError(
            f"{source}: not found locally, and ultralytics could not download it (no network, or not an official "
            "model name). Pass the path of a local .pt file."
        )
    return fetched


def _first_line(error: Exception) -> str:
    """An exception's message without the advice ultralytics appends on further lines (its own CLI's), or torch's
    request for a better message."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    # ultralytics' log prefix ("ERROR ❌️ "): the message is already yolojet's error
    line = re.sub(r"^(ERROR|WARNING)\s*[^\w\s/.~]*\s*", "", lines[0])
    return re.sub(r"\s*\(Could this error message be improved\?.*$", "", line)


# What torch's load raises for a file it cannot read (cut short, not a zip or pickle, overwritten).
UNREADABLE = (RuntimeError, EOFError, pickle.UnpicklingError, ValueError, OSError)


def _load_checkpoint(source: str) -> LoadedModel:
    from ultralytics.nn.tasks import load_checkpoint

    path = Path(source)
    if not path.is_file():
        if not is_bare_name(source):
            raise ModelNotFoundError(f"{source}: no such file")
        path = _fetch_named_checkpoint(source)
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: empty file, not a checkpoint")
    try:
        model, _ = load_checkpoint(str(path), device="cpu")
    except (TypeError, KeyError, AttributeError) as e:
        # ultralytics' wording of a file torch cannot read, which names the path again (TorchScript files and its
        # safe loader's refusals wrap torch's errors too, and are told apart below)
        if isinstance(e.__cause__, UNREADABLE) and "is not a loadable checkpoint" in str(e):
            raise _unreadable(path, e.__cause__) from e
        if zipfile.is_zipfile(path) or "Ultralytics checkpoint format" in str(e):
            # ultralytics' own reason speaks of its internals (a tensor's missing attribute, its pickle's types).
            raise NotAYoloModelError(
                f"{path}: a PyTorch file, but not an ultralytics YOLO checkpoint (no model saved under 'model' or "
                "'ema', as YOLO training and YOLO(...).save() write one)"
            ) from e
        raise CheckpointError(f"{path}: cannot read as a PyTorch checkpoint ({_first_line(e)})") from e
    except UNREADABLE as e:
        raise _unreadable(path, e) from e
    return LoadedModel(model, str(path), random_weights=False)


def _unreadable(path: Path, error: Exception) -> CheckpointError:
    return CheckpointError(f"{path}: cannot read as a PyTorch checkpoint, corrupt or truncated? ({_first_line(error)})")


def check_yolo_model(model: nn.Module, source: str) -> None:
    """A YOLO model is a `BaseModel` whose `model` is a layer list wired through `f` indices."""
    from ultralytics.nn.tasks import BaseModel

    layers = getattr(model, "model", None)
    if not isinstance(model, BaseModel) or not isinstance(layers, nn.Sequential) or len(layers) == 0:
        raise NotAYoloModelError(f"{source}: holds a {type(model).__name__}, not an ultralytics YOLO model")
    if not all(hasattr(m, "f") and hasattr(m, "i") for m in layers):
        raise NotAYoloModelError(f"{source}: layers lack ultralytics' from-index wiring (f/i attributes)")


def load_model(source: str | Path | nn.Module) -> LoadedModel:
    """Load an ultralytics model in eval mode, float32, on the CPU."""
    if isinstance(source, nn.Module):
        loaded = LoadedModel(source, type(source).__name__, random_weights=False)
    else:
        text = str(source)
        suffix = Path(text).suffix.lower()
        if suffix in (".yaml", ".yml"):
            loaded = _load_yaml(text)
        elif suffix == ".pt":
            loaded = _load_checkpoint(text)
        elif Path(text, GRAPH_FILE).is_file():
            raise NotAYoloModelError(
                f"{text}: already a yolojet model directory; export takes a .pt checkpoint or a .yaml architecture "
                "(any input size runs from this directory: --imgsz on detect, label, serve, or Engine.load(imgsz=))"
            )
        elif Path(text).is_dir():
            raise NotAYoloModelError(
                f"{text}: a folder but not a yolojet model directory (expected graph.json and weights.safetensors), "
                "nor a .pt checkpoint or .yaml architecture"
            )
        elif Path(text).exists():
            raise NotAYoloModelError(f"{text}: expected a .pt checkpoint or a .yaml architecture file")
        else:
            raise ModelNotFoundError(f"{text}: no such file (expected a .pt checkpoint or a .yaml architecture)")
    check_yolo_model(loaded.model, loaded.source)
    loaded.model = loaded.model.float().eval().cpu()
    return loaded
