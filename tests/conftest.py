import os

import pytest

# Keep test runs hermetic: no hub look-ups, caches in a throwaway place.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _hermetic_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.getbasetemp() / "hf_home"))
