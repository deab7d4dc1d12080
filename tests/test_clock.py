"""Gradient-ready times come from the executor's clock (issue 21, defect 2), pinned without a GPU.

On a GPU a post-accumulate-grad hook runs when the host *enqueued* the backward kernels, so the
executors mark through :mod:`repro.runtime.clock`: CUDA events on a GPU, resolved after the step. A
``FakeDeviceClock`` (a :class:`DeviceClock` whose events carry device times the test sets, on a host
base far from ``perf_counter``) drives the real hooks of every executor and the online trace: what
comes out must be the device times, never the host times at which the hooks ran.
"""

import time

import pytest
import torch
from torch import nn

from repro.runtime.clock import DeviceClock, HostClock, ReadyTimes, clock_for, make_clock

OFFSET = 5_000.0  # host time = device time + OFFSET (the fake's host base, far from perf_counter's)


class FakeEvent:
    """A timing event whose device time (seconds) is what the owning fake device says at record()."""

    def __init__(self, device: "FakeDeviceClock") -> None:
        self.device = device
        self.t: float | None = None

    def record(self, stream=None) -> None:
        self.t = self.device.device_time_of_record()
        self.device.recorded_on.append(stream)

    def synchronize(self) -> None:
        assert self.t is not None

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.t is not None and end.t is not None, "elapsed_time of an event never recorded"
        return (end.t - self.t) * 1e3  # milliseconds, as torch.cuda.Event


class FakeDeviceClock(DeviceClock):
    """:class:`DeviceClock` on fake events: ``device_times[key]`` is when the fake device computed
    ``key``'s gradient (seconds); ``device_now`` is the device's time when it is idle (reference
    event); the host time on that base is ``device time + OFFSET``."""

    def __init__(self, device_times: dict[str, float] | None = None, device_now: float = 10.0) -> None:
        super().__init__("cuda:1", event_factory=lambda: FakeEvent(self), synchronize=self._sync,
                         current_stream=lambda: "cuda:1's current stream",
                         host_time=lambda: self.device_now + OFFSET)
        self.recorded_on: list = []  # the stream of every record()
        self.device_times = dict(device_times or {})
        self.device_now = device_now
        self.syncs = 0
        self.marks: list[tuple[str, float]] = []  # (key, host perf_counter when the hook marked)
        self._marking: str | None = None

    def _sync(self) -> None:
        self.syncs += 1

    def device_time_of_record(self) -> float:
        if self._marking is None:  # the reference event, recorded on the idle device
            return self.device_now
        return self.device_times[self._marking]

    def mark(self, key, host_s=None):
        self.marks.append((key, time.perf_counter()))
        self._marking = key
        try:
            super().mark(key, host_s)
        finally:
            self._marking = None


# ---------------------------------------------------------------------------------------------
# the clocks themselves
# ---------------------------------------------------------------------------------------------

def test_host_clock_is_perf_counter():
    clock = HostClock()
    before = time.perf_counter()
    clock.mark("a")
    clock.mark("b", host_s=123.5)  # a stamp the caller already took is kept as it is
    after = time.perf_counter()
    assert before <= clock.ready["a"] <= after
    assert clock.ready["b"] == 123.5
    assert isinstance(clock.ready, ReadyTimes) and dict(clock.ready) == {"a": clock.ready["a"], "b": 123.5}
    before = time.perf_counter()
    assert before <= clock.now() <= time.perf_counter()
    clock.ready.clear()
    assert len(clock.ready) == 0 and dict(clock.ready) == {}


