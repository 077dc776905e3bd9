import os
import resource

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


# ---- --cpu-durations: which tests cost the most CPU time ---------------------------------------
# On a machine with fewer cores than busy processes the suite's wall time follows its CPU time,
# which a test's duration hides: a test may wait a minute on processes that use little.


def pytest_addoption(parser):
    parser.addoption(
        "--cpu-durations",
        type=int,
        default=None,
        metavar="N",
        help="show the N tests that used the most CPU time (0: all): the test's own process and "
        "every process it waited for, the commands forked for it included",
    )


def cpu_seconds() -> float:
    """CPU time of this process, of the children it has waited for, and of the commands its
    command servers forked (tests/cli.py)."""
    from tests.cli import CommandServer

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + CommandServer.cpu_s


CPU_AT_START = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[CPU_AT_START] = cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """The teardown report carries the test's CPU time (setup, call and teardown) as a user
    property, which pytest-xdist hands to the controller and --junitxml writes."""
    if call.when == "teardown" and CPU_AT_START in item.stash:
        item.user_properties.append(("cpu_s", round(cpu_seconds() - item.stash[CPU_AT_START], 2)))
    yield


def pytest_terminal_summary(terminalreporter, config):
    count = config.getoption("--cpu-durations")
    if count is None:
        return
    used = [
        (dict(report.user_properties)["cpu_s"], report.nodeid)
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "teardown" and "cpu_s" in dict(report.user_properties)
    ]
    used.sort(reverse=True)
    terminalreporter.write_sep(
        "=", f"{'all' if not count else count} tests by CPU time ({sum(c for c, _ in used):.0f} s in all)"
    )
    for seconds, nodeid in used[: count or None]:
        terminalreporter.write_line(f"{seconds:8.1f}s  {nodeid}")
