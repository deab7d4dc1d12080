"""DeAR and ByteScheduler are correct by construction on CUDA/NCCL (issue 21, defects 3, 4 and 7),
pinned without a GPU.

- **One thread, one order** (defect 3): two gloo ranks train a tiny model with BatchNorm (so the
  buffer broadcast before each forward is exercised) with DeAR (several buckets; one bucket per layer
  with the ``synchronize()`` escape hatch) and ByteScheduler (pieces, a credit of one chunk). Every
  ``torch.distributed`` call is recorded per rank during the steps (op, group, numel, dtype, thread):
  the sequences are identical on both ranks, across all groups together (so every communicator sees
  the same interleaving), and they come from a single thread that is not the main thread. The old
  code broadcast the buffers from the main thread on the default group while the communication
  thread drove its own group: this test fails there (two threads).
- **Completion is measured on the device** (defect 4): ByteScheduler's :class:`CudaComm` driven by
  fake events on one gloo rank: a chunk's completion reported late by the fake device keeps its bytes
  in the credit (the next chunk is not issued) until the event completes; the timeline's ``end_s``
  is the fake device's time on the host base. The old code released the credit when the ``Work``'s
  future completed (at enqueue on NCCL).
- **The forward waits on the stream, not the host** (defect 7): :class:`StreamWaits` waits only for
  the enqueue and makes the current stream wait for the collective's event (a fake handle whose
  ``wait()`` raises); DeAR's executor consumes every collective through it (a fake stream records the
  waits; ``Handle.wait`` is never called) and still equals its host-waiting run exactly.
- :func:`pick_chunks`, :class:`EventCompletions`, the choice of waits per device, and the one
  optimizer wrapper both families share.
"""

from __future__ import annotations

import math
import re
import threading
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

from repro.launch.local import launch_local
from repro.runtime.clock import EventCompletions, HostWaits, StreamWaits, waits_for


# ---------------------------------------------------------------------------------------------
# recording every torch.distributed call (used in the spawned ranks)
# ---------------------------------------------------------------------------------------------

_RECORDED = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "all_gather_single",
             "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "all_to_all_single",
             "gather", "scatter", "reduce", "barrier", "send", "recv", "isend", "irecv")


class CollectiveLog:
    """While ``on``: every call of the functions above (and CommStream's aliases of the RS / AG
    functions) as ``(op, group name, numel, dtype, thread)``. Group names are torch's creation
    counters (the same on every rank for groups created in the same order); the thread is ``"main"``
    or the thread's name without digits (``CommStream-rank0`` and ``CommStream-rank1`` are one role)."""

    def __init__(self) -> None:
        import repro.runtime.collectives as collectives

        self.on = False
        self.calls: list[tuple] = []
        self.threads: set[int] = set()
        self._lock = threading.Lock()
        self._saved = []
        for name in _RECORDED:
            if hasattr(dist, name):
                self._patch(dist, name, name)
        for alias, name in (("_reduce_scatter_tensor", "reduce_scatter_tensor"),
                            ("_all_gather_into_tensor", "all_gather_into_tensor")):
            self._patch(collectives, alias, name)
        if hasattr(dist, "_broadcast_coalesced"):  # DDP's C++ buffer sync (repro.runtime.buffers uses it)
            self._patch_coalesced()

    def _patch_coalesced(self) -> None:
        """``dist._broadcast_coalesced(group, tensors, ...)``, logged as one broadcast per dtype (its
        flattened pieces), numel summed, in the order each dtype first appears."""
        fn = dist._broadcast_coalesced

        def wrapper(group, tensors, *args, **kwargs):
            if self.on:
                numel: dict = {}
                for t in tensors:
                    numel[t.dtype] = numel.get(t.dtype, 0) + t.numel()
                for dtype, n in numel.items():
                    self._log("broadcast", (torch.empty(n, dtype=dtype, device="meta"),), {"group": group})
            return fn(group, tensors, *args, **kwargs)
        self._saved.append((dist, "_broadcast_coalesced", fn))
        dist._broadcast_coalesced = wrapper

    def _patch(self, module, attr: str, op: str) -> None:
        fn = getattr(module, attr)

        def wrapper(*args, **kwargs):
            if self.on:
                self._log(op, args, kwargs)
            return fn(*args, **kwargs)
        self._saved.append((module, attr, fn))
        setattr(module, attr, wrapper)

    def _log(self, op: str, args, kwargs) -> None:
        tensor = next((a for a in args if isinstance(a, torch.Tensor)), kwargs.get("tensor"))
        group = kwargs.get("group")
        gname = dist.distributed_c10d._get_default_group().group_name if group is None else group.group_name
        t = threading.current_thread()
        role = "main" if t is threading.main_thread() else re.sub(r"\d+", "", t.name)
        numel = -1 if tensor is None else tensor.numel()
        dtype = "-" if tensor is None else str(tensor.dtype)
        with self._lock:
            self.calls.append((op, gname, numel, dtype, role))
            self.threads.add(t.ident)

    def restore(self) -> None:
        for module, attr, fn in reversed(self._saved):
            setattr(module, attr, fn)


