"""Start-up compiles on worker processes: the protocol on any machine, the compiles themselves on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from types import SimpleNamespace

import pytest
import triton
from support import random_model

import yolojet
from yolojet.engine import compile_workers
from yolojet.engine.compile_workers import Specialization


def _worker() -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "yolojet.engine.compile_workers"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_worker_answers_each_line_and_names_what_failed():
    worker = _worker()
    lines = [
        "not json",
        json.dumps(["yolojet.kernels.pool", "sppf_pools", "{}"]),  # a launcher, not a kernel
        json.dumps(["yolojet.no_such_module", "_kernel", "{}"]),
    ]
    try:
        out, _ = worker.communicate("\n".join(lines) + "\n", timeout=120)
    finally:
        worker.kill()
    answers = out.splitlines()
    assert worker.returncode == 0 and len(answers) == 3
    assert answers[0].startswith("failed: JSONDecodeError")
    assert answers[1] == "failed: TypeError: yolojet.kernels.pool.sppf_pools is not a Triton kernel"
    assert answers[2].startswith("failed: ModuleNotFoundError")


def test_specializations_no_worker_can_compile_are_counted_out_and_nothing_hangs():
    broken = [
        Specialization("yolojet.kernels.pool", "_sppf_kernel", "{not json"),
        Specialization("yolojet.kernels.pool", "no_such_kernel", "{}"),
        Specialization("yolojet.kernels.pool", "_maxpool2d_kernel", json.dumps({"name": "another kernel"})),
    ]
    with compile_workers.Workers(2) as workers:
        assert workers.compile(broken * 3) == 0
        assert workers.answered == 9  # each answered, by one worker or the other
    assert compile_workers.compile_in_workers([], workers=2) == 0


def test_a_worker_stuck_on_a_compile_is_killed_and_the_others_finish(tmp_path, monkeypatch):
    (tmp_path / "stuck_kernels.py").write_text("import time\nwhile True:\n    time.sleep(1)\n")  # never done
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    # A worker's first answer includes its start (torch and Triton imported): over 20 s on an H200 machine running
    # 12 test processes.
    monkeypatch.setattr(compile_workers.Workers, "seconds_per_compile", 60.0)
    stuck = Specialization("stuck_kernels", "_kernel", "{}")
    broken = Specialization("yolojet.kernels.pool", "no_such_kernel", "{}")
    start = time.monotonic()
    with compile_workers.Workers(2) as workers:
        processes = list(workers.processes)
        assert workers.compile([stuck, broken, broken, broken]) == 0
        assert workers.answered == 3  # the other worker went on with the rest
    assert time.monotonic() - start < 150  # killed after its 60 s, not waited for
    assert all(process.poll() is not None for process in processes)  # every worker ended with the block


def test_worker_count_follows_the_cores_this_process_may_use(monkeypatch):
    monkeypatch.setenv("YOLOJET_COMPILE_WORKERS", "3")
    assert compile_workers.worker_count() == 3
    monkeypatch.delenv("YOLOJET_COMPILE_WORKERS")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert compile_workers.worker_count() == max(1, min(32, cores))


_COMPILE_IN_WORKERS = textwrap.dedent(
    """
    import functools, json, sys, triton
    from yolojet.engine import compile_workers
    from yolojet.engine.autotune import compile_launches
    from yolojet.engine.engine import Engine

    engine = Engine.load(sys.argv[1], device="cuda", half=True, max_batch=1, tune=False)
    tunable = [launch for launch in engine.network.launch_list(1) if launch.compile is not None][:4]
    calls = [functools.partial(launch.compile, config) for launch in tunable for config in launch.candidates]
    specializations = compile_workers.collect(calls)
    compiled = compile_workers.compile_in_workers(specializations, workers=4)
    hits = []
    triton.knobs.compilation.listener = lambda src, cache_hit, **_: hits.append(cache_hit)
    compile_launches(tunable, [], workers=4, processes=False)
    print(json.dumps({"collected": len(specializations), "compiled": compiled, "compiles": len(hits),
                      "from_disk": sum(hits)}))
    """
)


@pytest.mark.gpu(reason="Triton compiles for a CUDA GPU")
def test_workers_compile_every_candidate_and_the_thread_pass_only_loads_them(tmp_path):
    """In a fresh process (no kernel compiled in memory yet) with an empty Triton cache: the candidates of a few
    convs are collected, the workers compile each, and the start-up's own compile pass finds every one on disk."""
    model_dir = yolojet.export(random_model("yolov8n.yaml"), out=tmp_path / "m", imgsz=64)
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"), YOLOJET_CACHE=str(tmp_path / "cache"))
    env.pop("TRITON_ALWAYS_COMPILE", None)  # the workers' output would go unused
    result = subprocess.run(
        [sys.executable, "-c", _COMPILE_IN_WORKERS, str(model_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    assert counts["collected"] >= 8
    assert counts["compiled"] == counts["collected"]
    assert counts["compiles"] == counts["collected"] and counts["from_disk"] == counts["compiles"]


def _report(name: str, key: str, warps: int, block: int) -> bool | None:
    """Triton's call of the hook for one specialization (as JITFunction._call_hook makes it: keywords only)."""
    kernel = SimpleNamespace(arg_names=["x_ptr", "BLOCK_M"])
    return triton.knobs.runtime.jit_cache_hook(
        key=key,
        repr=name,
        fn=SimpleNamespace(module="kernels", name=name, jit_function=kernel),
        compile={
            "key": key,
            "num_warps": warps,
            "num_stages": 2,
            "constants": {(1,): block},
            "specialization_data": f"{name}/{key}",
        },
        is_manual_warmup=True,
        already_compiled=False,
    )


def test_collect_skips_this_threads_compiles_and_hands_other_threads_to_the_hook_before(monkeypatch):
    """The hook is the process's: while the calls are collected, another thread's compile must still happen
    (here: reach the hook that was set before, whose None lets Triton compile), and that hook is back after."""
    elsewhere: list[str] = []
    before = lambda **kwargs: elsewhere.append(kwargs["repr"])  # noqa: E731
    monkeypatch.setattr(triton.knobs.runtime, "jit_cache_hook", before)
    answers: list[bool | None] = []

    def from_another_thread() -> None:
        thread = threading.Thread(target=lambda: answers.append(_report("other", "k", 4, 64)))
        thread.start()
        thread.join()

    calls = [
        lambda: answers.append(_report("small", "a", 4, 32)),
        from_another_thread,
        lambda: answers.append(_report("large", "b", 8, 128)),
        lambda: answers.append(_report("small", "a", 4, 32)),  # the same specialization again
        lambda: 1 / 0,  # a call that fails is left out, the rest still collected
    ]
    found = compile_workers.collect(calls)
    assert [item.name for item in found] == ["large", "small"]  # each once, largest first
    assert [item.size for item in found] == [8 * 2 * 128, 4 * 2 * 32]
    assert found[0].data == "large/b"
    assert answers == [True, None, True, True] and elsewhere == ["other"]
    assert triton.knobs.runtime.jit_cache_hook is before