def test_device_clock_resolves_events_once_per_step_against_a_reference():
    clock = FakeDeviceClock({"fc2": 0.25, "fc1": 0.75}, device_now=2.0)
    clock.mark("fc2")
    clock.mark("fc1")
    assert len(clock.ready) == 2 and "fc1" in clock.ready  # neither reads the events back
    assert clock.resolutions == 0 and clock.syncs == 0
    assert dict(clock.ready) == pytest.approx({"fc2": OFFSET + 0.25, "fc1": OFFSET + 0.75}, abs=1e-9)
    for _ in range(5):  # read again and again: resolved once, one device synchronize
        assert clock.ready["fc1"] == pytest.approx(OFFSET + 0.75, abs=1e-9)
    assert clock.resolutions == 1 and clock.syncs == 1
    # next step: the same events are re-recorded, resolved once more
    clock.device_times = {"fc2": 3.5, "fc1": 3.625}
    clock.device_now = 4.0
    clock.mark("fc2")
    clock.mark("fc1")
    assert len(clock._events) == 2  # one event per layer, reused
    assert dict(clock.ready) == pytest.approx({"fc2": OFFSET + 3.5, "fc1": OFFSET + 3.625}, abs=1e-9)
    assert clock.resolutions == 2
    # host times given to mark() do not matter on a device
    clock.mark("fc1", host_s=1.0)
    assert clock.ready["fc1"] == pytest.approx(OFFSET + 3.625, abs=1e-9)
    # marks and the reference on the model's device's stream (cuda:1), not the current device's (cuda:0
    # in a process that never called torch.cuda.set_device)
    assert clock.recorded_on and set(clock.recorded_on) == {"cuda:1's current stream"}


def test_device_clock_now_waits_for_the_device():
    clock = FakeDeviceClock(device_now=7.0)
    assert clock.now() == OFFSET + 7.0 and clock.syncs == 1
    assert dict(clock.ready) == {} and clock.syncs == 1  # nothing marked: nothing to read back


def test_factory_picks_the_clock_by_device():
    assert isinstance(make_clock("cpu"), HostClock)
    assert isinstance(make_clock(None), HostClock)
    cuda = make_clock(torch.device("cuda", 0))  # built without touching CUDA (events only at a mark)
    assert isinstance(cuda, DeviceClock) and cuda.device == torch.device("cuda", 0)
    model = nn.Linear(2, 2)
    assert isinstance(clock_for(model), HostClock)  # a CPU model: today's perf_counter stamps
    given = FakeDeviceClock()
    assert clock_for(model, given) is given
    assert isinstance(clock_for(nn.ReLU()), HostClock)  # no parameters


# ---------------------------------------------------------------------------------------------
# every executor marks through the clock it is given (one gloo rank in this process)
# ---------------------------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.fc3 = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


LAYERS = ["fc1", "fc2", "fc3"]  # module view, forward order



def _plan(kind: str, density: float = 0.5):
    from repro.core.plan import Bucket, Message, Plan
    from repro.families.dear.planners import DEAR_MESSAGES

    backward = LAYERS[::-1]
    if kind == "allreduce":
        return Plan.from_dict({"buckets": [backward[:1], backward[1:]]})
    if kind == "sparse":
        return Plan.from_dict({"family": "sparse", "options": {"density": density},
                               "buckets": [{"layers": backward, "messages": ["sparse_allgather"]}]})
    if kind == "dear":
        return Plan([Bucket(tuple(backward[:1]), DEAR_MESSAGES), Bucket(tuple(backward[1:]), DEAR_MESSAGES)],
                    family="dear")
    if kind == "bytescheduler":
        return Plan([Bucket((name,), (Message("allreduce", "backward", float(LAYERS.index(name))),))
                     for name in backward], "bytescheduler", family="bytescheduler",
                    options={"credit_bytes": 1 << 20})
    raise AssertionError(kind)


def _executor(kind: str, model: nn.Module, clock, density: float = 0.5):
    from repro.runtime.executor import ExecutorOptions

    options = ExecutorOptions(view="module", clock=clock)
    plan = _plan(kind, density)
    if kind == "allreduce":
        from repro.families.allreduce.executor import AllReduceExecutor
        return AllReduceExecutor(model, plan, options)
    if kind == "sparse":
        from repro.families.sparse.executor import SparseExecutor
        return SparseExecutor(model, plan, options)
    if kind == "dear":
        from repro.families.dear.executor import DeARExecutor
        return DeARExecutor(model, plan, options)
    from repro.families.bytescheduler.executor import ByteSchedulerExecutor
    return ByteSchedulerExecutor(model, plan, options)


