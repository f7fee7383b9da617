"""The graph IR: model directory round trip, validation, and shape inference agreeing with real execution."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from support import random_model

import yolojet
from yolojet.errors import GraphError, ModelDirError
from yolojet.ir import Graph, Node


@pytest.fixture(scope="module")
def seg_dir(tmp_path_factory):
    return yolojet.export(random_model("yolo26n-seg.yaml"), out=tmp_path_factory.mktemp("ir") / "seg", imgsz=(96, 64))


def test_round_trip_is_lossless(seg_dir, tmp_path):
    graph = Graph.load(seg_dir)
    copy = Graph.load(graph.save(tmp_path / "copy"))
    assert copy.meta == graph.meta
    assert copy.nodes == graph.nodes and copy.values == graph.values
    assert copy.inputs == graph.inputs and copy.outputs == graph.outputs
    assert copy.weights.keys() == graph.weights.keys()
    for key, array in graph.weights.items():
        np.testing.assert_array_equal(copy.weights[key], array)


def test_save_replaces_only_model_directories_and_writes_shareable_files(seg_dir, tmp_path):
    import os

    graph = Graph.load(seg_dir)
    user_files = tmp_path / "photos"
    user_files.mkdir()
    (user_files / "keep.jpg").write_bytes(b"not ours")
    with pytest.raises(ModelDirError, match="not a yolojet model directory; not overwriting it"):
        graph.save(user_files)
    assert (user_files / "keep.jpg").read_bytes() == b"not ours"
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    with pytest.raises(ModelDirError, match="not overwriting"):
        graph.save(a_file)
    assert a_file.read_text() == "mine"
    (tmp_path / "empty").mkdir()
    graph.save(tmp_path / "empty")
    again = graph.save(tmp_path / "empty")  # an earlier export is replaced
    assert {p.name for p in again.iterdir()} == {"graph.json", "weights.safetensors"}
    umask = os.umask(0)
    os.umask(umask)
    assert again.stat().st_mode & 0o777 == 0o777 & ~umask
    assert (again / "weights.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask


def test_save_writes_through_a_link_and_removes_nothing_else(seg_dir, tmp_path):
    """A link to a model directory is written through (the link stays, its target gets the new model), and a folder
    named like the one a replacement parks the old directory in (`.m.old`) is the user's: it is left alone."""
    graph = Graph.load(seg_dir)
    target = graph.save(tmp_path / "m")
    (tmp_path / "link").symlink_to(target)
    (target / "graph.json").write_text("{}")  # an old model, to tell the new one from
    keep = tmp_path / ".m.old"
    keep.mkdir()
    (keep / "important.txt").write_text("mine")
    assert graph.save(tmp_path / "link") == target
    assert (tmp_path / "link").is_symlink() and Graph.load(tmp_path / "link").meta == graph.meta
    assert (keep / "important.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.old", "link", "m"]  # no staging or old copy left


def test_directory_is_json_and_safetensors(seg_dir):
    document = json.loads((seg_dir / "graph.json").read_text())
    assert document["meta"]["task"] == "segment" and document["meta"]["imgsz"] == [96, 64]
    weights = load_file(str(seg_dir / "weights.safetensors"))
    referenced = {key for node in document["nodes"] for key in node["weights"].values()}
    assert referenced == set(weights)
    assert all(w.dtype == np.float32 for w in weights.values())


def test_dump_shapes_match_recorded_shapes(seg_dir):
    """Every value the reference executor produces has the shape the IR's shape rules recorded."""
    reference = yolojet.load_reference(seg_dir)
    values = reference.dump(torch.rand(3, 3, 96, 64))
    graph = reference.graph
    assert set(values) == set(graph.values)
    for name, tensor in values.items():
        expected = tuple(3 if d == "N" else d for d in graph.values[name].shape)
        assert tuple(tensor.shape) == expected, name


