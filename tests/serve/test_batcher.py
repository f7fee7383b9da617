"""The deadline-aware batcher on a fake clock: batches fire at once when the engine is free and fill while it is
busy, the nearest deadline goes first across models, client deadlines are honoured, requests that cannot make it
are refused at once, and requests whose deadline passed are dropped, never run."""

from __future__ import annotations

import pytest

from yolojet.serve.batcher import (
    DEADLINE_CANNOT_BE_MET,
    DEADLINE_TOO_SHORT,
    QUEUE_FULL,
    LatencyModel,
    Refused,
    Request,
    Scheduler,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def scheduler(clock: Clock, depth: int = 1, max_batch: int = 4, max_queue: int = 100, **models) -> Scheduler:
    s = Scheduler(clock, depth=depth)
    for name in models or {"a": None}:
        # 10 ms a run of up to 2 images, 16 ms up to 4; 1 ms to decode an image.
        s.add_model(name, max_batch, LatencyModel({2: 0.010, 4: 0.016}, decode_per_image=0.001), max_queue)
    return s


def request(model: str, clock: Clock, slo: float = 0.050, key=None, tag=None) -> Request:
    return Request(model, deadline=clock() + slo, arrival=clock(), key=key, payload=tag)


def test_a_free_engine_takes_a_request_at_once():
    clock = Clock()
    s = scheduler(clock)
    s.admit(request("a", clock, tag=1))
    ticket, model, batch = s.next_batch()
    assert model == "a" and [r.payload for r in batch] == [1]
    assert s.next_batch() is None  # depth 1: busy until finished
    s.finished(ticket)
    assert s.next_batch() is None  # nothing waits


def test_batches_fill_while_the_engine_is_busy_in_arrival_order():
    clock = Clock()
    s = scheduler(clock, max_batch=4)
    s.admit(request("a", clock, slo=1.0, tag=0))
    first, _, _ = s.next_batch()
    for i in range(1, 11):
        s.admit(request("a", clock, slo=1.0, tag=i))
    assert s.next_batch() is None
    s.finished(first)
    sizes = []
    while (nxt := s.next_batch()) is not None:
        ticket, _, batch = nxt
        sizes.append([r.payload for r in batch])
        s.finished(ticket)
    assert sizes == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]


def test_the_nearest_deadline_goes_first_across_models():
    clock = Clock()
    s = scheduler(clock, depth=2, a=None, b=None)
    s.admit(request("a", clock, slo=0.200, tag="late"))
    clock.now += 0.001
    s.admit(request("b", clock, slo=0.050, tag="soon"))  # arrived later, due sooner
    assert [r.payload for r in s.next_batch()[2]] == ["soon"]
    assert [r.payload for r in s.next_batch()[2]] == ["late"]


def test_a_client_deadline_that_the_work_ahead_would_miss_is_refused_at_once():
    clock = Clock()
    s = scheduler(clock, max_batch=4)
    for i in range(8):  # two full batches ahead: 2 x (16 ms + 4 ms of decode)
        s.admit(request("a", clock, slo=1.0, tag=i))
    assert s.work_ahead(request("a", clock)) == pytest.approx(0.040 + 0.011)
    with pytest.raises(Refused, match="past the deadline") as refused:
        s.admit(request("a", clock, slo=0.045))
    # Its client is told why, and that the same 45 ms would do once the 6 ms it is late by are worked through.
    assert refused.value.reason == DEADLINE_CANNOT_BE_MET
    assert refused.value.retry_after_s == pytest.approx(0.051 - 0.045)
    s.admit(request("a", clock, slo=0.060))  # a client that allows more time gets in
    assert s.queued() == 9