def _device_times(step: int) -> dict[str, float]:
    """The fake device's gradient-ready times of one step: backward fc3, fc2, fc1 with gaps that have
    nothing to do with how fast the host ran the hooks."""
    base = 1.0 + step
    return {"fc3": base + 0.002, "fc2": base + 0.007, "fc1": base + 0.008}


@pytest.mark.distributed
@pytest.mark.parametrize("kind", ["allreduce", "sparse", "dear", "bytescheduler"])
def test_every_executor_takes_its_ready_times_from_its_clock(one_rank, kind):
    model = MLP()
    clock = FakeDeviceClock()
    ex = _executor(kind, model, clock)
    try:
        assert ex.clock is clock
        opt = ex.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
        x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
        for step in range(2):
            clock.device_times = _device_times(step)
            clock.device_now = 1.5 + step
            n0 = len(clock.marks)
            opt.zero_grad()
            ex.before_forward()
            nn.functional.cross_entropy(ex.module(x), y).backward()
            ex.after_backward()
            opt.step()
            ready = dict(ex.grad_ready_s)
            expected = {k: v + OFFSET for k, v in _device_times(step).items()}
            assert ready == pytest.approx(expected, abs=1e-9), kind
            # the hooks ran on the host at perf_counter times, nowhere near these
            host = dict(clock.marks[n0:])  # a layer's mark is its last parameter's
            assert set(host) == set(LAYERS)
            assert all(abs(ready[k] - host[k]) > 1.0 for k in LAYERS)
        assert clock.resolutions == 2  # once per step
        ex.flush()
    finally:
        ex.remove()


@pytest.mark.distributed
@pytest.mark.parametrize("clock_kind", ["host", "device"])
@pytest.mark.parametrize("kind", ["allreduce", "sparse", "dear"])
def test_ready_times_are_the_last_iterations_only(one_rank, kind, clock_kind):
    """A step whose loss reaches only fc3 leaves no ready time for fc1 and fc2 from the step before
    (they had none in the last backward), and a step whose loss reaches no parameter leaves none at all.
    (ByteScheduler is not here: it stamps a missing layer when it fills its zeros in, every step.)"""
    model = MLP()
    clock = FakeDeviceClock() if clock_kind == "device" else HostClock()
    ex = _executor(kind, model, clock)
    try:
        opt = ex.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
        x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
        for step, reach in enumerate(["everything", "fc3", "nothing"]):
            if clock_kind == "device":
                clock.device_times = _device_times(step)
                clock.device_now = 1.5 + step
            opt.zero_grad()
            ex.before_forward()
            if reach == "nothing":  # a loss of no parameter: no gradient hook fires in this backward
                out = torch.randn(4, 3, requires_grad=True) * 2
            else:
                out = ex.module(x) if reach == "everything" else ex.module.fc3(torch.randn(4, 8))
            nn.functional.cross_entropy(out, y).backward()
            ex.after_backward()
            opt.step()
            ready = dict(ex.grad_ready_s)
            expected = {"everything": set(LAYERS), "fc3": {"fc3"}, "nothing": set()}[reach]
            assert set(ready) == expected, (kind, reach, ready)
            if clock_kind == "device" and reach == "fc3":
                assert ready["fc3"] == pytest.approx(_device_times(1)["fc3"] + OFFSET, abs=1e-9)
        ex.flush()
    finally:
        ex.remove()


def test_clocks_keep_the_last_iterations_marks_until_the_next_begins():
    for clock in (HostClock(), FakeDeviceClock({"a": 0.5, "b": 0.75}, device_now=1.0)):
        clock.mark("a")
        clock.mark("b")
        clock.end_iteration()
        assert set(clock.ready) == {"a", "b"} and len(clock.ready) == 2 and "b" in clock.ready
        clock.mark("a")  # the next iteration: only a so far
        assert set(clock.ready) == {"a"} and "b" not in clock.ready and len(clock.ready) == 1
        clock.end_iteration()
        assert set(clock.ready) == {"a"}
        clock.end_iteration()  # an iteration without a mark: no times, not the last iteration's
        assert len(clock.ready) == 0 and dict(clock.ready) == {} and "a" not in clock.ready
        clock.mark("b")
        clock.reset()
        assert len(clock.ready) == 0


