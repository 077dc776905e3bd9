"""Recording a robot's episodes as a LeRobotDataset v3, from the robot client.

`DatasetRecorder` (no torch here) hands frames to a writer process (`embodied.robots.dataset_writer`)
over a pipe: length-prefixed msgpack, arrays as raw bytes. Each frame holds

    observation.state          float32 (S,)
    observation.images.<cam>   uint8 (H, W, 3), as images or video
    action                     float32 (A,)  the action the robot executed (after safety)
    policy_action              float32 (A,)  the policy's action that tick; NaN where it had none
    intervention               bool (1,)     the operator's action replaced the policy's
    safety_override            bool (1,)     the safety layer's own action (watchdog, e-stop, workspace stop)
    next.reward                float32 (1,)  the robot's reward for the step
    next.success               bool (1,)     the episode succeeded (the operator's label wins)
    next.done                  bool (1,)     the episode's last frame
    next.terminated            bool (1,)     the last frame ended the task (the env's termination or the
                                             operator's label), not a time limit or a stop
    task                       the instruction

An episode is saved (and finalized, so it survives any later crash) when it ends, discarded
when the operator asks to record it again. Frames leave through a sender thread with a
bounded queue, so a tick waits for the writer only when it has fallen `queue_frames` behind;
requests (save, discard, close) wait for the writer's answer at most `timeout_s`."""

from __future__ import annotations

import logging
import os
import queue
import select
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, BinaryIO, Optional

import msgpack
import numpy as np

from embodied.core.errors import EmbodiedError
from embodied.core.paths import checkout_root
from embodied.core.types import EnvSpec

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 1 << 30
PARTIAL_MODES = ("keep", "discard")


class RecordingError(EmbodiedError):
    """The dataset could not be written (the writer failed, or refused a request)."""


@dataclass
class RecordingConfig:
    dataset: Optional[str] = None  # the dataset's folder (None: no recording); an existing dataset gets more episodes
    repo_id: str = "local/robot"  # the dataset's name in its metadata
    use_videos: bool = False  # camera frames as video (smaller) or as images (exact)
    partial: str = "discard"  # the episode in progress when a run dies: keep | discard
    python: Optional[str] = None  # an interpreter with the dataset library; default: writer_python()
    timeout_s: float = 120.0  # for the writer to answer (open, save an episode, finalize)
    queue_frames: int = 256  # frames waiting for the writer before the control loop has to wait
    # Saved episodes per finalize. 1: each is durable at once. More is faster for long recordings
    # (the dataset library reloads the whole dataset to take episodes after a finalize); if the
    # writer process itself is killed, the episodes since the last finalize are lost. A client
    # that crashes loses nothing saved either way: the writer finalizes on its own.
    finalize_every: int = 1


class WriterRequest(str, Enum):
    OPEN = "open"
    FRAME = "frame"
    SAVE = "save"
    DISCARD = "discard"
    CLOSE = "close"


# ---- wire format (shared with the writer) -----------------------------------------------------
def array_to_wire(array: np.ndarray) -> dict[str, Any]:
    array = np.ascontiguousarray(array)
    return {"dtype": array.dtype.str, "shape": list(array.shape), "data": array.tobytes()}