class BNNet(nn.Module):
    """Tiny, with BatchNorm buffers (float running statistics and an int64 counter)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.bn, self.fc2, self.fc3 = nn.Linear(6, 16), nn.BatchNorm1d(16), nn.Linear(16, 16), nn.Linear(16, 3)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.bn(self.fc1(x))))))


def _plan(model: nn.Module, case: dict):
    from repro.core.cost import CostModel, Linear
    from repro.core.planners import make_plan
    from repro.core.trace import Layer, Trace
    from repro.workload.layers import layer_parameters

    layers = []
    for name, params in layer_parameters(model, "module").items():
        n = sum(p.numel() for _, p in params)
        layers.append(Layer(name, n, 4 * n, 1e-4, 1e-4))
    trace = Trace("bnnet", 4, "cpu", "float32", layers)
    P = dist.get_world_size()
    if case["kind"] == "bytescheduler":
        return make_plan("bytescheduler", trace, CostModel.linear(P, 1e-4, 1e-9), partition_params=100,
                         credit_bytes=1)  # one chunk in flight at a time: the credit decides the order
    cost = CostModel(P, {"reduce_scatter": Linear(1e-4, 1e-9), "allgather": Linear(1e-4, 1e-9)})
    opts = {"threshold_bytes": case["threshold_bytes"]} if case["planner"] == "dear_threshold" else {}
    return make_plan(case["planner"], trace, cost, **opts)


def record_sequences(ctx, cases: list[dict], steps: int = 3) -> list[dict]:
    """Per case: the collectives this rank issued during ``steps`` training steps and the flush."""
    from repro.families.bytescheduler.executor import ByteSchedulerExecutor
    from repro.families.dear.executor import DeARExecutor
    from repro.runtime.executor import ExecutorOptions

    out = []
    rank = dist.get_rank()
    for case in cases:
        model = BNNet()
        plan = _plan(model, case)
        cls = ByteSchedulerExecutor if case["kind"] == "bytescheduler" else DeARExecutor
        ex = cls(model, plan, ExecutorOptions(view="module"))
        opt = ex.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
        gen = torch.Generator().manual_seed(10 + rank)  # different data per rank
        log = CollectiveLog()
        try:
            log.on = True
            for _ in range(steps):
                x, y = torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)
                opt.zero_grad()
                ex.before_forward()
                nn.functional.cross_entropy(ex.module(x), y).backward()
                ex.after_backward()
                if case.get("synchronize"):
                    opt.synchronize()
                opt.step()
            ex.flush()
            log.on = False
        finally:
            log.restore()
            ex.remove()
        out.append({"calls": log.calls, "threads": len(log.threads),
                    "buffer_numel": {str(dt): sum(b.numel() for b in model.buffers() if b.dtype == dt)
                                     for dt in {b.dtype for b in model.buffers()}},
                    "params": {n: p.detach().clone() for n, p in model.named_parameters()}})
    return out


ORDER_CASES = [{"kind": "dear", "planner": "dear_threshold", "threshold_bytes": 1200},
               {"kind": "dear", "planner": "dear_nofusion", "synchronize": True},
               {"kind": "bytescheduler"}]


@pytest.fixture(scope="module")
def sequences():
    return launch_local(record_sequences, 2, args=(ORDER_CASES,), timeout_s=300)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(ORDER_CASES)))
def test_every_rank_issues_the_same_collectives_from_one_thread(sequences, index):
    rank0, rank1 = sequences[0][index], sequences[1][index]
    calls0, calls1 = rank0["calls"], rank1["calls"]
    # the steps communicate, and the buffers' broadcast is among what was recorded
    assert len(calls0) > 10, calls0
    for dtype, numel in rank0["buffer_numel"].items():
        assert ("broadcast", numel, dtype) in {(c[0], c[2], c[3]) for c in calls0}, (dtype, numel, calls0)
    # one thread (not the main one) issued every collective, on every group, on each rank ...
    assert rank0["threads"] == 1 and rank1["threads"] == 1, (rank0["threads"], rank1["threads"])
    assert {c[4] for c in calls0} == {c[4] for c in calls1} and "main" not in {c[4] for c in calls0}
    # ... and the whole sequence, every group together, is the same on both ranks
    assert calls0 == calls1
    # (a sanity check that the runs trained the same model on both ranks)
    assert all(torch.equal(rank0["params"][n], rank1["params"][n]) for n in rank0["params"])


# ---------------------------------------------------------------------------------------------
# fakes: CUDA streams and events on a CPU
# ---------------------------------------------------------------------------------------------

OFFSET = 7_000.0  # the fake host time base: host = device + OFFSET (nowhere near perf_counter)


class FakeDevice:
    """A device clock the test moves (``now``, seconds), and events that complete when released."""

    def __init__(self) -> None:
        self.now = 1.0
        self.events: list["FakeEvent"] = []

    def host_time(self) -> float:
        return self.now + OFFSET


class FakeEvent:
    """Timing event: ``record`` notes the device time; ``synchronize`` blocks until ``release(t)``
    (or at once when ``auto``: the reference events, recorded on an idle stream)."""

    def __init__(self, device: FakeDevice, auto: bool = False) -> None:
        self.device, self.auto = device, auto
        self.t: float | None = None
        self.recorded_on = None
        self._done = threading.Event()
        device.events.append(self)

    def record(self, stream=None) -> None:
        self.recorded_on = stream
        self.t = self.device.now
        if self.auto:
            self._done.set()

    def release(self, t: float) -> None:
        """The device finished the work before this event at device time ``t``."""
        self.t = t
        self._done.set()

    def query(self) -> bool:
        return self._done.is_set()

    def synchronize(self) -> None:
        assert self.t is not None, "synchronize on an event never recorded"
        self._done.wait()

    def elapsed_time(self, end: "FakeEvent") -> float:
        return (end.t - self.t) * 1e3


class FakeStream:
    """Records ``wait_event`` calls."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.waited: list = []

    def wait_event(self, event) -> None:
        self.waited.append(event)