@pytest.mark.distributed
def test_executors_on_a_cpu_model_keep_perf_counter_stamps(one_rank):
    model = MLP()
    ex = _executor("allreduce", model, None)
    try:
        assert isinstance(ex.clock, HostClock)
        before = time.perf_counter()
        nn.functional.cross_entropy(ex.module(torch.randn(4, 6)), torch.randint(0, 3, (4,))).backward()
        ex.after_backward()
        after = time.perf_counter()
        ready = dict(ex.grad_ready_s)
        assert set(ready) == set(LAYERS)
        assert all(before <= t <= after for t in ready.values())
        assert ready["fc3"] <= ready["fc2"] <= ready["fc1"]  # backward order
    finally:
        ex.remove()


# ---------------------------------------------------------------------------------------------
# the online trace is built from the device times
# ---------------------------------------------------------------------------------------------

@pytest.mark.distributed
def test_measured_trace_is_the_one_the_device_times_imply(one_rank):
    """A warm-up as repro train and repro.distribute run it (SyncEASGD executor, phase stamps taken
    after a device sync on the clocks' host base) with a fake device: the trace's backward gaps,
    order, forward total and overheads are the fake device's, not the host's."""
    from repro.families.allreduce.executor import AllReduceExecutor
    from repro.runtime.executor import ExecutorOptions
    from repro.runtime.online import StepTimes, measured_trace
    from repro.core.plan import Plan

    model = MLP()
    clock = FakeDeviceClock()
    warm = AllReduceExecutor(model, Plan.from_dict({"solver": "syncea", "buckets": [LAYERS]}),
                             ExecutorOptions(view="module", clock=clock))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # per step, on the device: start s, buffer broadcast 1 ms, forward 9 ms, then fc3 +4 ms, fc2 +3 ms
    # (fc2 +6 ms in one step: the median drops it), fc1 +2 ms, exchange to +20 ms, update 2 ms
    gaps = [(0.004, 0.003, 0.002), (0.004, 0.006, 0.002), (0.004, 0.003, 0.002)]
    steps, host_steps = [], []
    for i, (g3, g2, g1) in enumerate(gaps):
        s = 10.0 * (i + 1)
        fwd_start, bwd_start = s + 0.001, s + 0.010
        clock.device_times = {"fc3": bwd_start + g3, "fc2": bwd_start + g3 + g2, "fc1": bwd_start + g3 + g2 + g1}
        n0 = len(clock.marks)
        opt.zero_grad()
        warm.before_forward()
        nn.functional.cross_entropy(warm.module(torch.randn(4, 6)), torch.randint(0, 3, (4,))).backward()
        warm.after_backward()
        opt.step()
        clock.device_now = s + 0.022  # idle device after the step: the reference event
        st = StepTimes(s + OFFSET, fwd_start + OFFSET, bwd_start + OFFSET, bwd_start + OFFSET,
                       s + 0.020 + OFFSET, s + 0.022 + OFFSET, float("nan"))
        steps.append((st, dict(warm.grad_ready_s)))
        marks = clock.marks[n0:]  # the host times at which the hooks ran, moved onto the step's base
        host_steps.append((st, {key: st.backward_start + (t - marks[0][1]) for key, t in marks}))
    warm.remove()

    trace = measured_trace(model, steps, torch.device("cpu"), model_name="mlp", batch_size=4, view="module")
    assert trace.names == LAYERS
    backward = {layer.name: layer.backward_s for layer in trace.layers}
    assert backward == pytest.approx({"fc3": 0.004, "fc2": 0.003, "fc1": 0.002}, abs=1e-9)
    for layer in trace.layers:
        assert layer.forward_s == pytest.approx(0.009 / 3, abs=1e-9)
    assert trace.overheads.pre_forward_s == pytest.approx(0.001, abs=1e-9)
    assert trace.overheads.update_s == pytest.approx(0.002, abs=1e-9)
    assert trace.overheads.straggler_s == pytest.approx(0.0, abs=1e-9)

    # the same steps with the host times at which the hooks ran give another trace
    host_trace = measured_trace(model, host_steps, torch.device("cpu"), model_name="mlp", batch_size=4,
                                view="module")
    assert [layer.backward_s for layer in host_trace.layers] != pytest.approx(
        [layer.backward_s for layer in trace.layers], abs=1e-4)


