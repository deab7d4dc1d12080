import contextlib
import os
import sys

import numpy as np
import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _cuda_available() -> bool:
    """torch.cuda.is_available(), importing torch only when asked (i.e. when a gpu test was collected)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


#: files whose tests time things against the wall clock (hang detection within N seconds, planning
#: budgets, measured speed) or change the machine's network (namespaces): `make test` runs them after
#: the others, alone, not beside another test (``serial``)
SERIAL_FILES = {"test_launch.py", "test_runtime_ps.py", "test_collectives.py", "test_profile.py",
                "test_exact_planner_budget.py", "test_netem.py", "test_gallery.py"}


def pytest_itemcollected(item):
    """Mark ``serial`` (at collection, so that ``-m`` sees it) the tests that must not share the machine
    with another test: see SERIAL_FILES, and every ``netns`` test."""
    if item.path.name in SERIAL_FILES or item.get_closest_marker("netns") is not None:
        item.add_marker(pytest.mark.serial)


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: `-m "not gpu"` never imports torch here
def pytest_collection_modifyitems(config, items):
    """Skip the tests marked ``gpu`` where CUDA is not available (torch is imported only if there are some)."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)


@contextlib.contextmanager
def _no_ranks_unless_marked(item):
    """A test not marked ``distributed`` may not start multiprocessing processes or a torch process group.

    Keeps the markers honest: such a test would run in ``make test-fast`` (the unit tier) and start
    ranks there. Starting one raises with what to add. (Processes started through ``subprocess``, such
    as ``repro launch`` or git, are not seen here.)
    """
    if item.get_closest_marker("distributed") is not None:
        yield
        return
    import multiprocessing.process as mp_process

    def refuse(what):
        raise RuntimeError(f"{item.nodeid} {what} but is not marked distributed: add @pytest.mark.distributed "
                           "(or pytestmark = pytest.mark.distributed) so the unit tier leaves it out")

    def start(self):
        refuse(f"starts a process ({self.name})")

    def init_process_group(*args, **kwargs):
        refuse("starts a torch process group")

    saved = [(mp_process.BaseProcess, "start", mp_process.BaseProcess.start)]
    mp_process.BaseProcess.start = start
    dist = sys.modules.get("torch.distributed")  # never imported here: only patched where already loaded
    if dist is not None and hasattr(dist, "init_process_group"):
        for module in (dist, sys.modules.get("torch.distributed.distributed_c10d")):
            if module is not None and hasattr(module, "init_process_group"):
                saved.append((module, "init_process_group", module.init_process_group))
                module.init_process_group = init_process_group
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _no_ranks_unless_marked(item):  # module fixtures that launch ranks are set up here
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _no_ranks_unless_marked(item):
        return (yield)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def one_rank():
    """A one-rank gloo process group in this process (a HashStore: no ports), for tests that drive an
    executor alone; the test must be marked ``distributed`` (it starts a process group)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
