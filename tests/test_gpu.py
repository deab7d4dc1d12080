"""What one GPU can prove (``pytest -m gpu``; skipped where CUDA is not available, see tests/conftest.py).

``scripts/gpu_check.py`` runs these and writes docs/gpu_report.md. Every check runs one rank on
``cuda:0`` with an NCCL process group of world size 1 (an in-process FileStore):

- each executor (all-reduce, sparse at density 1, DeAR, ByteScheduler) trains as plain SGD does;
- gradient-ready times are CUDA-event times (issue 21, defect 2): positive, in the backward order,
  and the device's (the hooks return long before a heavy backward's kernels ran);
- the online warm-up's trace (SyncEASGD executor + synced phase stamps + measured_trace) on CUDA;
- ``repro.distribute`` on CUDA for mgwfbp, dear_threshold and bytescheduler (planning online needs
  two ranks, refused at one by design, so each gets its planner's Plan for a measured CUDA trace);
- autocast: a bfloat16 forward, and float16 with a GradScaler, through ``repro.distribute``.

The bodies are functions of ``(device, backend)`` so that the same code can be tried on a CPU with
gloo; the tests themselves run on CUDA only.
"""

from __future__ import annotations

import os

import contextlib
import copy
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.test_clock import LAYERS, MLP, _executor

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda", 0)
EXECUTORS = ["allreduce", "sparse", "dear", "bytescheduler"]
SCHEDULERS = ["mgwfbp", "dear_threshold", "bytescheduler"]


@contextlib.contextmanager
def one_rank(backend: str, device: torch.device, store_path):
    """A process group of world size 1 in this process (FileStore at ``store_path``)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = dist.FileStore(str(store_path), 1)
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, store=store, rank=0, world_size=1, **kwargs)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _batches(device: torch.device, steps: int, n: int = 8):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(n, 6, generator=g).to(device), torch.randint(0, 3, (n,), generator=g).to(device))
            for _ in range(steps)]


def _max_diff(a: nn.Module, b: nn.Module) -> float:
    return max(float((p.detach() - q.detach()).abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def _sgd(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


# ---------------------------------------------------------------------------------------------
# bodies (device, backend)
# ---------------------------------------------------------------------------------------------

def executor_matches_sgd(kind: str, device: torch.device) -> dict:
    """``kind``'s executor at world size 1 against plain SGD on the same batches."""
    from repro.runtime.clock import DeviceClock, HostClock

    torch.manual_seed(0)
    model = MLP().to(device)
    ref = copy.deepcopy(model)
    ex = _executor(kind, model, None, density=1.0)
    try:
        opt = ex.wrap_optimizer(_sgd(model.parameters()))
        ref_opt = _sgd(ref.parameters())
        ready = {}
        for x, y in _batches(device, 4):
            opt.zero_grad()
            ex.before_forward()
            nn.functional.cross_entropy(ex.module(x), y).backward()
            ex.after_backward()
            opt.step()
            ready = dict(ex.grad_ready_s)
            ref_opt.zero_grad()
            nn.functional.cross_entropy(ref(x), y).backward()
            ref_opt.step()
        ex.flush()
        clock = type(ex.clock)
        assert clock is (DeviceClock if device.type == "cuda" else HostClock), clock
        return {"diff": _max_diff(model, ref), "ready": ready}
    finally:
        ex.remove()