class FakeHandle:
    """A collective handle whose host ``wait()`` must not be called."""

    def __init__(self) -> None:
        self.event = object()
        self.enqueued_waits = 0

    def wait_enqueued(self) -> None:
        self.enqueued_waits += 1

    def wait(self) -> None:
        raise AssertionError("host wait on a collective the stream should wait for")


# ---------------------------------------------------------------------------------------------
# unit tests (no process group)
# ---------------------------------------------------------------------------------------------

def test_stream_waits_order_the_stream_and_never_block_the_host():
    stream = FakeStream("compute")
    waits = StreamWaits("cuda", current_stream=lambda: stream)
    handle = FakeHandle()
    waits.wait(handle)
    assert stream.waited == [handle.event] and handle.enqueued_waits == 1
    # the host variant waits on the host
    with pytest.raises(AssertionError, match="host wait"):
        HostWaits().wait(FakeHandle())


def test_waits_are_picked_by_device():
    assert isinstance(waits_for("cpu"), HostWaits) and not waits_for("cpu").on_device
    cuda = waits_for("cuda:0")
    assert isinstance(cuda, StreamWaits) and cuda.on_device and cuda.device == torch.device("cuda", 0)


def test_event_completions_report_device_times_in_issue_order_when_done():
    dev = FakeDevice()
    comp = EventCompletions("cuda", event_factory=lambda: FakeEvent(dev, auto=True),
                            stream_factory=lambda: FakeStream("reference"), host_time=dev.host_time)
    a, b = FakeEvent(dev), FakeEvent(dev)
    a.record(), b.record()
    done: list[tuple[str, float]] = []
    comp.watch(a, lambda end_s: done.append(("a", end_s)))
    comp.watch(b, lambda end_s: done.append(("b", end_s)))
    b.release(2.5)          # b's work finished on the device, a's not yet: nothing reported (FIFO)
    time.sleep(0.2)
    assert done == []
    dev.now = 3.0           # device time when the reference is recorded (idle device)
    a.release(2.0)
    comp.close()
    assert [k for k, _ in done] == ["a", "b"]
    # end_s = host(ref) - elapsed(event, ref): the device's times on the host base
    assert dict(done) == pytest.approx({"a": 2.0 + OFFSET, "b": 2.5 + OFFSET}, abs=1e-9)
    assert comp.error is None


