"""Run directories and metric logging (JSON lines always; tensorboard and wandb optional)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from embodied.config import LoggerConfig


def new_run_dir(runs_root: str, run_name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(runs_root) / f"{run_name}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = Path(f"{base}-{n}")
    path.mkdir(parents=True)
    return path


class MetricLogger:
    def __init__(self, run_dir: Path, cfg: LoggerConfig, config: dict[str, Any]):
        self.jsonl = open(run_dir / "metrics.jsonl", "a")
        self.tensorboard = None
        self.wandb = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(run_dir / "tensorboard"))
        if cfg.wandb:
            import wandb

            self.wandb = wandb.init(project=cfg.wandb_project, dir=str(run_dir), config=config,
                                    name=run_dir.name, resume="allow", id=run_dir.name)

    def log(self, metrics: dict[str, float], env_steps: int) -> None:
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        self.jsonl.write(json.dumps({"env_steps": env_steps, **clean}) + "\n")
        self.jsonl.flush()
        if self.tensorboard is not None:
            for key, value in clean.items():
                self.tensorboard.add_scalar(key, value, env_steps)
        if self.wandb is not None:
            self.wandb.log(clean, step=env_steps)

    def close(self) -> None:
        self.jsonl.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()
