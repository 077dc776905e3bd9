"""The peak memory in use on the GPU while a run goes on, whichever processes hold it: what
placement.py and openvla_real_size.py (and the GPU campaign through them) report."""

from __future__ import annotations

import threading

import torch


class DeviceMemory:
    """The peak memory in use on the GPU, whoever holds it, sampled while a run goes on."""

    def __init__(self) -> None:
        self.available = torch.cuda.is_available()
        self.baseline = self._used() if self.available else 0
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _used(self) -> int:
        free, total = torch.cuda.mem_get_info()
        return total - free

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, self._used())

    def __enter__(self) -> "DeviceMemory":
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.available:
            self._thread.join()

    @property
    def peak_gb(self) -> float | None:
        return (self.peak - self.baseline) / 1e9 if self.available else None
