"""Run directories and metric logging (JSON lines always; tensorboard and wandb optional)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from embodied.config import LoggerConfig
from embodied.core.errors import ConfigError


def new_run_dir(runs_root: str, run_name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(runs_root) / f"{run_name}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = Path(f"{base}-{n}")
    path.mkdir(parents=True)
    return path


def refuse_a_used_run_dir(run_dir: Path) -> None:
    """A new run into a folder that already holds one would append to its log and mix their
    checkpoints: refused, before anything is written."""
    if (run_dir / "metrics.jsonl").exists() or (run_dir / "checkpoints").exists():
        raise ConfigError(
            f"run_dir={run_dir} already holds a run: resume={run_dir} continues it; to start over, "
            "remove it or give another run_dir"
        )


def drop_metrics_after(run_dir: Path, step_key: str, step: int, renamed_from: str | None = None) -> None:
    """A resumed run rewrites what came after its checkpoint; keep the log consistent. A log
    written when the x-axis had another name (`renamed_from`) is rewritten in today's."""
    path = run_dir / "metrics.jsonl"
    if path.is_file():
        records = [json.loads(line) for line in path.read_text().splitlines() if line]
        for record in records:
            if renamed_from in record:
                record[step_key] = record.pop(renamed_from)
        kept = [record for record in records if record[step_key] <= step]
        path.write_text("".join(json.dumps(record) + "\n" for record in kept))


class MetricLogger:
    """`step_key`: what the x-axis counts, as it is named in metrics.jsonl."""

    def __init__(self, run_dir: Path, cfg: LoggerConfig, config: dict[str, Any], step_key: str = "env_steps"):
        self.step_key = step_key
        self.jsonl = open(run_dir / "metrics.jsonl", "a")
        self.tensorboard = None
        self.wandb = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(run_dir / "tensorboard"))
        if cfg.wandb:
            import wandb

            self.wandb = wandb.init(
                project=cfg.wandb_project,
                dir=str(run_dir),
                config=config,
                name=run_dir.name,
                resume="allow",
                id=run_dir.name,
            )

    def log(self, metrics: dict[str, float], step: int) -> None:
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        self.jsonl.write(json.dumps({self.step_key: step, **clean}) + "\n")
        self.jsonl.flush()
        if self.tensorboard is not None:
            for key, value in clean.items():
                self.tensorboard.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(clean, step=step)

    def close(self) -> None:
        self.jsonl.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()
