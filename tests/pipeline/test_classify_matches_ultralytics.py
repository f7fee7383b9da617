"""Classification: images in, class probabilities out — the same as ultralytics' predict with the same weights.

Pre-processing is held to ultralytics bit for bit (`torch.equal`: max |Δ| = 0 on the input tensor), first
against PIL through `classify_transforms` on seeded noise images of awkward sizes (upscales, extreme aspect
ratios, half-pixel crop offsets, Pillow 13's vertical-first pass order), then against the very tensor
ultralytics' `ClassificationPredictor` feeds its model in predict. Models have random weights with BatchNorm
statistics measured on the shipped photos (`support.calibrated_model`), so the probabilities depend on the
image; the exported graph, run by the float32 reference executor on our input, must give the same top-1
and top-5 class ids as predict and every probability within 5e-3 (in practice ~1e-6).
"""

from __future__ import annotations

import functools
from copy import deepcopy

import numpy as np
import pytest
import torch
from support import assert_same_top5, calibrated_model, real_photos
from torch import nn

import yolojet
from yolojet.errors import ImageReadError, ImageSizeError
from yolojet.images import Frame, load_frame
from yolojet.reference.classify import classify_preprocess, top5
from yolojet.tasks.classify import Probs

IMGSZ = 224
PROB_TOL = 5e-3
# Calibrated random weights give logits of std ~0.09: near-uniform probabilities (~1e-3 each over 1000 classes),
# among which |Δp| <= 5e-3 would prove nothing. The classifier's last layer is scaled so that they are peaked.
LOGIT_SCALE = 30.0


def photos() -> dict[str, np.ndarray]:
    """The shipped BGR photos and a grey one (H, W), as a user would pass them."""
    import skimage.data

    return {**real_photos(), "camera (grey)": skimage.data.camera()}


@functools.lru_cache(maxsize=1)
def seven_class_model() -> nn.Module:
    """yolo11n-cls with 7 classes, BatchNorm statistics measured on the photos as `support.calibrated_model`
    measures them (it builds models from a YAML name only, so the same steps are taken here)."""
    from ultralytics.data.augment import LetterBox
    from ultralytics.nn.tasks import ClassificationModel

    torch.manual_seed(0)
    model = ClassificationModel("yolo11n-cls.yaml", nc=7, verbose=False).float()
    letterbox = LetterBox((IMGSZ, IMGSZ), auto=False)
    batch = torch.stack(
        [
            torch.from_numpy(np.ascontiguousarray(letterbox(image=img)[..., ::-1])).permute(2, 0, 1).float() / 255
            for img in real_photos().values()
        ]
    )
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        model(batch)
    return model.eval()


def peaked(model: nn.Module) -> nn.Module:
    """A copy of the model whose logits are LOGIT_SCALE times larger (softmax temperature 1 / LOGIT_SCALE)."""
    model = deepcopy(model)
    with torch.no_grad():
        model.model[-1].linear.weight.mul_(LOGIT_SCALE)
        model.model[-1].linear.bias.mul_(LOGIT_SCALE)
    return model


def ultralytics_predict(
    model: nn.Module, cfg: str, images: list, monkeypatch, imgsz: int = IMGSZ, device: str | None = None
) -> tuple[torch.Tensor, list]:
    """(the input tensor predict fed the model, predict's Results) for the images, one batch, on `device`
    (predict's own default when None)."""
    from ultralytics import YOLO
    from ultralytics.models.yolo.classify import ClassificationPredictor

    inputs = []
    original = ClassificationPredictor.preprocess

    def recording(self, img):
        x = original(self, img)
        inputs.append(x.detach().clone())
        return x

    monkeypatch.setattr(ClassificationPredictor, "preprocess", recording)
    wrapper = YOLO(cfg, verbose=False)
    wrapper.model = deepcopy(model)  # predict fuses the model it is given in place
    results = wrapper.predict(images, imgsz=imgsz, verbose=False, device=device)
    assert len(inputs) == 1, "expected the images to go through predict as one batch"
    return inputs[0].cpu(), [r.cpu() for r in results]  # predict leaves them on its device


