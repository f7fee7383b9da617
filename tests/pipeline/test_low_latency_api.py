"""The embedded-style trio: preprocess(frame, slot) / run(batch) / get(slot), and options without re-capture."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import calibrated_model, real_photos

import yolojet
from yolojet.errors import EngineConfigError
from yolojet.runtime.engine import Engine


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    imgsz = 640 if torch.cuda.is_available() else 128
    model_dir = yolojet.export(
        calibrated_model("yolov8n.yaml", imgsz), out=tmp_path_factory.mktemp("ll") / "m", imgsz=imgsz
    )
    return Engine.load(model_dir, backend="triton", half=False, max_batch=2, tune=False)


def test_trio_equals_call_and_options_apply_without_recapture(engine):
    photos = real_photos()
    bus, zidane = photos["bus.jpg"], photos["zidane.jpg"]
    expected = engine([bus, zidane], conf=0.0005)
    assert sum(len(r) for r in expected) > 0
    engine.configure(conf=0.0005)
    engine.preprocess(bus, 0)
    engine.preprocess(torch.from_numpy(zidane[..., ::-1].copy()).to(engine.device), 1)  # RGB tensor on the device
    engine.run(2)
    for slot, want in enumerate(expected):
        got = engine.get(slot)
        assert got.orig_shape == want.orig_shape
        np.testing.assert_allclose(got.boxes.data, want.boxes.data, atol=1e-3)

    graphs = len(getattr(engine._head, "graphs", {}))
    strict = float(expected[0].boxes.conf.max()) - 1e-6 if len(expected[0]) else 0.5
    engine.configure(conf=strict, max_det=5)
    engine.run(2)
    assert len(engine.get(0)) <= 1
    assert len(getattr(engine._head, "graphs", {})) == graphs  # same frames, new thresholds: the same graph


def test_trio_errors(engine):
    with pytest.raises(EngineConfigError, match="slot 2"):
        engine.preprocess(real_photos()["bus.jpg"], 2)
    with pytest.raises(EngineConfigError, match=r"conf 1\.5"):
        engine.configure(conf=1.5)
    with pytest.raises(EngineConfigError, match="max_det 301"):
        engine.configure(max_det=301)
    with pytest.raises(EngineConfigError, match="class ids run from 0 to 79"):
        engine.configure(classes=[80])
    fresh = Engine(engine.network, engine.max_batch)
    with pytest.raises(EngineConfigError, match="stage a frame"):
        fresh.run(1)


def test_fewer_images_than_slots(engine):
    """One image in a two-slot engine runs in the smaller bucket with the scratch of one image."""
    photo = real_photos()["bus.jpg"]
    one = engine(photo, conf=0.0005)[0]
    both = engine([photo, photo], conf=0.0005)
    np.testing.assert_allclose(one.boxes.data, both[0].boxes.data, atol=1e-3)
    np.testing.assert_allclose(both[0].boxes.data, both[1].boxes.data, atol=1e-3)
