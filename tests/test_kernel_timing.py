"""megamoe.kernel.timing.cuda_times_us against fake CUDA events (no GPU needed)."""

import pytest

torch = pytest.importorskip("torch")

from megamoe.kernel.timing import cuda_times_us  # noqa: E402


def test_times_come_from_the_event_pair_around_each_call(monkeypatch):
    clock = {"ms": 0.0}
    log = []

    class FakeEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing
            self.t = None

        def record(self):
            self.t = clock["ms"]
            log.append("record")

        def synchronize(self):
            log.append("sync-event")

        def elapsed_time(self, other):
            return other.t - self.t

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: log.append("sync-device"))
    durations = iter([0.5, 0.5, 1.0, 2.0, 3.0])  # ms: two warm-up calls, then three timed

    def fn():
        clock["ms"] += next(durations)
        log.append("fn")

    times = cuda_times_us(fn, reps=3, warmup=2, before_each=lambda: log.append("barrier"))
    assert times == [1000.0, 2000.0, 3000.0]
    assert log[:3] == ["fn", "fn", "sync-device"]
    # every timed call: barrier outside the events, then record / fn / record / wait
    assert log[3:] == ["barrier", "record", "fn", "record", "sync-event"] * 3