def pil_reference(image_bgr: np.ndarray, imgsz) -> torch.Tensor:
    """ultralytics' classify transform of a BGR array the way its predictor's fallback path applies it."""
    from PIL import Image
    from ultralytics.data.augment import classify_transforms

    return classify_transforms(imgsz)(Image.fromarray(np.ascontiguousarray(image_bgr[..., ::-1])))


# (height, width): upscales (1x1, 3x5, 37x41), extreme aspect ratios both ways, sizes already right (no resize),
# half-pixel centre-crop offsets (303 - 224 = 79: Python's round(39.5) = 40), shrinks where Pillow 13 runs the
# vertical pass first (900x17, 1200x500) and where it does not (17x900, 1080x810), and odd sizes in between.
AWKWARD_SIZES = [
    (1, 1),
    (3, 5),
    (37, 41),
    (17, 900),
    (900, 17),
    (224, 303),
    (303, 224),
    (224, 224),
    (225, 225),
    (1080, 810),
    (720, 1280),
    (1200, 500),
    (223, 500),
    (301, 449),
    (512, 512),
]


@pytest.mark.parametrize("imgsz", [224, 96, 7])
def test_preprocess_is_bit_exact_with_ultralytics_transform(imgsz):
    rng = np.random.default_rng(imgsz)
    for h, w in AWKWARD_SIZES:
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)  # noise: every rounding difference shows
        ours = classify_preprocess(load_frame(image), imgsz)
        expected = pil_reference(image, imgsz)
        assert ours.shape == (3, imgsz, imgsz) and ours.dtype == torch.float32
        assert torch.equal(ours, expected), f"{h}x{w} at {imgsz}: max |Δ| {float((ours - expected).abs().max())}"


def test_preprocess_colour_layouts_and_rectangular_size():
    """Grey, BGRA and RGB frames (PIL and tensor inputs), and a non-square imgsz, which resizes to exactly (h, w)."""
    from PIL import Image

    rng = np.random.default_rng(1)
    bgr = rng.integers(0, 256, (301, 449, 3), dtype=np.uint8)
    grey = rng.integers(0, 256, (333, 250), dtype=np.uint8)
    bgra = np.concatenate([bgr, rng.integers(0, 256, (301, 449, 1), dtype=np.uint8)], 2)
    cases = {
        "grey": (load_frame(grey), np.repeat(grey[..., None], 3, 2)),
        "bgra": (load_frame(bgra), bgr),
        "pil rgb": (load_frame(Image.fromarray(bgr[..., ::-1].copy())), bgr),
        "tensor rgb": (Frame(torch.from_numpy(bgr[..., ::-1].copy()), bgr=False), bgr),
    }
    for name, (frame, as_bgr) in cases.items():
        assert torch.equal(classify_preprocess(frame, IMGSZ), pil_reference(as_bgr, IMGSZ)), name
    assert torch.equal(classify_preprocess(load_frame(bgr), (IMGSZ, IMGSZ)), pil_reference(bgr, IMGSZ))
    ours = classify_preprocess(load_frame(bgr), (96, 160))
    assert ours.shape == (3, 96, 160)
    assert torch.equal(ours, pil_reference(bgr, (96, 160)))