class Heavy(nn.Module):
    """Wide layers: a backward whose kernels run well after the host enqueued them."""

    def __init__(self, width: int, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def device_ready_times(device: torch.device, width: int = 4096, batch: int = 4096) -> dict:
    """A heavy MLP's backward through the all-reduce executor with its default clock: gradient-ready
    times relative to a synced backward start, the host times at which the hooks marked, and the
    synced backward's duration."""
    from repro.runtime.clock import make_clock

    torch.manual_seed(0)
    model = Heavy(width).to(device)
    clock = _HostStamps(make_clock(device))  # given to the executor: its hooks bind clock.mark when made
    marks = clock.host
    ex = _executor_for(model, [f"layers.{i}" for i in range(len(model.layers))][::-1], clock=clock)
    try:
        x = torch.randn(batch, width, device=device)
        for _ in range(3):  # the last one counts
            ex.before_forward()
            loss = ex.module(x).square().mean()
            _sync(device)
            backward_start = time.perf_counter()
            loss.backward()
            host_return = time.perf_counter()
            ex.after_backward()
            _sync(device)
            backward_end = time.perf_counter()
            ready = {k: v - backward_start for k, v in dict(ex.grad_ready_s).items()}
            host = {k: v - backward_start for k, v in marks.items()}
            for p in model.parameters():
                p.grad = None
        return {"ready": ready, "host": host, "backward_s": backward_end - backward_start,
                "host_return_s": host_return - backward_start}
    finally:
        ex.remove()


class _HostStamps:
    """A clock that also keeps the host time at which each mark was made (``host``), else ``clock``."""

    def __init__(self, clock) -> None:
        self._clock = clock
        self.host: dict[str, float] = {}

    def mark(self, key: str, host_s: float | None = None) -> None:
        self.host[key] = time.perf_counter()
        self._clock.mark(key, host_s)

    def __getattr__(self, name: str):
        return getattr(self._clock, name)


def _executor_for(model: nn.Module, backward_order: list[str], clock=None):
    from repro.core.plan import Plan
    from repro.families.allreduce.executor import AllReduceExecutor
    from repro.runtime.executor import ExecutorOptions

    return AllReduceExecutor(model, Plan.from_dict({"solver": "syncea", "buckets": [backward_order]}),
                             ExecutorOptions(view="module", clock=clock))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warmup_trace(device: torch.device, steps: int = 3, width: int = 2048):
    """The online warm-up as repro train runs it (SyncEASGD executor, phases stamped after a device
    sync, measured_trace) on a heavy MLP; and the profiler's trace of the same model."""
    from repro.runtime.online import StepTimes, measured_trace, sync_device
    from repro.workload.profile import profile_model

    torch.manual_seed(0)
    model = Heavy(width).to(device)
    names = [f"layers.{i}" for i in range(len(model.layers))]
    ex = _executor_for(model, names[::-1])
    opt = _sgd(model.parameters())
    x = torch.randn(width, width, device=device)
    measured = []
    try:
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            sync_device(device)
            t0 = time.perf_counter()
            ex.before_forward()
            sync_device(device)
            tf = time.perf_counter()
            loss = ex.module(x).square().mean()
            sync_device(device)
            tb = time.perf_counter()
            loss.backward()
            tw = time.perf_counter()
            ex.after_backward()
            sync_device(device)
            tu = time.perf_counter()
            opt.step()
            sync_device(device)
            measured.append((StepTimes(t0, tf, tb, tw, tu, time.perf_counter(), float(loss.detach())),
                             dict(ex.grad_ready_s)))
    finally:
        ex.remove()
    trace = measured_trace(model, measured, device, model_name="heavy", batch_size=width, view="module")
    profiled = profile_model(model, batch=(x, None), loss_fn=lambda m, xx, _y: m(xx).square().mean(),
                             view="module", warmup=2, iters=3)
    return trace, profiled


def _plan_for(scheduler: str, model: nn.Module, x, y):
    """``scheduler``'s planner on the model's trace measured here (CUDA events on a GPU), with a
    two-worker preset (planning at one worker is refused by design)."""
    from repro.costs.presets import preset
    from repro.core.planners import make_plan
    from repro.core.schedulers import get_scheduler
    from repro.workload.profile import profile_model

    trace = profile_model(model, batch=(x, y), loss_fn=nn.functional.cross_entropy, warmup=1, iters=2)
    cost = preset("10gbe-dear-derived" if scheduler.startswith("dear") else "10gbe-v100", 2)
    return make_plan(get_scheduler(scheduler).planner, trace, cost)


def distribute_matches_sgd(scheduler: str, device: torch.device, steps: int = 5) -> dict:
    import repro

    data = _batches(device, steps)
    torch.manual_seed(0)
    net = MLP().to(device)
    ref = copy.deepcopy(net)
    plan = _plan_for(scheduler, net, *data[0])
    model, dopt = repro.distribute(net, _sgd(net.parameters()), scheduler=plan)
    ref_opt = _sgd(ref.parameters())
    try:
        for x, y in data:
            dopt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            dopt.step()
            ref_opt.zero_grad()
            nn.functional.cross_entropy(ref(x), y).backward()
            ref_opt.step()
        dopt.flush()
        return {"diff": _max_diff(net, ref), "family": dopt.plan.family, "buckets": dopt.plan.num_buckets}
    finally:
        dopt.remove()


def amp_through_distribute(scheduler: str, device: torch.device, dtype: torch.dtype, steps: int = 6,
                           inf_step: int | None = None) -> dict:
    """autocast(``dtype``) forward; float16 with a GradScaler (an inf loss at ``inf_step``: skipped),
    bfloat16 without. Against the same loop without repro."""
    import repro

    data = _batches(device, steps)
    torch.manual_seed(0)
    net = MLP().to(device)
    ref = copy.deepcopy(net)
    plan = _plan_for(scheduler, net, *data[0])
    scaled = dtype == torch.float16

    def new_scaler():
        return torch.amp.GradScaler(device.type, init_scale=2.0 ** 12, growth_interval=2) if scaled else None

    def loop(model, opt, scaler) -> list[float]:
        scales = []
        for i, (x, y) in enumerate(data):
            opt.zero_grad()
            with torch.autocast(device.type, dtype=dtype):
                loss = nn.functional.cross_entropy(model(x), y)
            if i == inf_step:
                loss = loss * float("inf")
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                scales.append(float(scaler.get_scale()))
        return scales

    scaler = new_scaler()
    model, dopt = repro.distribute(net, _sgd(net.parameters()), scheduler=plan, grad_scaler=scaler)
    try:
        scales = loop(model, dopt, scaler)
        dopt.flush()
    finally:
        dopt.remove()
    ref_scales = loop(ref, _sgd(ref.parameters()), new_scaler())
    finite = all(bool(torch.isfinite(p).all()) for p in net.parameters())
    return {"diff": _max_diff(net, ref), "scales": scales, "ref_scales": ref_scales, "finite": finite}


# ---------------------------------------------------------------------------------------------
# the tests (CUDA, NCCL)
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def nccl(tmp_path):
    with one_rank("nccl", CUDA, tmp_path / "store"):
        yield


@pytest.mark.distributed
@pytest.mark.parametrize("kind", EXECUTORS)
def test_executor_on_nccl_equals_local_sgd(nccl, kind):
    out = executor_matches_sgd(kind, CUDA)
    assert out["diff"] < 1e-5, out["diff"]
    assert set(out["ready"]) == set(LAYERS)
    assert out["ready"]["fc3"] <= out["ready"]["fc2"] <= out["ready"]["fc1"]  # backward order


@pytest.mark.distributed
def test_gradient_ready_times_are_the_devices(nccl):
    if os.environ.get("TORCH_CUDA_SANITIZER"):  # its instrumentation stretches device time past the host's
        pytest.skip("device timings are not the device's under TORCH_CUDA_SANITIZER (scripts/gpu_check.py part 2)")
    out = device_ready_times(CUDA)
    ready, host = out["ready"], out["host"]
    backward = [f"layers.{i}" for i in range(4)][::-1]
    assert list(sorted(ready, key=ready.get)) == backward  # the backward order
    assert all(t > 0 for t in ready.values())
    # on the device the last gradient is ready when the backward is done, long after the host marked it
    last = ready[backward[-1]]
    assert 0.5 * out["backward_s"] <= last <= out["backward_s"] + 1e-3, (last, out)
    assert last - host[backward[-1]] > 0.25 * out["backward_s"], (ready, host, out)
    gaps = [ready[b] - ready[a] for a, b in zip(backward, backward[1:])]
    assert all(g > 0 for g in gaps), gaps


@pytest.mark.distributed
def test_online_warmup_trace_is_measured_on_the_device(nccl):
    trace, profiled = warmup_trace(CUDA)
    assert trace.names == [f"layers.{i}" for i in range(4)]
    assert all(layer.backward_s > 0 for layer in trace.layers)
    assert trace.total_forward_s > 0
    # the profiler (CUDA events as well) sees the same backward, within a generous factor
    ratio = trace.total_backward_s / profiled.total_backward_s
    assert 0.25 < ratio < 4, (trace.total_backward_s, profiled.total_backward_s)


@pytest.mark.distributed
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_distribute_on_cuda_equals_local_sgd(nccl, scheduler):
    out = distribute_matches_sgd(scheduler, CUDA)
    assert out["diff"] < 1e-5, out


@pytest.mark.distributed
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_distribute_with_autocast_bfloat16(nccl, scheduler):
    out = amp_through_distribute(scheduler, CUDA, torch.bfloat16)
    assert out["finite"] and out["diff"] < 1e-4, out


@pytest.mark.distributed
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_distribute_with_float16_and_grad_scaler(nccl, scheduler):
    out = amp_through_distribute(scheduler, CUDA, torch.float16, inf_step=2)
    assert out["finite"] and out["diff"] < 1e-4, out
    assert out["scales"] == out["ref_scales"]
    assert out["scales"][2] < out["scales"][1]  # the inf step was skipped and the scale backed off


# ---------------------------------------------------------------------------------------------
# DeAR and ByteScheduler on their CUDA-event paths (issue 21, defects 3, 4 and 7)
# ---------------------------------------------------------------------------------------------

def event_path_matches_sgd(kind: str, device: torch.device, steps: int = 4) -> dict:
    """``kind`` ("dear" or "bytescheduler") on a model with BatchNorm (the buffer broadcast goes
    through the communication thread), with the timeline recorded, against plain SGD: parameters,
    buffers, which wait/completion path ran, and the last step's message times."""
    from repro.core.plan import Bucket, Message, Plan
    from repro.families.dear.planners import DEAR_MESSAGES
    from repro.families.bytescheduler.executor import ByteSchedulerExecutor, CudaComm
    from repro.runtime.clock import StreamWaits
    from repro.families.dear.executor import DeARExecutor
    from repro.runtime.executor import ExecutorOptions
    from tests.test_comm_order import BNNet

    model = BNNet().to(device)
    ref = copy.deepcopy(model)
    options = ExecutorOptions(view="module", record_timeline=True)
    if kind == "dear":
        plan = Plan([Bucket(("fc1", "bn"), DEAR_MESSAGES), Bucket(("fc2", "fc3"), DEAR_MESSAGES)], family="dear")
        ex = DeARExecutor(model, plan, options)
        path = isinstance(ex._waits, StreamWaits)
    else:
        names = ["fc1", "bn", "fc2", "fc3"]
        plan = Plan([Bucket((n,), (Message("allreduce", "backward", float(i)),)) for i, n in enumerate(names)],
                    "bytescheduler", family="bytescheduler", options={"credit_bytes": 1})  # one chunk in flight
        ex = ByteSchedulerExecutor(model, plan, options)
        path = isinstance(ex._comm, CudaComm)
    try:
        opt = ex.wrap_optimizer(_sgd(model.parameters()))
        ref_opt = _sgd(ref.parameters())
        for x, y in _batches(device, steps):
            opt.zero_grad()
            ex.before_forward()
            nn.functional.cross_entropy(ex.module(x), y).backward()
            ex.after_backward()
            opt.step()
            rows = [t.row(0.0) for t in ex.timings]
            ref_opt.zero_grad()
            nn.functional.cross_entropy(ref(x), y).backward()
            ref_opt.step()
        ex.flush()
        buffers = max(float((a.double() - b.double()).abs().max()) for a, b in zip(model.buffers(), ref.buffers()))
        return {"diff": _max_diff(model, ref), "buffers": buffers, "event_path": path, "rows": rows}
    finally:
        ex.remove()


@pytest.mark.distributed
@pytest.mark.parametrize("kind", ["dear", "bytescheduler"])
def test_event_paths_on_nccl_equal_local_sgd(nccl, kind):
    out = event_path_matches_sgd(kind, CUDA)
    assert out["event_path"], "the CUDA path (stream waits / device completions) was not taken"
    # the same kernels in the same order on one device (world size 1: sums and broadcasts of one rank
    # are copies); 1e-5 as test_executor_on_nccl_equals_local_sgd, for any reordering of the updates
    assert out["diff"] < 1e-5 and out["buffers"] < 1e-5, out
    start = "start_s" if kind == "bytescheduler" else "launch_s"
    for row in out["rows"]:  # every message of the last step completed after it was launched
        assert row[start] <= row["end_s"], row


def timeline_behind_busy_device(device: torch.device, busy_s: float = 0.05) -> dict:
    """The all-reduce and sparse executors' timelines when the device is ``busy_s`` seconds behind the
    host: a ``torch.cuda._sleep`` queued before the backward, so every collective runs long after the
    host issued it. Returns, per executor, the bucket's launch and end (device times on NCCL,
    :class:`~repro.runtime.clock.CollectiveEnds`) and the host's time when it issued the step, all
    relative to the step start (seconds)."""
    from repro.core.plan import Plan
    from repro.families.allreduce.executor import AllReduceExecutor
    from repro.runtime.executor import ExecutorOptions
    from repro.families.sparse.executor import SparseExecutor

    out = {}
    for kind in ("allreduce", "sparse"):
        torch.manual_seed(0)
        model = MLP().to(device)
        layers = list(LAYERS)[::-1]
        opts = ExecutorOptions(view="module", record_timeline=True)
        if kind == "allreduce":
            plan = Plan.from_dict({"solver": "syncea", "buckets": [layers]})
            ex = AllReduceExecutor(model, plan, opts, engine="hooks")
        else:
            plan = Plan.from_dict({"family": "sparse", "solver": "t", "options": {"density": 1.0},
                                   "buckets": [{"layers": layers, "messages": [
                                       {"collective": "sparse_allgather", "phase": "backward"}]}]})
            ex = SparseExecutor(model, plan, opts)
        opt = ex.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
        x, y = _batches(device, 1)[0]
        for _ in range(2):
            opt.zero_grad()
            _sync(device)
            t0 = time.perf_counter()
            ex.before_forward()
            loss = nn.functional.cross_entropy(ex.module(x), y)
            torch.cuda._sleep(int(busy_s * 1.9e9))  # ~busy_s of device time before the backward's kernels
            loss.backward()
            ex.after_backward()
            opt.step()
            issued = time.perf_counter() - t0
            _sync(device)
        ex.settle_timings()
        t = ex.timings[0]
        out[kind] = {"launch_s": t.launch_s - t0, "end_s": t.end_s - t0, "issued_s": issued,
                     "step_s": time.perf_counter() - t0}
        ex.remove()
    return out


@pytest.mark.distributed
def test_timelines_on_nccl_are_the_devices_times(nccl):
    """Issue 32, items 3-4: on NCCL a collective's future completes at enqueue; the timeline's end must
    be when the device finished it, after the queued sleep, not when the host issued it."""
    if os.environ.get("TORCH_CUDA_SANITIZER"):
        pytest.skip("device timings are not the device's under TORCH_CUDA_SANITIZER")
    out = timeline_behind_busy_device(CUDA)
    # the device reached the bucket after the ~50 ms sleep; the host long before. Each stamp is resolved
    # against its own reference event, so two stamps of one instant differ by up to ~0.1 ms (an H200:
    # launch 48.70 ms, end 48.61 ms for a world-1 all-reduce that takes microseconds)
    for kind, r in out.items():
        assert 0.03 < r["launch_s"] <= r["end_s"] + 1e-3 and r["end_s"] <= r["step_s"] + 1e-3, (kind, r)
    # the all-reduce executor's host ran ahead (issued the step in 2.5 ms on an H200), so its stamps are not
    # host times; the sparse family's host waits for the device somewhere in its step (51 ms there)
    assert out["allreduce"]["issued_s"] < 0.02, out
