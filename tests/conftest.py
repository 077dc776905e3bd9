import os

import pytest

# Keep test runs hermetic: no hub look-ups, caches in a throwaway place.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


# Each worker's tests start env workers, learners and CLI runs of their own: beyond 4 workers
# they would only compete for memory.
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core this process may run on (its CPU affinity, not the host's
    core count), at most MAX_WORKERS."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, usable))


@pytest.fixture(autouse=True)
def _hermetic_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.getbasetemp() / "hf_home"))