def test_pick_chunks_keeps_the_credit_and_strict_priority():
    from repro.families.bytescheduler.executor import pick_chunks

    class C:
        def __init__(self, nbytes):
            self.nbytes = nbytes

    a, b, c = C(40), C(40), C(10)
    assert pick_chunks([a, b, c], 0, 100) == [a, b, c]
    assert pick_chunks([a, b, c], 0, 50) == [a]           # b does not fit; c (less urgent) waits behind it
    assert pick_chunks([a, b, c], 40, 50) == []           # in flight until *completed*
    assert pick_chunks([a, b], 0, 1) == [a]               # one chunk whenever nothing is in flight


def test_both_families_share_one_optimizer_wrapper():
    from repro.families.bytescheduler.executor import LayerwiseOptimizer
    from repro.families.dear.executor import DeAROptimizer
    from repro.runtime.deferred import DeferredUpdateOptimizer

    for cls in (DeAROptimizer, LayerwiseOptimizer):
        assert issubclass(cls, DeferredUpdateOptimizer)
        own = set(vars(cls)) & {"step", "synchronize", "zero_grad", "state_dict", "__getattr__"}
        assert not own, (cls, own)  # no second copy


# ---------------------------------------------------------------------------------------------
# one gloo rank in this process: the executors on fake CUDA streams and events
# ---------------------------------------------------------------------------------------------