def test_validate_rejects_broken_graphs(seg_dir):
    graph = Graph.load(seg_dir)
    first = graph.nodes[0]

    graph.nodes[0] = Node(first.name, "warp_drive", first.inputs, first.outputs, first.attrs, first.weights)
    with pytest.raises(GraphError, match="unknown op kind 'warp_drive'"):
        graph.validate()

    graph.nodes[0] = Node(first.name, first.op, ["nowhere"], first.outputs, first.attrs, first.weights)
    with pytest.raises(GraphError, match="reads nowhere before it is defined"):
        graph.validate()

    graph.nodes[0] = first
    graph.values[first.outputs[0]].shape = ("N", 1, 2, 3)
    with pytest.raises(GraphError, match="recorded shape"):
        graph.validate()


def test_load_rejects_incomplete_or_foreign_directories(seg_dir, tmp_path):
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "graph.json").write_text((seg_dir / "graph.json").read_text())
    with pytest.raises(ModelDirError, match=r"missing weights\.safetensors"):
        Graph.load(partial)

    (partial / "weights.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(ModelDirError, match="cannot read weights"):
        Graph.load(partial)

    future = json.loads((seg_dir / "graph.json").read_text())
    future["format_version"] = 99
    (partial / "graph.json").write_text(json.dumps(future))
    with pytest.raises(ModelDirError, match="format version 99"):
        Graph.load(partial)


def test_reference_rejects_bad_input(seg_dir):
    reference = yolojet.load_reference(seg_dir)
    with pytest.raises(ValueError, match="3 channels"):
        reference(torch.rand(1, 4, 96, 64))
    with pytest.raises(TypeError, match="floating-point"):
        reference(torch.zeros(1, 3, 96, 64, dtype=torch.uint8))


def test_import_does_not_pull_in_ultralytics():
    import subprocess
    import sys

    code = "import sys, yolojet; yolojet.load_reference; assert 'ultralytics' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_only_the_export_room_imports_ultralytics():
    import re
    from pathlib import Path

    package = Path(yolojet.__file__).parent
    imports = re.compile(r"^\s*(from|import) ultralytics\b", re.M)
    outside = sorted(
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if p.relative_to(package).parts[0] != "export" and imports.search(p.read_text())
    )
    assert not outside, f"ultralytics imported outside yolojet/export/: {outside}"


def test_the_reference_never_imports_the_kernels_it_checks():
    """Every module of yolojet/reference/ (and the OBB metric, which scores with its probiou), imported in a fresh
    interpreter, brings in no Triton, no kernel and no engine module: a change made for a kernel cannot move the
    truth it is checked against."""
    import pkgutil
    import subprocess
    import sys

    import yolojet.reference

    modules = [f"yolojet.reference.{m.name}" for m in pkgutil.iter_modules(yolojet.reference.__path__)]
    assert {"yolojet.reference.executor", "yolojet.reference.pipeline", "yolojet.reference.segment"} <= set(modules)
    code = (
        f"import importlib, sys\nfor m in {[*modules, 'yolojet.eval.obb']!r}: importlib.import_module(m)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'triton' or m.startswith(('yolojet.kernels', "
        "'yolojet.engine')))\nassert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("cfg", ["yolov8n-pose.yaml", "yolo11n-obb.yaml", "yolo26n-seg.yaml", "yolo26n.yaml"])
def test_resized_graph_is_the_export_at_that_size(cfg, tmp_path):
    """An engine derives the network of any stride-multiple input from one export: the values' shapes and the
    reference's outputs equal those of the model exported at that size."""
    from yolojet.errors import ImageSizeError
    from yolojet.reference.executor import ReferenceExecutor

    model = random_model(cfg)
    square = Graph.load(yolojet.export(model, out=tmp_path / "square", imgsz=96))
    exported = Graph.load(yolojet.export(model, out=tmp_path / "rect", imgsz=(64, 128)))
    resized = square.resized(64, 128)
    assert resized.meta == exported.meta
    assert resized.values == exported.values
    x = torch.rand(2, 3, 64, 128)
    ours, theirs = ReferenceExecutor(resized, "cpu")(x), ReferenceExecutor(exported, "cpu")(x)
    for a, b in zip(
        ours if isinstance(ours, tuple) else (ours,), theirs if isinstance(theirs, tuple) else (theirs,), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert square.resized(96, 96) is square
    with pytest.raises(ImageSizeError, match="multiple of stride 32"):
        square.resized(64, 100)
