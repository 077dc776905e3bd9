"""What every role's process does first, and the random state a checkpoint keeps."""

from __future__ import annotations

import faulthandler
import random
import sys
from typing import Any

import numpy as np
import torch


def start_process(seed: int, torch_threads: int | None) -> None:
    """torch's thread count, and Python's, numpy's and torch's generators seeded with the
    run seed. A crash in native code (a simulator, a renderer) writes every thread's Python
    stack to stderr, so a run that dies of a signal says where."""
    if sys.__stderr__ is not None:  # the process's own stream: a replaced sys.stderr may have no file
        faulthandler.enable(file=sys.__stderr__, all_threads=True)
    if torch_threads:
        torch.set_num_threads(torch_threads)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def get_rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