def _until(cond, timeout_s: float = 10.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def _bytescheduler_on_fake_cuda():
    """A three-layer model under ByteScheduler (one chunk a layer, a credit of one byte: one chunk in
    flight) on a fake CUDA device whose events complete when the test releases them."""
    from repro.core.plan import Bucket, Message, Plan
    from repro.families.bytescheduler.executor import ByteSchedulerExecutor, CudaComm
    from repro.runtime.executor import ExecutorOptions

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    names = ["0", "2", "4"]
    plan = Plan([Bucket((n,), (Message("allreduce", "backward", float(i)),)) for i, n in enumerate(names)],
                "bytescheduler", family="bytescheduler", options={"credit_bytes": 1})
    dev = FakeDevice()
    side, compute = FakeStream("side"), FakeStream("compute")
    comp = EventCompletions("cuda", event_factory=lambda: FakeEvent(dev, auto=True),
                            stream_factory=lambda: FakeStream("reference"), host_time=dev.host_time)
    comm = CudaComm("cuda", event_factory=lambda: FakeEvent(dev), side_stream=side,
                    current_stream=lambda: compute, completions=comp)
    ex = ByteSchedulerExecutor(model, plan, ExecutorOptions(view="module", record_timeline=True), comm=comm)
    return model, names, dev, side, compute, ex


@pytest.mark.distributed
def test_bytescheduler_credit_waits_for_the_device_completion(one_rank):
    """Three one-layer chunks, a credit of one byte (one chunk in flight). Each chunk's all-reduce
    returns at once on the host (as NCCL's Work does at enqueue), but the fake device completes it only
    when the test says: the next chunk is issued only after that, and end_s is the device's time."""
    model, names, dev, side, compute, ex = _bytescheduler_on_fake_cuda()
    try:
        opt = ex.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        ref = [p.detach().clone() for p in model.parameters()]
        x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
        ex.before_forward()
        nn.functional.cross_entropy(ex.module(x), y).backward()
        ex.after_backward()
        chunks = ex._chunks  # plan order: "0", "2", "4" (priorities 0, 1, 2)
        order, events, ends = [], [], {}
        for k in range(3):
            # one chunk in flight at a time: the k-th is issued, and no other until the device completes it
            assert _until(lambda: sum(c.gen for c in chunks) == k + 1), [c.gen for c in chunks]
            time.sleep(0.3)
            assert sum(c.gen for c in chunks) == k + 1, "credit released before the device completed the chunk"
            c = next(c for c in chunks if c.gen == 1 and c not in order)
            order.append(c)
            events.append(c.event)
            assert c.event.recorded_on is side, "the completion event is recorded on the side stream"
            assert c.layer.ready_event in side.waited, "issued after the chunk's ready event"
            assert ex._in_flight_bytes == c.nbytes
            dev.now = 10.0 + k   # the device's time when the reference is recorded
            ends[c.timing.layer] = 9.0 + k - 0.5
            c.event.release(ends[c.timing.layer])   # the device finished this chunk then
        # after the first (whichever the scheduler saw ready first), the most urgent ready one goes next
        assert [c.priority for c in order[1:]] == sorted(c.priority for c in order[1:])
        assert _until(lambda: all(c.done for c in chunks) and ex._in_flight_bytes == 0)
        assert {c.timing.layer: c.timing.end_s - OFFSET for c in chunks} == pytest.approx(ends, abs=1e-9)
        opt.step()
        before = len(compute.waited)
        ex.before_forward()  # no buffers: nothing to broadcast
        ex.module(x)         # the pre-hooks apply every layer: the compute stream waits for each event
        by_layer = {c.timing.layer: e for c, e in zip(order, events)}
        assert compute.waited[before:] == [by_layer[n] for n in names]  # in forward order, no host wait
        # and the update is the plain SGD one (world size 1)
        assert any(not torch.equal(p, r) for p, r in zip(model.parameters(), ref))
    finally:
        ex.remove()


@pytest.mark.distributed
def test_bytescheduler_timeline_row_waits_for_chunks_not_yet_issued(one_rank):
    """On CUDA ``step()`` returns while chunks are still waiting for the credit (not issued): a
    timeline row read then (``repro train`` reads them after each step) waits until its chunk has
    completed on the device, instead of coming back without ``start_s`` and ``end_s`` (seen on an
    H100: ``nan <= nan``)."""
    import threading

    model, names, dev, side, compute, ex = _bytescheduler_on_fake_cuda()
    try:
        opt = ex.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
        ex.before_forward()
        nn.functional.cross_entropy(ex.module(x), y).backward()
        ex.after_backward()
        opt.step()
        chunks = ex._chunks
        assert _until(lambda: sum(c.gen for c in chunks) == 1)  # one issued, two held back by the credit
        rows: list[dict] = []
        reader = threading.Thread(target=lambda: rows.extend(t.row(0.0) for t in ex.timings))
        reader.start()
        for k in range(3):
            assert _until(lambda: sum(c.gen for c in chunks) == k + 1)
            c = next(c for c in chunks if c.gen == 1 and not c.done)
            dev.now = 10.0 + k
            c.event.release(9.5 + k)
        reader.join(timeout=30)
        assert not reader.is_alive() and len(rows) == 3
        for row in rows:  # stamped, not NaN (start_s is the host's perf_counter, end_s the fake device's
            # clock + OFFSET: two bases, so no order between them; comparing them failed once uptime passed OFFSET)
            assert math.isfinite(row["start_s"]) and math.isfinite(row["end_s"]), row
        assert sorted(row["end_s"] - OFFSET for row in rows) == pytest.approx([9.5, 10.5, 11.5], abs=1e-9)
    finally:
        ex.remove()


def _dear_run(waits_factory, steps: int = 3):
    from repro.families.dear.planners import DEAR_MESSAGES
    from repro.core.plan import Bucket, Plan
    from repro.families.dear.executor import DeARExecutor
    from repro.runtime.executor import ExecutorOptions

    model = BNNet()
    plan = Plan([Bucket(("fc1", "bn"), DEAR_MESSAGES), Bucket(("fc2",), DEAR_MESSAGES), Bucket(("fc3",), DEAR_MESSAGES)],
                family="dear")
    ex = DeARExecutor(model, plan, ExecutorOptions(view="module"))
    if waits_factory is not None:
        ex._waits = waits_factory()
    opt = ex.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    gen = torch.Generator().manual_seed(3)
    try:
        for _ in range(steps):
            x, y = torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)
            opt.zero_grad()
            ex.before_forward()
            nn.functional.cross_entropy(ex.module(x), y).backward()
            ex.after_backward()
            opt.step()
        ex.flush()
    finally:
        ex.remove()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.distributed