def test_engines_side_by_side_share_the_work_ahead_and_take_more_batches():
    clock = Clock()
    s = scheduler(clock, max_batch=4)
    s.engines = 2  # two worker processes: each takes `depth` batches, and the queue ahead drains twice as fast
    for i in range(8):
        s.admit(request("a", clock, slo=1.0, tag=i))
    assert s.work_ahead(request("a", clock)) == pytest.approx(0.040 / 2 + 0.011)
    s.admit(request("a", clock, slo=0.045))  # one engine would miss this deadline (the test above)
    first, second = s.next_batch(), s.next_batch()
    assert first is not None and second is not None and s.next_batch() is None
    s.engines = 0  # every worker down: nothing launches until one is back
    s.finished(first[0])
    assert s.next_batch() is None


def test_a_full_queue_refuses_until_the_engine_takes_its_next_batch():
    clock = Clock()
    s = scheduler(clock, max_queue=3)
    s.admit(request("a", clock, slo=10.0))
    s.next_batch()  # a batch of one in flight: 10 ms run + 1 ms decode, the engine's one place (depth 1) taken
    for _ in range(3):
        s.admit(request("a", clock, slo=10.0))
    clock.now += 0.004
    with pytest.raises(Refused, match="3 requests already queued") as refused:
        s.admit(request("a", clock, slo=10.0))
    # Room comes when that batch is done and the next is taken: in 7 ms, not once the whole queue is (29 ms).
    assert (refused.value.reason, refused.value.retry_after_s) == (QUEUE_FULL, pytest.approx(0.007))


def test_a_deadline_shorter_than_a_run_of_one_is_refused_as_such_busy_or_idle():
    """Its client is told that the same time budget will never pass (no retry delay), unlike a deadline the work
    ahead would miss."""
    clock = Clock()
    s = scheduler(clock)
    for busy in (False, True):
        with pytest.raises(Refused, match=r"shorter than a run of one image \(10.0 ms\)") as refused:
            s.admit(request("a", clock, slo=0.009))
        assert (refused.value.reason, refused.value.retry_after_s) == (DEADLINE_TOO_SHORT, None), busy
        s.admit(request("a", clock, slo=1.0))


def test_time_the_server_lost_before_admission_is_a_refusal_to_retry_not_a_deadline_too_short():
    """A request that arrived with 50 ms, admitted 45 ms later (the process paused: a garbage collection, the runner's
    lock), has 5 ms left, less than a run of one (10 ms). Its budget was never too short, so it is refused as a
    deadline the work would miss, with a time to try again, which a client does (a DEADLINE_TOO_SHORT is final)."""
    clock = Clock()
    s = scheduler(clock)
    late = request("a", clock, slo=0.050)
    clock.now += 0.045
    with pytest.raises(Refused, match=r"45 ms of the deadline went before the request reached the queue") as refused:
        s.admit(late)
    # Idle: sent again (a new arrival), it is taken at once, so there is nothing to wait for.
    assert (refused.value.reason, refused.value.retry_after_s) == (DEADLINE_CANNOT_BE_MET, 0.0)
    s.admit(request("a", clock, slo=0.050))
    # Busy: the same loss is late by what the work ahead leaves, and that is the time to wait.
    late = request("a", clock, slo=0.050)
    clock.now += 0.045
    with pytest.raises(Refused, match=r"the work queued ahead would end") as refused:
        s.admit(late)
    assert refused.value.reason == DEADLINE_CANNOT_BE_MET and refused.value.retry_after_s > 0


def test_requests_past_their_deadline_are_dropped_not_run():
    clock = Clock()
    s = scheduler(clock)
    s.admit(request("a", clock, slo=0.020, tag="short"))
    s.admit(request("a", clock, slo=0.500, tag="long"))
    assert s.next_wakeup() == pytest.approx(clock() + 0.020)
    clock.now += 0.030
    assert [r.payload for r in s.expired()] == ["short"]
    assert [r.payload for r in s.next_batch()[2]] == ["long"]


