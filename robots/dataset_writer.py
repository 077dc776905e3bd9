"""The process that writes a robot's episodes into a LeRobotDataset v3, fed by
`embodied.robots.recording.DatasetRecorder` over a pipe.

    python -m embodied.robots.dataset_writer     # reads requests on stdin, answers on stdout

It runs apart from the control loop for two reasons: image encoding and parquet writes never
delay a tick, and the robot client stays free of torch (the dataset library imports it).

Durability: every saved episode is finalized at once (and the dataset reopened for the next),
so a crash loses at most the episode in progress; with `finalize_every: k`, every k-th, so a
killed writer loses at most the k - 1 saved since (reopening reloads the whole dataset, which
grows slow as it grows). The writer ignores SIGINT, SIGTERM and
SIGHUP: when the client goes away, with or without closing (a crash, SIGKILL, Ctrl-C), it sees
the end of its input and finishes on its own, keeping or discarding the partial episode as
configured."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, BinaryIO

from embodied.robots.recording import (
    WriterRequest,
    array_from_wire,
    dataset_features,
    read_message,
    write_message,
)

logger = logging.getLogger("embodied.robots.dataset_writer")

IMAGE_WRITER_THREADS = 4  # PNG encoding off the request loop


def import_lerobot_dataset() -> type:
    """LeRobotDataset, importable with a CPU torch: the registry's torchvision is a CUDA
    build whose import fails until its two operator schemas exist."""
    try:
        import torch
    except ImportError:
        raise ImportError(
            f"the dataset library needs torch, which {sys.executable} lacks: tools/setup.sh makes "
            f".venv-dataset, or set record.python"
        ) from None
    try:
        import torchvision  # noqa: F401
    except RuntimeError as error:
        if "torchvision::nms" not in str(error):
            raise
        library = torch.library.Library("torchvision", "DEF")
        library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        library.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
        import_lerobot_dataset.library = library  # the schemas live as long as the library object
        import torchvision  # noqa: F401
    try:
        from ledataset.datasets.lerobot_dataset import LeRobotDataset
    except ImportError:
        try:
            from lerobot.datasets.lerobot_dataset import LeRobotDataset  # lerobot itself, where installed
        except ImportError:
            raise ImportError(
                f"no LeRobotDataset library for {sys.executable}: tools/setup.sh makes .venv-dataset "
                f"(pip install -r tools/dataset-requirements.txt), or set record.python to an "
                f"interpreter that has lerobot-dataset or lerobot"
            ) from None
    return LeRobotDataset


class EpisodeWriter:
    """One dataset, one episode at a time."""

    def __init__(self, request: dict[str, Any]):
        self.dataset_class = import_lerobot_dataset()
        self.repo_id = str(request["repo_id"])
        self.root = Path(request["root"])
        self.partial = str(request["partial"])  # keep | discard: the episode in progress at a crash
        self.features = dataset_features(request["spec"], bool(request["use_videos"]))
        self.fps = int(request["fps"])
        self.finalize_every = int(request.get("finalize_every", 1))
        self.unfinalized = 0  # saved episodes since the last finalize
        if saved_episodes(self.root):
            self.dataset = self._reopen()
            self._check_matches()
        else:
            clear_stub(self.root)
            self.dataset = self.dataset_class.create(
                self.repo_id,
                fps=self.fps,
                root=self.root,
                features=self.features,
                use_videos=bool(request["use_videos"]),
                image_writer_threads=IMAGE_WRITER_THREADS,
            )
        self.frames = 0  # in the episode in progress

    def _reopen(self) -> Any:
        dataset = self.dataset_class(self.repo_id, root=self.root)
        dataset.start_image_writer(num_threads=IMAGE_WRITER_THREADS)
        return dataset

    def _check_matches(self) -> None:
        if int(self.dataset.fps) != self.fps:
            raise ValueError(
                f"the dataset at {self.root} runs at {self.dataset.fps} fps, this robot at {self.fps}: "
                f"record into another dataset"
            )
        have = {key: (value["dtype"], tuple(value["shape"])) for key, value in self.dataset.features.items()}
        for key, value in self.features.items():
            if have.get(key) != (value["dtype"], tuple(value["shape"])):
                raise ValueError(
                    f"the dataset at {self.root} has {key}={have.get(key)}, this robot records "
                    f"{(value['dtype'], tuple(value['shape']))}: record into another dataset"
                )

    @property
    def episodes(self) -> int:
        return int(self.dataset.meta.total_episodes)

    def add(self, frame: dict[str, Any]) -> None:
        values = {key: array_from_wire(value) if isinstance(value, dict) else value for key, value in frame.items()}
        self.dataset.add_frame(values)
        self.frames += 1

    def save(self) -> int:
        """The episode in progress is saved; every `finalize_every`-th save finalizes the
        dataset (durable from then on) and reopens it for more."""
        if self.frames == 0:
            raise ValueError("no frames to save in this episode")
        index = self.episodes
        self.dataset.save_episode()
        self.frames = 0
        self.unfinalized += 1
        if self.unfinalized >= self.finalize_every:
            self.dataset.finalize()
            self.dataset = self._reopen()  # a finalized dataset object takes no more episodes
            self.unfinalized = 0
        return index

    def discard(self) -> None:
        if self.frames:
            self.dataset.clear_episode_buffer()
        self.frames = 0

    def finish(self, cleanly: bool) -> None:
        if self.frames and (cleanly or self.partial == "discard"):
            logger.info("discarding the unfinished episode (%d frames)", self.frames)
            self.discard()
        elif self.frames:
            logger.info("keeping the unfinished episode (%d frames)", self.frames)
            self.save()
        self.dataset.finalize()


def saved_episodes(root: Path) -> int:
    info = root / "meta" / "info.json"
    return int(json.loads(info.read_text()).get("total_episodes", 0)) if info.is_file() else 0


def clear_stub(root: Path) -> None:
    """Make way for a new dataset: a folder that is missing, empty, or the metadata of a
    dataset created but never given an episode. Anything else is refused, not overwritten."""
    if not root.exists():
        return
    files = [p for p in root.rglob("*") if p.is_file()]
    if any(p.relative_to(root).parts[0] != "meta" for p in files):
        raise ValueError(f"{root} exists and holds files but no LeRobotDataset episodes: record into another folder")
    for path in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    root.rmdir()


def serve(requests: BinaryIO, replies: BinaryIO) -> int:
    writer: EpisodeWriter | None = None
    failed: str | None = None  # a frame that could not be written fails the next save
    while True:
        message = read_message(requests)
        if message is None:  # the client went away without closing
            if writer is not None:
                logger.warning("the robot client left without closing the dataset; finishing it")
                writer.finish(cleanly=False)
            return 1
        kind = message.get("kind")
        try:
            if kind == WriterRequest.FRAME:
                if writer is None:
                    raise ValueError("a frame before the dataset was opened")
                if failed is None:
                    writer.add(message["frame"])
                continue
            if kind == WriterRequest.DISCARD and writer is not None:  # also what a failed frame needs
                failed = None
                writer.discard()
                write_message(replies, {"ok": True})
                continue
            if failed is not None:
                error, failed = failed, None
                if writer is not None:
                    writer.discard()
                raise ValueError(error)
            if kind == WriterRequest.OPEN:
                writer = EpisodeWriter(message)
                write_message(replies, {"ok": True, "episodes": writer.episodes})
            elif writer is None:
                raise ValueError(f"'{kind}' before the dataset was opened")
            elif kind == WriterRequest.SAVE:
                write_message(replies, {"ok": True, "episode_index": writer.save()})
            elif kind == WriterRequest.CLOSE:
                writer.finish(cleanly=True)
                write_message(replies, {"ok": True, "episodes": writer.episodes})
                return 0
            else:
                raise ValueError(f"unknown request '{kind}'")
        except Exception as error:  # answered to the client, which raises it as a RecordingError
            text = f"{type(error).__name__}: {error}"
            if kind == WriterRequest.FRAME:
                if failed is None:
                    logger.error("a frame could not be written; the episode will be refused: %s", text)
                failed = failed or f"a frame could not be written: {text}"
                continue
            logger.error("%s", text)
            write_message(replies, {"ok": False, "error": text})
            if writer is None:
                return 2


def quiet_library() -> None:
    """What the dataset library prints on every saved episode and nobody acts on: its
    per-episode progress bars, the bool-to-uint8 note of its statistics and the
    video-decoder fallback (we write; decoding is not ours)."""
    import warnings

    warnings.filterwarnings("ignore", message="Converting input from bool", category=RuntimeWarning)
    logging.getLogger().addFilter(lambda record: "torchcodec" not in record.getMessage())
    # The library turns progress bars back on after its own quiet sections; only the environment
    # variable, read when `datasets` is imported, outranks that (and makes it warn instead).
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", message="Cannot enable progress bars")


def main() -> int:
    # Stopping is the client's to decide: it closes the dataset, or its exit closes the pipe.
    # A signal meant for the whole process group must not cut a save in half.
    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    quiet_library()
    # Replies get their own descriptor; anything a library prints goes to stderr instead.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    sys.exit(main())
