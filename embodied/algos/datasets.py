"""Reading a LeRobotDataset v3 folder straight from its parquet files, for learners: SFT
(`embodied.sft`) and offline RL (`embodied.algos.replay.from_dataset`). The learner needs neither
the dataset library nor torchvision (they live in the writer's virtualenv, see
`embodied.robots.recording`).

Frames come back in the dataset's global order as numpy arrays, one per column; camera
images stored as images (PNG in the parquet files) are decoded to uint8 (N, H, W, 3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from embodied.core.errors import ConfigError

IMAGE_PREFIX = "observation.images."


def dataset_info(root: str | Path) -> dict[str, Any]:
    """meta/info.json, or a clear error when `root` is not a dataset."""
    path = Path(root).expanduser() / "meta" / "info.json"
    if not path.is_file():
        raise ConfigError(f"no LeRobotDataset at {path.parent.parent} (meta/info.json is missing)")
    return json.loads(path.read_text())


def cameras(info: dict[str, Any]) -> list[str]:
    return sorted(key[len(IMAGE_PREFIX) :] for key in info["features"] if key.startswith(IMAGE_PREFIX))


def held_out_episodes(episodes: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Episodes kept out of training for validation: `fraction` of them, at least one when
    there are two or more and `fraction` > 0, never all."""
    held = int(round(fraction * len(episodes)))
    held = min(max(held, 1), len(episodes) - 1) if fraction > 0 and len(episodes) >= 2 else 0
    return np.random.default_rng(seed).permutation(episodes)[:held]


def read_frames(
    root: str | Path,
    columns: list[str],
    optional: tuple[str, ...] = (),
    hint: str = "record it with the robot client's record.dataset",
) -> dict[str, np.ndarray]:
    """`columns` (all required) and those of `optional` the dataset has, ordered by the
    global frame index. `task` gives each frame's instruction."""
    import pyarrow.parquet as pq

    root = Path(root).expanduser()
    info = dataset_info(root)
    files = sorted((root / "data").rglob("*.parquet"))
    if not files:
        raise ConfigError(f"the dataset at {root} holds no episodes")
    present = set(pq.read_schema(files[0]).names)
    wanted = [c for c in columns if c != "task"]
    missing = [c for c in wanted if c not in present]
    if missing:
        raise ConfigError(f"the dataset at {root} lacks {missing}; {hint}")
    videos = [c for c in wanted if c.startswith(IMAGE_PREFIX) and info["features"][c]["dtype"] == "video"]
    if videos:
        raise ConfigError(
            f"the dataset at {root} stores {videos} as video; learners here read images stored as "
            "images (record with record.use_videos=false)"
        )
    extra = ["task_index"] if "task" in columns else []
    names = list(dict.fromkeys(wanted + [c for c in optional if c in present] + extra + ["index"]))
    tables = [pq.read_table(f, columns=names).to_pydict() for f in files]
    order = np.argsort(np.concatenate([np.asarray(t["index"]) for t in tables]), kind="stable")
    frames: dict[str, np.ndarray] = {}
    for name in names:
        values = [value for t in tables for value in t[name]]
        if name.startswith(IMAGE_PREFIX):
            frames[name] = np.stack([_decode_image(values[i], name) for i in order])
        else:
            frames[name] = np.asarray(values)[order]
    if extra:
        frames["task"] = np.asarray(_tasks(root), dtype=object)[frames.pop("task_index").astype(np.int64)]
    return frames


def _decode_image(value: Any, column: str) -> np.ndarray:
    import cv2

    data = value.get("bytes") if isinstance(value, dict) else None
    if not data:
        raise ConfigError(f"a frame of '{column}' has no image bytes")
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise ConfigError(f"a frame of '{column}' is not a readable image")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def _tasks(root: Path) -> list[str]:
    """Instructions by task index. meta/tasks.parquet keeps the instruction as the table's
    (pandas) index, which parquet stores as a column of its own."""
    import pyarrow.parquet as pq

    table = pq.read_table(root / "meta" / "tasks.parquet").to_pydict()
    text_column = "task" if "task" in table else next((k for k in table if k.startswith("__index_level")), None)
    if text_column is None or "task_index" not in table:
        raise ConfigError(f"{root / 'meta' / 'tasks.parquet'} names no instructions")
    tasks = [""] * (max(table["task_index"]) + 1)
    for text, index in zip(table[text_column], table["task_index"]):
        tasks[int(index)] = str(text)
    return tasks