def test_only_requests_that_can_share_a_run_are_batched_together():
    clock = Clock()
    s = scheduler(clock, max_batch=4)
    for tag, key in [(0, "iou=0.7"), (1, "iou=0.5"), (2, "iou=0.7"), (3, "iou=0.5")]:
        s.admit(request("a", clock, slo=1.0, key=key, tag=tag))
    ticket, _, batch = s.next_batch()
    assert [r.payload for r in batch] == [0, 2]
    s.finished(ticket)
    assert [r.payload for r in s.next_batch()[2]] == [1, 3]


def test_the_latency_model():
    latency = LatencyModel({1: 0.004, 8: 0.010, 16: 0.016})
    assert latency.bucket(5) == 8 and latency.bucket(40) == 16
    assert latency.batch_seconds(40) == pytest.approx(2 * 0.016 + 0.010)  # two full runs and one of 8
    latency.observe_decode(10, 0.020)
    assert latency.decode_per_image == pytest.approx(0.002)
    latency.observe_decode(10, 0.040)  # the average moves a fifth of the way
    assert latency.decode_per_image == pytest.approx(0.002 + 0.2 * 0.002)
    assert latency.batch_seconds(1) == pytest.approx(0.004 + 0.0024)


def test_an_idle_server_admits_despite_an_inflated_decode_average_which_the_next_batches_correct():
    """A slow spell (a loaded host, a profiler's pauses) once set the decode average to seconds an image: every request
    was then refused, no batch ran, and nothing could correct the average."""
    clock = Clock()
    s = scheduler(clock)
    latency = s.queues["a"].latency
    latency.observe_decode(64, 64 * 2.0)  # two seconds an image
    s.admit(request("a", clock, tag=1))  # idle: admitted, the 10 ms run of one fits the 50 ms deadline
    with pytest.raises(Refused):
        s.admit(request("a", clock, tag=2))  # not idle: the inflated average refuses, as it should while it stands
    for _ in range(40):  # the batches that run decode in 1 ms an image again
        ticket, _, batch = s.next_batch()
        latency.observe_decode(len(batch), 0.001 * len(batch))
        s.finished(ticket)
        s.admit(request("a", clock))
    assert latency.decode_per_image < 0.002
    s.admit(request("a", clock))  # queued behind one: admitted again
    with pytest.raises(Refused, match="shorter than a run of one"):  # idle or not, a run of one past the deadline
        scheduler(clock).admit(request("a", clock, slo=0.005))


def test_batches_slower_than_their_estimate_make_admission_count_what_they_really_take():
    """Runs are measured alone at start-up; under load each batch also waits for the host. Batches taking three
    times their estimate (timed from when each could start: taken, or the one before it finished) lead admission to
    refuse what their real time would make late, and batches back at their estimate bring it back."""
    clock = Clock()
    s = scheduler(clock, depth=2, max_batch=2)
    latency = s.queues["a"].latency

    def run_batches(count: int, factor: float) -> None:
        for _ in range(count):
            s.admit(request("a", clock, slo=1.0))
            s.admit(request("a", clock, slo=1.0))
            first = s.next_batch()
            s.admit(request("a", clock, slo=1.0))
            s.admit(request("a", clock, slo=1.0))
            second = s.next_batch()  # queued behind the first: not counted slow for the wait
            for ticket, _, batch in (first, second):
                clock.now += latency.base_seconds(len(batch)) * factor
                s.finished(ticket)

    run_batches(12, 3.0)
    assert latency.slowdown == pytest.approx(3.0, rel=0.05)
    # Two queued batches of two (12 ms estimated, 36 measured each) and its own of one: 35 ms estimated, 105 ms by
    # the slowdown, past its 80 ms deadline.
    for _ in range(4):
        s.admit(request("a", clock, slo=0.080))
    with pytest.raises(Refused, match="past the deadline"):
        s.admit(request("a", clock, slo=0.080))
    while (chosen := s.next_batch()) is not None:
        s.finished(chosen[0])
    run_batches(12, 1.0)
    assert latency.slowdown == pytest.approx(1.0, rel=0.1)
    for _ in range(4):
        s.admit(request("a", clock, slo=0.080))
    s.admit(request("a", clock, slo=0.080))  # admitted again: 36 ms of work ahead