@pytest.mark.distributed
def test_a_layer_without_a_gradient_in_a_step_counts_as_ready_at_that_backwards_end(one_rank):
    """The executors write a layer that got no gradient (its zeros) when the exchange finishes, so the
    measured trace takes it as ready at the end of that step's backward (its last ready time), never at
    the backward's start (which put it first in backward order, before every real gradient)."""
    from repro.runtime.online import StepTimes, measured_trace

    model = MLP()
    st = StepTimes(start=0.0, forward_start=0.001, backward_start=0.010, backward_end=0.030, exchange_end=0.031,
                   end=0.032, loss=1.0)
    missing = (st, {"fc3": 0.012, "fc2": 0.020})  # fc1 had no gradient: ready with fc2, the last
    steps = [missing, missing, (st, {"fc3": 0.012, "fc2": 0.020, "fc1": 0.024})]
    trace = measured_trace(model, steps, torch.device("cpu"), model_name="mlp", batch_size=4, view="module")
    assert [layer.name for layer in trace.layers] == LAYERS  # forward order: fc1 is still the last to be ready
    gaps = {layer.name: layer.backward_s for layer in trace.layers}
    assert gaps["fc3"] == pytest.approx(0.002) and gaps["fc2"] == pytest.approx(0.008)
    assert gaps["fc1"] == pytest.approx(0.0, abs=1e-12)  # median over steps: at fc2's time, the backward's end


def _door_phase_stamps(ctx) -> dict:
    """On a rank: phase stamps of a warm-up step (host) and a planned step (a fake device clock)."""
    import repro

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    m, opt = repro.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), "mgwfbp", warmup_steps=1)
    door = opt._door
    fake = door._phase_clock = FakeDeviceClock(DOOR_DEVICE_TIMES, device_now=4.0)

    def step():
        opt.zero_grad()
        nn.functional.cross_entropy(m(torch.randn(4, 4)), torch.randint(0, 2, (4,))).backward()
        opt.step()

    out = {"warming_up": door.warming_up}
    step()  # the warm-up: synchronised host stamps, the device clock unused
    out.update(warmup_marks=list(fake.marks), warmup_stamps=door.last_stamps, now=time.perf_counter(),
               warming_up_after=door.warming_up)
    step()
    out.update(marks=[k for k, _ in fake.marks], stamps=door.last_stamps, syncs=fake.syncs)
    return out


DOOR_DEVICE_TIMES = {"start": 1.0, "forward_start": 1.25, "backward_start": 2.0, "backward_end": 3.5,
                     "exchange_end": 3.75}


@pytest.mark.distributed
def test_after_the_warm_up_the_doors_phase_stamps_are_the_devices():
    """On a GPU the host only enqueues a phase's kernels: after the warm-up (which synchronises before
    each stamp) the door marks each phase through a device clock, and ``last_stamps`` (the phase columns
    of iterations.csv, the in-run trace) are the device's times on the host base, never the host's
    (issue 32, item 4). A fake device clock stands in for the CUDA events; 2 gloo ranks."""
    from repro.launch.local import launch_local

    for r in launch_local(_door_phase_stamps, 2, timeout_s=120):
        assert r["warming_up"] and not r["warming_up_after"] and r["warmup_marks"] == []
        assert set(r["warmup_stamps"]) == set(DOOR_DEVICE_TIMES)
        assert all(0 <= r["now"] - v < 60 for v in r["warmup_stamps"].values())  # host perf_counter stamps
        assert r["marks"] == list(DOOR_DEVICE_TIMES)
        assert r["stamps"] == pytest.approx({k: OFFSET + t for k, t in DOOR_DEVICE_TIMES.items()}, abs=1e-9)
        assert r["syncs"] == 1  # read back once, when asked
