"""Cameras through OpenCV: a background thread keeps only the latest frame, so a control loop
reads it without waiting for the device, with the time it was captured.

`source` is a device index (USB/V4L2 camera), a device path or a video file; frames come out
RGB uint8, center-cropped to the policy's aspect ratio and resized to its input size."""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from embodied.core.errors import EmbodiedError

logger = logging.getLogger(__name__)


class CameraError(EmbodiedError):
    """A camera that cannot be opened or stopped delivering frames."""


def fit_image(frame: np.ndarray, size: tuple[int, int] | None) -> np.ndarray:
    """Center-crop `frame` (H, W, 3) to the aspect ratio of `size` (height, width), then
    resize to it; no-op for `size=None`."""
    if size is None or tuple(frame.shape[:2]) == tuple(size):
        return frame
    import cv2

    height, width = frame.shape[:2]
    target_h, target_w = size
    scale = min(height / target_h, width / target_w)
    crop_h, crop_w = int(round(target_h * scale)), int(round(target_w * scale))
    top, left = (height - crop_h) // 2, (width - crop_w) // 2
    cropped = frame[top : top + crop_h, left : left + crop_w]
    shrinking = crop_h > target_h
    return cv2.resize(cropped, (target_w, target_h), interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR)


class Camera(ABC):
    """What a robot reads images from: the newest frame, RGB uint8 at the policy's size."""

    name: str

    @abstractmethod
    def connect(self) -> None: ...

    @abstractmethod
    def read_latest(self, max_age_s: float = 1.0) -> tuple[np.ndarray, float]:
        """(frame, capture time on time.monotonic()); a frame older than `max_age_s` is an error."""

    @abstractmethod
    def disconnect(self) -> None: ...


@dataclass
class CameraConfig:
    source: Union[int, str] = 0  # device index, /dev/videoN or a video file
    size: Optional[list[int]] = None  # (height, width) the policy expects; None: as captured
    fps: Optional[float] = None  # ask the device for this rate
    loop: bool = False  # a video file starts over at its end (demos)


class OpenCVCamera(Camera):
    def __init__(self, config: CameraConfig, name: str = "camera"):
        self.config = config
        self.name = name
        self._capture = None
        self._frame: np.ndarray | None = None
        self._timestamp = 0.0
        self._frames = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: str | None = None

    def connect(self, timeout_s: float = 5.0) -> None:
        import cv2

        capture = cv2.VideoCapture(self.config.source)
        if not capture.isOpened():
            raise CameraError(f"camera '{self.name}': OpenCV cannot open {self.config.source!r}")
        if self.config.fps:
            capture.set(cv2.CAP_PROP_FPS, self.config.fps)
        self._capture = capture
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"camera-{self.name}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while self._frame is None:
            if self._error or time.monotonic() > deadline:
                self.disconnect()
                raise CameraError(
                    f"camera '{self.name}' gave no frame within {timeout_s:.0f} s: {self._error or 'silent'}"
                )
            time.sleep(0.005)

    def _run(self) -> None:
        import cv2

        assert self._capture is not None
        period = 1.0 / self.config.fps if self.config.fps else 0.0
        while not self._stop.is_set():
            ok, frame = self._capture.read()
            if not ok and self.config.loop:
                self._capture.set(cv2.CAP_PROP_POS_FRAMES, 0)
                ok, frame = self._capture.read()
            if not ok:
                self._error = f"{self.config.source!r} stopped delivering frames"
                return
            image = fit_image(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB), self.config.size)
            with self._lock:
                self._frame, self._timestamp = image, time.monotonic()
                self._frames += 1
            if period:  # a file would otherwise be read as fast as it decodes
                time.sleep(period)

    def read_latest(self, max_age_s: float = 1.0) -> tuple[np.ndarray, float]:
        with self._lock:
            frame, timestamp = self._frame, self._timestamp
        if frame is None:
            raise CameraError(f"camera '{self.name}' is not connected")
        age = time.monotonic() - timestamp
        if age > max_age_s:
            raise CameraError(f"camera '{self.name}': the newest frame is {age:.2f} s old ({self._error or 'stalled'})")
        return frame, timestamp

    @property
    def frames_captured(self) -> int:
        return self._frames

    def disconnect(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
        if self._capture is not None:
            self._capture.release()
            self._capture = None
        self._frame = None