@pytest.mark.parametrize(
    ("cfg", "nc", "seed"),
    # yolo26-cls.yaml is layer for layer yolo11-cls.yaml: another seed, so that it is not the same test twice.
    [
        ("yolov8n-cls.yaml", 1000, 0),
        ("yolo11n-cls.yaml", 1000, 0),
        ("yolo26n-cls.yaml", 1000, 1),
        ("yolo11n-cls.yaml", 7, 0),
    ],
)
def test_reference_backend_matches_ultralytics_predict(cfg, nc, seed, tmp_path, monkeypatch):
    model = peaked(seven_class_model() if nc == 7 else calibrated_model(cfg, IMGSZ, seed))
    model_dir = yolojet.export(model, out=tmp_path / "model", imgsz=IMGSZ)
    images = photos()

    x = torch.stack([classify_preprocess(load_frame(image), IMGSZ) for image in images.values()])
    # On the CPU, as the reference backend here: on a GPU predict's input differs in the last bit (measured
    # 6e-8 on an H200), and this test holds the two preprocessings to bit equality.
    expected_x, results = ultralytics_predict(model, cfg, list(images.values()), monkeypatch, device="cpu")
    assert torch.equal(x, expected_x.float()), f"input max |Δ| {float((x - expected_x).abs().max())}"

    probs = yolojet.load_reference(model_dir)(x)
    assert probs.shape == (len(images), nc)
    expected = torch.stack([r.probs.data for r in results]).float()
    assert float((probs - expected).abs().max()) <= PROB_TOL
    ids_1, ids_5, conf_5 = top5(probs)
    for i, (name, result) in enumerate(zip(images, results, strict=True)):
        ours = Probs(probs[i].numpy())
        assert ours.top1 == int(ids_1[i]) == result.probs.top1, name
        assert ours.top5 == ids_5[i].tolist() == list(result.probs.top5), name
        assert np.allclose(ours.top5conf, result.probs.top5conf.numpy(), atol=PROB_TOL)
        assert torch.equal(conf_5[i], probs[i, ids_5[i]])
    # The comparison means something: image-dependent classes, peaked probabilities.
    assert len({r.probs.top1 for r in results}) > 1, "every image got the same class"
    assert min(float(r.probs.top1conf) for r in results) >= max(0.05, 2 / nc), "near-uniform probabilities"


def test_triton_engine_matches_ultralytics_predict(tmp_path, monkeypatch):
    """The whole path on our kernels (resample kernel into the input slot, network, softmax; one CUDA graph per
    frame shape on a GPU, Triton's interpreter on the CPU) against predict: same top-5, |Δp| <= PROB_TOL. Six
    images through two slots: three runs, frames of several shapes, grey among them."""
    from yolojet.engine.engine import Engine

    imgsz = IMGSZ if torch.cuda.is_available() else 64
    cfg = "yolo11n-cls.yaml"
    model = peaked(calibrated_model(cfg, imgsz, 0))
    model_dir = yolojet.export(model, out=tmp_path / "model", imgsz=imgsz)
    engine = Engine.load(model_dir, backend="triton", half=False, max_batch=2, tune=False)
    images = photos()
    _, expected = ultralytics_predict(model, cfg, list(images.values()), monkeypatch, imgsz)
    ours = engine(list(images.values()))
    for name, result, theirs in zip(images, ours, expected, strict=True):
        assert result.error is None, name
        assert_same_top5(result.probs.top5, list(theirs.probs.top5), theirs.probs.data.numpy(), label=name)
        assert float(np.abs(result.probs.data - theirs.probs.data.cpu().numpy()).max()) <= PROB_TOL, name
    assert len({r.probs.top1 for r in expected}) > 1, "every image got the same class"
    bus = images["bus.jpg"]
    engine.preprocess(torch.from_numpy(bus[..., ::-1].copy()).to(engine.device), 1)  # RGB tensor on the device
    engine.preprocess(bus, 0)
    engine.run(2)
    # The same image in two slots: the batch position moves the last bits of a GEMM's sums (under the interpreter
    # numpy's matmul, whose blocking follows the row; 7.7e-7 at most seen on a probability of 0.94, more with other
    # BLAS threads); the channels swapped moved them by 0.03.
    assert np.allclose(engine.get(0).probs.data, engine.get(1).probs.data, rtol=0, atol=1e-5)
    assert engine.get(0).probs.top5 == ours[0].probs.top5

    # Frame buffers kept per shape are bounded: with room for one batch's frames, a new shape in a slot lets the others
    # go (and their graphs), and each image still gets its result (the images in reverse: new shapes in each slot).
    from yolojet.engine import predict_path as predict_path_module

    engine(list(images.values()))  # the same shapes again: on a GPU, graphs are captured for them now
    largest = max(image.size for image in images.values())
    monkeypatch.setattr(predict_path_module, "CLASSIFY_STAGING_BYTES", 2 * largest)
    again = engine(list(images.values())[::-1])
    assert engine._path.staging_bytes <= 2 * largest
    for name, result, before in zip(list(images)[::-1], again, ours[::-1], strict=True):
        assert np.allclose(result.probs.data, before.probs.data, rtol=0, atol=1e-5), name
    # The first order once more: its buffers, plans and graphs were let go and are made again.
    for name, result, before in zip(images, engine(list(images.values())), ours, strict=True):
        assert np.allclose(result.probs.data, before.probs.data, rtol=0, atol=1e-5), name

    # A launched batch's frames stay alive until it is collected, though the trio's slot is staged again before
    # (the GPU copies them into the staging after run_async returns).
    import gc
    import weakref

    engine.preprocess(np.ascontiguousarray(images["bus.jpg"][:600]), 0)  # a shape the slot has not held
    engine.run_async(1)
    launched = weakref.ref(engine._staged[0].frame.pixels)
    engine.preprocess(images["zidane.jpg"], 0)
    gc.collect()
    assert launched() is not None
    engine.run(1)
    assert engine.get(0).probs.top5 == ours[list(images).index("zidane.jpg")].probs.top5