def test_a_start_up_measured_under_load_is_corrected_by_the_batches_and_an_idle_server_admits_by_them():
    """A start-up timing taken while other work held the machine (runs of 1 and 2 at a second, against 20 ms) refused
    an idle server's every request with a 0.5 s deadline, although each ran in 20 ms. Batches that take a fiftieth of
    their estimate bring admission down toward what they take (to a tenth at most), the idle branch included; a
    smaller bucket measured slower than a larger one is capped at the larger one's time."""
    from yolojet.serve.models import no_faster_when_larger

    assert no_faster_when_larger({1: 1.129, 4: 0.094, 8: 0.2}) == {1: 0.094, 4: 0.094, 8: 0.2}
    clock = Clock()
    s = Scheduler(clock, depth=1)
    latency = LatencyModel({1: 1.0, 2: 1.0})
    s.add_model("a", 2, latency, 100)
    with pytest.raises(Refused, match="shorter than a run of one"):
        s.admit(request("a", clock, slo=0.5))
    s.admit(request("a", clock, slo=5.0))
    for _ in range(30):  # the batches a client with a generous deadline sends: each done in 20 ms
        ticket = s.next_batch()[0]
        clock.now += 0.020
        s.finished(ticket)
        s.admit(request("a", clock, slo=5.0))
    assert latency.slowdown < 0.15
    while (chosen := s.next_batch()) is not None:
        s.finished(chosen[0])
    s.admit(request("a", clock, slo=0.5))  # idle: a run of one now fits
    s.admit(request("a", clock, slo=0.5))  # and behind it


def test_a_batch_in_flight_counts_only_what_is_left_of_it():
    """A request that arrives late in a batch's run waits only for the rest of it: the full batch's estimate once
    refused requests the engine would have answered in time (half of them at half the sustained rate)."""
    clock = Clock()
    s = scheduler(clock, max_batch=4)
    for _ in range(4):
        s.admit(request("a", clock, slo=1.0))
    ticket, _, _ = s.next_batch()  # 16 ms of run and 4 of decode
    assert s.work_ahead(request("a", clock)) == pytest.approx(0.020 + 0.011)
    clock.now += 0.015
    assert s.work_ahead(request("a", clock)) == pytest.approx(0.005 + 0.011)
    s.admit(request("a", clock, slo=0.020))  # the whole batch ahead (31 ms) would have refused it
    clock.now += 0.010  # the batch runs 5 ms past its estimate: until it is answered, nothing more is counted for it
    assert s.work_ahead(request("a", clock)) == pytest.approx(s.queues["a"].latency.batch_seconds(2))
    s.finished(ticket)
    assert s.next_batch() is not None
    assert s.work_ahead(request("a", clock)) == pytest.approx(2 * s.queues["a"].latency.batch_seconds(1), rel=1e-6)


def test_a_request_behind_another_with_an_earlier_deadline_is_dropped_at_its_own():
    clock = Clock()
    s = scheduler(clock, depth=1)
    s.admit(request("a", clock, slo=1.0))
    ticket, _, _ = s.next_batch()  # the engine busy from here
    s.admit(request("a", clock, slo=0.500, tag="patient"))
    s.admit(request("a", clock, slo=0.200, tag="hurried"))  # arrived later, due sooner
    assert s.next_wakeup() == pytest.approx(clock() + 0.200)
    clock.now += 0.250
    assert [r.payload for r in s.expired()] == ["hurried"]
    assert s.next_wakeup() == pytest.approx(clock() + 0.250)
    s.finished(ticket)
    assert [r.payload for r in s.next_batch()[2]] == ["patient"]
    assert s.next_wakeup() == float("inf")