def test_dear_consumes_every_collective_on_the_stream(one_rank, monkeypatch):
    """DeAR with the CUDA waits (a fake current stream): every all-gather, reduce-scatter and buffer
    broadcast is consumed by ``wait_event`` on the stream, ``Handle.wait`` (the host wait) is never
    called, and the result equals the host-waiting run exactly (on a CPU the enqueue wait is the
    completion, so the data are the same)."""
    from repro.runtime import collectives

    host = _dear_run(None)
    stream = FakeStream("compute")
    host_waits = []
    real_wait = collectives.Handle.wait

    def spy(self, timeout_s=None):
        host_waits.append(self.op)
        return real_wait(self, timeout_s)

    monkeypatch.setattr(collectives.Handle, "wait", spy)
    device = _dear_run(lambda: StreamWaits("cuda", current_stream=lambda: stream))
    assert host_waits == []
    # per step: 1 buffer broadcast per buffer dtype (2), 3 reduce-scatters, 3 all-gathers (the last
    # step's applied by the flush)
    assert len(stream.waited) == 3 * (2 + 3 + 3)
    assert all(torch.equal(host[n], device[n]) for n in host)


# ---------------------------------------------------------------------------------------------
# timelines on NCCL: device times, never the future that completes at enqueue (issue 32, items 3 and 4)
# ---------------------------------------------------------------------------------------------

class FakeNcclWork:
    """A collective as NCCL returns it: done at enqueue on the host. ``wait()`` is the stream wait
    (recorded with the stream current at the call); its future must not be used for a time."""

    def __init__(self, streams: list, current: list) -> None:
        self.streams, self.current = streams, current
        self.future = FakeFuture()

    def wait(self) -> None:
        self.streams.append(self.current[-1])

    def get_future(self):
        return self.future


class FakeFuture:
    """Records ``wait`` calls; ``then`` (a child future without CUDA events) is refused."""

    def __init__(self) -> None:
        self.waits = 0

    def wait(self):
        self.waits += 1

    def then(self, fn):
        raise AssertionError("a child future of then() carries no CUDA event: it is not a completion")


