import os

import pytest

# Keep test runs hermetic: no hub look-ups, caches in a throwaway place.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# One intra-op thread per process (set before torch is imported; every process a test starts
# inherits it). There is at least one pytest worker per core already, and each test starts learners and
# env workers of its own: with torch's default of one thread per core, the threads outnumber the
# cores several times over, and tiny-tensor work slowed down about fivefold under that contention.
# A test that needs more threads sets runtime.torch_threads.
os.environ.setdefault("OMP_NUM_THREADS", "1")


# Each worker's tests start env workers, learners and CLI runs of their own: beyond 4 workers
# they would only compete for memory.
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker more than the cores this process may run on (its CPU affinity, not
    the host's core count), at most MAX_WORKERS. With one worker per core, a whole run on two
    cores kept only 1.4 of them busy on average (every Python process's CPU time, logged at
    exit): tests spend much of their time waiting on the processes, sockets and deadlines they
    test. A third worker runs while the other two wait."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, usable + 1))


def pytest_collection_modifyitems(config, items):
    """Files with learning regressions first, then those with the most slow tests: pytest-xdist
    hands out whole files in this order (`--dist loadfile --no-loadscope-reorder`; without the
    latter it would hand out the files with the most tests first), so the long ones start early and
    the run does not end with one worker busy on a long file while the others wait. Within a
    file the order stays as written."""
    weight = {}
    for item in items:
        learning, slow = weight.get(item.fspath, (0, 0))
        weight[item.fspath] = (
            learning + (item.get_closest_marker("learning") is not None),
            slow + (item.get_closest_marker("slow") is not None),
        )
    rank = {path: index for index, path in enumerate(dict.fromkeys(item.fspath for item in items))}
    items.sort(key=lambda item: (-weight[item.fspath][0], -weight[item.fspath][1], rank[item.fspath]))


@pytest.fixture(autouse=True)
def _hermetic_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.getbasetemp() / "hf_home"))