def array_from_wire(value: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(value["data"], dtype=np.dtype(value["dtype"])).reshape(value["shape"]).copy()


def write_message(stream: BinaryIO, message: dict[str, Any]) -> None:
    payload = msgpack.packb(message, use_bin_type=True)
    stream.write(struct.pack("<I", len(payload)) + payload)
    stream.flush()


def read_message(stream: BinaryIO) -> dict[str, Any] | None:
    """The next message, or None at the end of the stream (also mid-message: a writer or
    client that died while sending)."""
    header = stream.read(4)
    if len(header) < 4:
        return None
    (size,) = struct.unpack("<I", header)
    if size > MAX_MESSAGE_BYTES:
        raise RecordingError(f"a {size}-byte message on the recording pipe: the stream is corrupt")
    payload = stream.read(size)
    if len(payload) < size:
        return None
    message = msgpack.unpackb(payload, raw=False)
    if not isinstance(message, dict):
        raise RecordingError("a message on the recording pipe is not a map")
    return message


def dataset_features(spec: dict[str, Any], use_videos: bool) -> dict[str, dict[str, Any]]:
    """The dataset's features for a robot with this spec (`EnvSpec.to_dict()`)."""
    state_dim, action_dim = int(spec["state_dim"]), int(spec["action_dim"])
    features: dict[str, dict[str, Any]] = {
        "observation.state": {"dtype": "float32", "shape": (state_dim,), "names": None},
        "action": {"dtype": "float32", "shape": (action_dim,), "names": None},
        "policy_action": {"dtype": "float32", "shape": (action_dim,), "names": None},
        "intervention": {"dtype": "bool", "shape": (1,), "names": None},
        "safety_override": {"dtype": "bool", "shape": (1,), "names": None},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.success": {"dtype": "bool", "shape": (1,), "names": None},
        "next.done": {"dtype": "bool", "shape": (1,), "names": None},
        "next.terminated": {"dtype": "bool", "shape": (1,), "names": None},
    }
    for camera, shape in dict(spec.get("image_shapes") or {}).items():
        features[f"observation.images.{camera}"] = {
            "dtype": "video" if use_videos else "image",
            "shape": tuple(shape),
            "names": ["height", "width", "channel"],
        }
    return features


# ---- the client's side ------------------------------------------------------------------------


def writer_python(config: RecordingConfig) -> str:
    """The writer's interpreter: `record.python`, else the dataset virtualenv tools/setup.sh
    makes, else this one (where the dataset library is installed beside the client)."""
    if config.python:
        if not Path(config.python).is_file():
            raise RecordingError(f"record.python={config.python} does not exist")
        return config.python
    checkout = checkout_root()
    dataset_python = checkout / ".venv-dataset" / "bin" / "python" if checkout is not None else None
    return str(dataset_python) if dataset_python is not None and dataset_python.is_file() else sys.executable


class DatasetRecorder:
    """Writes episodes through a writer process. Frames of the episode in progress are held
    here until it ends: the label that ends an episode (success, failure) belongs on its
    last frame."""

    def __init__(self, config: RecordingConfig, spec: EnvSpec, fps: float, instruction: str):
        if config.partial not in PARTIAL_MODES:
            raise RecordingError(f"recording.partial must be one of {PARTIAL_MODES}, got '{config.partial}'")
        if config.finalize_every < 1:
            raise RecordingError(f"recording.finalize_every must be >= 1, got {config.finalize_every}")
        if fps <= 0 or abs(fps - round(fps)) > 1e-6:
            raise RecordingError(f"a dataset needs a whole number of frames per second; the control rate is {fps}")
        self.config = config
        self.spec = spec
        self.instruction = instruction or ""
        if not config.dataset:
            raise RecordingError("recording needs record.dataset=<dataset folder>")
        self.root = Path(config.dataset).expanduser().resolve()
        self.fps = int(round(fps))
        self.pending: dict[str, Any] | None = None  # the last frame, sent once we know if it ends the episode
        self.frames = 0
        self.saved: list[int] = []  # episode indices written by this recorder
        self.process: subprocess.Popen | None = None
        self.opened = False
        # A request interrupted mid-way (Ctrl-C) leaves an answer unread: no more requests
        # then; closing the pipe lets the writer finish on its own.
        self.broken = False
        self.waits = 0  # frames that found the queue full (the writer fell behind)
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=config.queue_frames)
        self._sender: threading.Thread | None = None
        self._send_error: BaseException | None = None

    def open(self) -> int:
        """Start the writer and open (or create) the dataset; returns its episode count."""
        command = [writer_python(self.config), "-m", "embodied.robots.dataset_writer"]
        environment = {**os.environ, "HF_HUB_OFFLINE": "1"}  # a local dataset: never ask a hub
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=environment, start_new_session=True
        )  # Ctrl-C is the client's to handle
        self._sender = threading.Thread(
            target=self._send_loop, args=(self.process.stdin,), name="dataset-sender", daemon=True
        )
        self._sender.start()
        reply = self._ask(
            {
                "kind": WriterRequest.OPEN.value,
                "root": str(self.root),
                "repo_id": self.config.repo_id,
                "fps": self.fps,
                "spec": self.spec.to_dict(),
                "use_videos": self.config.use_videos,
                "partial": self.config.partial,
                "finalize_every": self.config.finalize_every,
            }
        )
        self.opened = True
        logger.info("recording into %s (%d episodes there already)", self.root, reply["episodes"])
        return int(reply["episodes"])

    def add(
        self,
        state: np.ndarray,
        images: dict[str, np.ndarray],
        action: np.ndarray,
        policy_action: np.ndarray | None,
        intervention: bool,
        reward: float,
        safety_override: bool = False,
    ) -> None:
        """One executed step. Shapes are checked here, where the error is clearest."""
        state = np.asarray(state, np.float32).reshape(-1)
        action = np.asarray(action, np.float32).reshape(-1)
        if state.shape != (self.spec.state_dim,) or action.shape != (self.spec.action_dim,):
            raise RecordingError(
                f"a frame with state {state.shape} and action {action.shape}; the robot's spec "
                f"says ({self.spec.state_dim},) and ({self.spec.action_dim},)"
            )
        if set(images) != set(self.spec.image_shapes):
            raise RecordingError(
                f"a frame with cameras {sorted(images)}; the robot's spec has {sorted(self.spec.image_shapes)}"
            )
        frame: dict[str, Any] = {
            "observation.state": array_to_wire(state),
            "action": array_to_wire(action),
            "policy_action": array_to_wire(
                np.full(self.spec.action_dim, np.nan, np.float32)
                if policy_action is None
                else np.asarray(policy_action, np.float32).reshape(-1)
            ),
            "intervention": array_to_wire(np.array([bool(intervention)])),
            "safety_override": array_to_wire(np.array([bool(safety_override)])),
            "next.reward": array_to_wire(np.array([reward], np.float32)),
            "task": self.instruction,
        }
        for camera, image in images.items():
            if tuple(image.shape) != tuple(self.spec.image_shapes[camera]) or image.dtype != np.uint8:
                raise RecordingError(
                    f"camera '{camera}' gave {image.dtype}{tuple(image.shape)}; the robot's spec "
                    f"says uint8{tuple(self.spec.image_shapes[camera])}"
                )
            frame[f"observation.images.{camera}"] = array_to_wire(image)
        self._flush(done=False, success=False, terminated=False)
        self.pending = frame

    def end_episode(self, success: bool, keep: bool = True, terminated: bool = False) -> int | None:
        """Save the episode (its last frame marked done, with `success` and `terminated`) or, with
        `keep` False, discard it. Returns the saved episode's index. `terminated`: the episode
        ended the task; an episode cut off by a time limit or a stop is not (its last frame has no
        next state to learn from)."""
        if self.pending is None and self.frames == 0:
            return None
        if not keep:
            self.pending, self.frames = None, 0
            self._ask({"kind": WriterRequest.DISCARD.value})
            return None
        self._flush(done=True, success=success, terminated=terminated)
        self.frames = 0
        index = int(self._ask({"kind": WriterRequest.SAVE.value})["episode_index"])
        self.saved.append(index)
        return index

    def close(self) -> None:
        """Finalize the dataset; the episode in progress is left to `recording.partial`."""
        if self.process is None:
            return
        try:
            unfinished = self.pending is not None or self.frames > 0
            if self.opened and not self.broken:
                if unfinished and self.config.partial == "keep":
                    self.end_episode(success=False)
                elif unfinished:
                    logger.info("discarding the unfinished episode (record.partial=discard)")
                self._ask({"kind": WriterRequest.CLOSE.value})
            elif unfinished and self.config.partial == "keep":
                self._flush(done=True, success=False, terminated=False)  # the writer keeps it when the pipe closes
        finally:
            self._stop_writer()

    def _flush(self, done: bool, success: bool, terminated: bool) -> None:
        if self.pending is None:
            return
        frame = {
            **self.pending,
            "next.done": array_to_wire(np.array([done])),
            "next.success": array_to_wire(np.array([success and done])),
            "next.terminated": array_to_wire(np.array([terminated and done])),
        }
        self.pending = None
        self._send({"kind": WriterRequest.FRAME.value, "frame": frame})
        self.frames += 1

    # ---- the pipe ----------------------------------------------------------------------------
    def _send_loop(self, pipe: BinaryIO) -> None:
        """The only writer of the pipe: messages go whole, whatever interrupts the main thread."""
        while True:
            message = self._queue.get()
            try:
                if message is None:
                    return
                if self._send_error is None:
                    write_message(pipe, message)
            except OSError as error:
                self._send_error = error
            finally:
                self._queue.task_done()

    def _send(self, message: dict[str, Any]) -> None:
        if self._send_error is not None or self.process is None:
            raise RecordingError(
                f"the dataset writer is gone (status {self.process and self.process.poll()}); see its messages above"
            )
        try:
            self._queue.put_nowait(message)
        except queue.Full:
            self.waits += 1
            if self.waits == 1:
                logger.warning("recording falls behind: the control loop waits for the dataset writer")
            self._queue.put(message)

    def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        kind = message["kind"]
        try:
            self._send(message)
            self._queue.join()  # sent whole
            if self._send_error is not None:
                raise RecordingError(
                    f"the dataset writer exited (status {self.process.poll()}) before '{kind}'; see its messages above"
                )
            reply = self._read_reply(kind)
        except BaseException:
            self.broken = True
            raise
        if not reply.get("ok"):
            raise RecordingError(f"the dataset writer refused '{kind}': {reply.get('error')}")
        return reply

    def _read_reply(self, kind: str) -> dict[str, Any]:
        assert self.process is not None and self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], self.config.timeout_s)
        if not ready:
            raise RecordingError(
                f"the dataset writer did not answer '{kind}' within {self.config.timeout_s:.0f} s (record.timeout_s)"
            )
        reply = read_message(self.process.stdout)
        if reply is None:
            raise RecordingError(
                f"the dataset writer exited (status {self.process.wait()}) during '{kind}'; see its messages above"
            )
        return reply

    def _stop_writer(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if self._sender is not None:
            self._queue.put(None)
            self._sender.join(timeout=self.config.timeout_s)
        if process.stdin is not None:
            try:
                process.stdin.close()  # a writer still waiting finishes the dataset on its own
            except OSError:
                pass
        try:
            process.wait(timeout=self.config.timeout_s)
        except subprocess.TimeoutExpired:
            logger.error("the dataset writer did not finish within %.0f s; stopping it", self.config.timeout_s)
            process.kill()
            process.wait()
