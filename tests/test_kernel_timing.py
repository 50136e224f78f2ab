"""megamoe.kernel.timing.cuda_times_us against fake CUDA events (no GPU needed)."""

import pytest

torch = pytest.importorskip("torch")

from megamoe.kernel.timing import cuda_times_us  # noqa: E402


def test_times_come_from_the_event_pair_around_each_call(monkeypatch):
    log = []
    fn = _fake_events(monkeypatch, [0.5, 0.5, 1.0, 2.0, 3.0], log)  # ms: two warm-up calls, then three timed
    times = cuda_times_us(fn, reps=3, warmup=2, before_each=lambda: log.append("barrier"))
    assert times == [1000.0, 2000.0, 3000.0]
    assert log[:3] == ["fn", "fn", "sync-device"]
    # every timed call: barrier outside the events, then record / fn / record / wait
    assert log[3:] == ["barrier", "record", "fn", "record", "sync-event"] * 3


def _fake_events(monkeypatch, durations, log):
    clock = {"ms": 0.0}

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
    it = iter(durations)

    def fn():
        clock["ms"] += next(it)
        log.append("fn")

    return fn


def test_steady_time_is_one_event_pair_around_back_to_back_calls(monkeypatch):
    from megamoe.kernel.timing import cuda_steady_us

    log = []
    # one warm-up call, then two rounds, each a lead-in call (50 ms: the host's start-up latency
    # and the first call, outside the window) and three timed calls: 1+2+3 ms and 3+3+3 ms
    fn = _fake_events(monkeypatch, [9.0, 50.0, 1.0, 2.0, 3.0, 50.0, 3.0, 3.0, 3.0], log)
    assert cuda_steady_us(fn, calls=3, rounds=2, before_each=lambda: log.append("barrier")) == [2000.0, 3000.0]
    # every round: device sync and barrier outside the events, the lead-in, then the calls
    # between one pair
    assert log == ["fn"] + ["sync-device", "barrier", "fn", "record", "fn", "fn", "fn", "record", "sync-event"] * 2
    with pytest.raises(ValueError, match="calls and rounds"):
        cuda_steady_us(fn, calls=0)


def test_device_times_keep_only_the_named_cuda_kernels():
    from types import SimpleNamespace as NS

    from megamoe.kernel.timing import device_times_of

    cuda, cpu = NS(name="CUDA"), NS(name="CPU")
    events = [NS(name="void megamoe::megamoe_sm90_kernel<16, false>(megamoe::Sm90Args)", device_type=cuda, device_time_total=1139.4),
              NS(name="vectorized_elementwise_kernel<FillFunctor<int>>", device_type=cuda, device_time_total=0.86),
              NS(name="megamoe_sm90_launch", device_type=cpu, device_time_total=0.0),
              NS(name="void megamoe::megamoe_sm90_kernel<16, false>(megamoe::Sm90Args)", device_type=cuda, device_time_total=1141.0)]
    assert device_times_of(events, "megamoe_sm90_kernel") == [1139.4, 1141.0]
    assert device_times_of(events, "no_such_kernel") == []


def test_alternating_rounds_run_abba_and_after_each_round():
    from megamoe.kernel.timing import alternating_rounds

    log = []
    fns = {"a": lambda: log.append("a") or 1.0, "b": lambda: log.append("b") or 2.0}
    out = alternating_rounds(fns, 3, lambda fn: fn() * 10, after_round=lambda: log.append("|"))
    assert out == [{"a": 10.0, "b": 20.0}] * 3
    assert log == ["a", "b", "|", "b", "a", "|", "a", "b", "|"]
    with pytest.raises(ValueError, match="rounds"):
        alternating_rounds(fns, 0, lambda fn: fn())


def test_int_at_least():
    """A script's integer argument: the value, or an InputError naming the field, the bound
    and the text as given."""
    from megamoe.errors import InputError
    from megamoe.kernel.timing import int_at_least

    assert int_at_least("8", "rounds", 2) == 8 and int_at_least("2", "rounds", 2) == 2
    for bad in ("1", "x", "2.5", ""):
        with pytest.raises(InputError, match=rf"^rounds: expected an integer >= 2, got {bad!r}$"):
            int_at_least(bad, "rounds", 2)


def test_token_counts():
    from megamoe.errors import InputError
    from megamoe.kernel.timing import token_counts

    assert token_counts("64,1024") == [64, 1024] and token_counts("7") == [7]
    for bad in ("", "64,", "0", "64,-1", "1e3", "a"):
        with pytest.raises(InputError, match=rf"^tokens: expected comma-separated integers >= 1, got {bad!r}$"):
            token_counts(bad)
    with pytest.raises(InputError, match=r"^check-tokens: expected comma-separated integers >= 1, got '0'$"):
        token_counts("0", "check-tokens")


def test_crossover_ratios_cancel_the_objects_difference():
    """megamoe.kernel.timing.crossover_ratios: object 0 is 1.21x object 1 whatever build it
    runs and the new build is 0.81x the old on either object: new@0 = 1.21 * 81, new@1 = 81,
    old@0 = 1.21 * 100, old@1 = 100. By hand: builds sqrt(new@0 * new@1 / (old@0 * old@1)) =
    sqrt(0.81^2) = 0.81, objects sqrt(new@0 * old@0 / (new@1 * old@1)) = sqrt(1.21^2) = 1.21;
    a plain paired ratio new@0 / old@1 would read 1.21 * 0.81 = 0.9801."""
    from megamoe.kernel.timing import crossover_ratios
    r = {"new@0": 1.21 * 81.0, "new@1": 81.0, "old@0": 1.21 * 100.0, "old@1": 100.0}
    builds, objs = crossover_ratios([r, {k: 2 * v for k, v in r.items()}])
    assert builds == pytest.approx([0.81, 0.81], rel=1e-12)
    assert objs == pytest.approx([1.21, 1.21], rel=1e-12)
    assert r["new@0"] / r["old@1"] == pytest.approx(0.9801, rel=1e-12)
    with pytest.raises(ValueError, match=r"rounds\[0\]: expected the keys"):
        crossover_ratios([{"new@0": 1.0, "old@1": 1.0, "new@1": 1.0}])
    with pytest.raises(ValueError, match=r"rounds\[1\]: expected positive times"):
        crossover_ratios([r, {**r, "old@0": 0.0}])


def test_median_kernel_time_is_the_median_of_the_named_kernels(monkeypatch):
    import megamoe.kernel.timing as timing

    seen = {}

    def fake_durations(fn, calls, name):
        seen.update(calls=calls, name=name)
        return [5.0, 1.0, 4.0, 2.0, 30.0][:calls]

    monkeypatch.setattr(timing, "kernel_durations_us", fake_durations)
    assert timing.median_kernel_us(lambda: None) == 4.0  # sorted 1, 2, 4, 5, 30
    assert seen == {"calls": 5, "name": "megamoe_sm90_kernel"}
    assert timing.median_kernel_us(lambda: None, 4, "other") == 3.0  # (2 + 4) / 2
    assert seen == {"calls": 4, "name": "other"}