def _fake_nccl_ends(dev: FakeDevice):
    from repro.runtime.clock import CollectiveEnds

    compute, timing = FakeStream("compute"), FakeStream("timing")
    current = [compute]

    class StreamContext:
        def __init__(self, stream) -> None:
            self.stream = stream

        def __enter__(self):
            current.append(self.stream)

        def __exit__(self, *exc):
            current.pop()

    completions = EventCompletions("cuda", event_factory=lambda: FakeEvent(dev, auto=True),
                                   stream_factory=lambda: FakeStream("reference"), host_time=dev.host_time)
    ends = CollectiveEnds("cuda", "nccl", event_factory=lambda: FakeEvent(dev), side_stream=timing,
                          current_stream=lambda: current[-1], stream_context=StreamContext, completions=completions)
    return ends, compute, timing, current


def test_collective_ends_pick_device_times_on_nccl_only():
    from repro.runtime.clock import CollectiveEnds

    assert CollectiveEnds("cuda:1", "nccl").on_device
    assert not CollectiveEnds("cuda:1", "gloo").on_device  # gloo's futures complete when the work has
    assert not CollectiveEnds("cpu", "gloo").on_device


def test_collective_ends_on_nccl_are_the_devices_times_and_block_nothing():
    """launch: an event on the compute stream; end: the timing stream waits for the work and records an
    event there. Neither the host nor the compute stream waits; the stamps are the fake device's times,
    delivered once it got there (settle)."""
    dev = FakeDevice()
    ends, compute, timing, current = _fake_nccl_ends(dev)
    waited_on: list = []
    work = FakeNcclWork(waited_on, current)
    got: dict[str, float] = {}
    ends.launch(lambda t: got.__setitem__("launch", t))
    ends.end(work, lambda t: got.__setitem__("end", t))
    launch_ev, end_ev = [e for e in dev.events if not e.auto][-2:]
    assert launch_ev.recorded_on is compute and end_ev.recorded_on is timing
    assert waited_on == [timing] and compute.waited == [] and work.future.waits == 0
    time.sleep(0.1)
    assert got == {}  # nothing before the device got there
    dev.now = 5.0
    launch_ev.release(2.0)
    end_ev.release(4.25)
    ends.settle(timeout_s=10)
    assert got == pytest.approx({"launch": 2.0 + OFFSET, "end": 4.25 + OFFSET}, abs=1e-9)
    ends.close()


@pytest.mark.distributed
def test_sparse_finish_waits_for_the_all_gathers_own_futures(one_rank, monkeypatch):
    """The sparse family's timeline on NCCL: finish() waits for each all-gather's own future (on NCCL
    the current stream then waits for the collective); the old code waited on ``fut.then(...)``'s child,
    which carries no CUDA event, so the step could read the gathered buffers before they were filled.
    The message's end comes from the device (CollectiveEnds)."""
    import repro.families.sparse.executor as sparse

    dev = FakeDevice()
    ends, compute, timing, current = _fake_nccl_ends(dev)
    works: list[FakeNcclWork] = []
    waited_on: list = []

    def fake_all_gather(out, send, group=None, async_op=True):
        out.copy_(send.repeat(out.numel() // send.numel()))  # one rank: the gather is the input itself
        works.append(FakeNcclWork(waited_on, current))
        return works[-1]

    monkeypatch.setattr(sparse, "_ALL_GATHER", fake_all_gather)
    comm = sparse.AllGatherCommunicator(None, ends)
    message_ends: dict[int, float] = {}
    ex = comm.start(torch.tensor([1.5, -2.0]), torch.tensor([3, 7], dtype=torch.int32), packed=False,
                    on_message_end=lambda m, t: message_ends.__setitem__(m, t))
    assert len(works) == 2 and waited_on == [timing, timing] and compute.waited == []
    values, indices = comm.finish(ex)
    assert [w.future.waits for w in works] == [1, 1]  # the collectives' own futures, nothing else
    assert values.tolist() == [1.5, -2.0] and indices.tolist() == [3, 7]
    for k, e in enumerate([e for e in dev.events if not e.auto]):
        e.release(3.0 + k)
    dev.now = 9.0
    ends.settle(timeout_s=10)
    assert message_ends == pytest.approx({0: 3.0 + OFFSET, 1: 4.0 + OFFSET}, abs=1e-9)
    ends.close()