@pytest.mark.parametrize("nc", [1, 3, 5, 7, 1000])
def test_top5_ranks_as_ultralytics(nc):
    """Fewer than five classes give that many ids. Distinct probabilities: the same ids as ultralytics' Probs.
    Ties: the same probabilities in the same order; ultralytics' (unstable) argsort may order tied ids either
    way, ours ranks them by class id, so top5[0] is always top1 (argmax's first maximum)."""
    from ultralytics.engine.results import Probs as UltralyticsProbs

    rng = np.random.default_rng(nc)
    distinct = rng.permutation(nc).astype(np.float32) + 1
    tied = rng.integers(1, 4, nc).astype(np.float32)  # three distinct values: ties everywhere
    for data in (distinct / distinct.sum(), tied / tied.sum()):
        theirs = UltralyticsProbs(torch.from_numpy(data))
        ours = Probs(data)
        top1, ids, conf = top5(torch.from_numpy(data))
        assert ours.top5 == ids.tolist() and len(ours.top5) == min(5, nc)
        assert ours.top1 == int(top1) == theirs.top1 == ours.top5[0]
        assert ours.top1conf == float(theirs.top1conf)
        assert np.array_equal(ours.top5conf, conf.numpy()) and np.array_equal(ours.top5conf, theirs.top5conf.numpy())
        ranked = sorted(range(nc), key=lambda c: (-data[c], c))[:5]  # highest first, then lowest class id
        assert ours.top5 == ranked
        if len(set(data.tolist())) == nc:
            assert ours.top5 == list(theirs.top5)
    _, batch_ids, _ = top5(torch.from_numpy(np.stack([distinct, distinct[::-1].copy()])))
    assert batch_ids.shape == (2, min(5, nc))
    assert batch_ids[0].tolist() == Probs(distinct).top5 and batch_ids[1].tolist() == Probs(distinct[::-1]).top5


def test_typed_errors():
    frame = load_frame(np.zeros((10, 10, 3), dtype=np.uint8))
    for bad in (0, -224, (224,), (224, 0), (224, 224, 3), 22.4, True, "224", None):
        with pytest.raises(ImageSizeError):
            classify_preprocess(frame, bad)
    assert classify_preprocess(frame, np.int64(32)).shape == (3, 32, 32)
    with pytest.raises(TypeError):
        classify_preprocess(np.zeros((10, 10, 3), dtype=np.uint8), IMGSZ)
    with pytest.raises(ImageReadError):
        classify_preprocess(Frame(torch.zeros(10, 10, 3), bgr=True), IMGSZ)  # float pixels
    with pytest.raises(ValueError):
        Probs(np.zeros((2, 3), dtype=np.float32))
    with pytest.raises(ValueError):
        top5(torch.zeros(0))
