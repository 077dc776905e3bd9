"""Trajectories: time-major (T, B, ...) torch tensors assembled by the rollout."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from embodied.core.types import ActionChunk, Observation, StepResult


@dataclass
class Trajectory:
    observation: Observation  # state (T, B, S), images (T, B, H, W, 3)
    actions: torch.Tensor  # (T, B, C, A) as sampled by the policy
    log_prob: torch.Tensor  # (T, B)
    value: torch.Tensor  # (T, B)
    reward: torch.Tensor  # (T, B) summed over the executed actions of the chunk
    terminated: torch.Tensor  # (T, B) bool
    truncated: torch.Tensor  # (T, B) bool
    bootstrap_value: torch.Tensor  # (T, B) value of the final observation where truncated
    success: torch.Tensor  # (T, B) bool
    executed_action: torch.Tensor  # (T, B, C, A) after clipping
    executed_steps: torch.Tensor  # (T, B)
    intervened: torch.Tensor  # (T, B) bool: a human or safety layer replaced the action
    policy_version: torch.Tensor  # (T, B)
    last_value: torch.Tensor  # (B,) value of the observation after the last step
    # (T, B, S) the state each step led to (the episode's final one where it ended), for the
    # bootstrapped targets of off-policy critics
    next_state: torch.Tensor
    record: dict[str, torch.Tensor] = field(default_factory=dict)  # sampling records (T, B, ...)
    # (T, B, H, W, 3) the images each step led to, like `next_state`; kept only for policies
    # that learn off-policy from pixels (`needs_next_images`), empty otherwise
    next_images: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def num_steps(self) -> int:
        return int(self.reward.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.reward.shape[1])

    def to(self, device: Any) -> "Trajectory":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device)
        moved["record"] = {k: v.to(device) for k, v in self.record.items()}
        moved["next_images"] = {k: v.to(device) for k, v in self.next_images.items()}
        moved["observation"] = Observation(
            state=self.observation.state.to(device),
            images={k: v.to(device) for k, v in self.observation.images.items()},
            instruction=self.observation.instruction,
        )
        return Trajectory(**moved)

    def state_dict(self) -> dict[str, Any]:
        """Plain tensors, lists and dicts (what checkpoints hold), on the CPU."""
        cpu = self.to("cpu")
        state = {f.name: getattr(cpu, f.name) for f in fields(cpu)}
        state["observation"] = {
            "state": cpu.observation.state,
            "images": cpu.observation.images,
            "instruction": list(cpu.observation.instruction),
        }
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> "Trajectory":
        return cls(**{**state, "observation": Observation(**state["observation"])})

    def chunk(self, index: Any) -> ActionChunk:
        """The stored action chunks of flat (T*B) rows `index`, for `Policy.recompute`."""
        return ActionChunk(
            actions=_flat(self.actions)[index],
            log_prob=_flat(self.log_prob)[index],
            value=_flat(self.value)[index],
            record={k: _flat(v)[index] for k, v in self.record.items()},
        )

    def flat_observation(self, index: Any) -> Observation:
        obs = self.observation
        instructions = np.asarray(obs.instruction * self.num_steps, dtype=object)
        # numpy takes a one-element torch index for a scalar: index it with an array
        rows = index.cpu().numpy() if isinstance(index, torch.Tensor) else index
        return Observation(
            state=_flat(obs.state)[index],
            images={k: _flat(v)[index] for k, v in obs.images.items()},
            instruction=instructions[rows].tolist() if len(instructions) else [],
        )


def concat_envs(parts: list[Trajectory]) -> Trajectory:
    """Trajectories of the same steps for disjoint env rows, joined along the env axis."""
    joined = {}
    for f in fields(Trajectory):
        values = [getattr(p, f.name) for p in parts]
        if f.name == "observation":
            joined[f.name] = Observation(
                state=torch.cat([v.state for v in values], dim=1),
                images={k: torch.cat([v.images[k] for v in values], dim=1) for k in values[0].images},
                instruction=[text for v in values for text in v.instruction],
            )
        elif f.name in ("record", "next_images"):
            joined[f.name] = {k: torch.cat([v[k] for v in values], dim=1) for k in values[0]}
        else:
            joined[f.name] = torch.cat(values, dim=0 if f.name == "last_value" else 1)
    return Trajectory(**joined)


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, *x.shape[2:])


class TrajectoryBuilder:
    """Appends one env step at a time, then stacks into a `Trajectory`; with
    `keep_next_images`, the images each step led to as well."""

    def __init__(self, keep_next_images: bool = False) -> None:
        self.steps: list[dict[str, Any]] = []
        self.instruction: list[str] = []
        self.keep_next_images = keep_next_images

    def add(
        self,
        observation: Observation,
        chunk: ActionChunk,
        result: StepResult,
        bootstrap_value: torch.Tensor,
        intervened: np.ndarray | None = None,
    ) -> None:
        self.instruction = list(observation.instruction)
        done = torch.as_tensor(result.done)
        next_images = {}
        if self.keep_next_images:
            for name, image in result.observation.images.items():
                final = torch.as_tensor(result.final_observation.images[name])
                next_images[name] = torch.where(done.view(-1, 1, 1, 1), final, torch.as_tensor(image))
        self.steps.append(
            {
                "state": torch.as_tensor(observation.state),
                "images": {k: torch.as_tensor(v) for k, v in observation.images.items()},
                "actions": chunk.actions,
                "log_prob": chunk.log_prob,
                "value": chunk.value,
                "record": chunk.record,
                "policy_version": torch.full_like(chunk.log_prob, chunk.policy_version, dtype=torch.int64),
                "reward": torch.as_tensor(result.reward),
                "terminated": torch.as_tensor(result.terminated),
                "truncated": torch.as_tensor(result.truncated),
                "bootstrap_value": bootstrap_value,
                "success": torch.as_tensor(result.success),
                "executed_action": torch.as_tensor(result.executed_action),
                "executed_steps": torch.as_tensor(result.executed_steps),
                "intervened": (
                    torch.zeros(len(result.reward), dtype=torch.bool)
                    if intervened is None
                    else torch.as_tensor(intervened, dtype=torch.bool)
                ),
                "next_state": torch.where(
                    done.unsqueeze(-1),
                    torch.as_tensor(result.final_observation.state),
                    torch.as_tensor(result.observation.state),
                ),
                "next_images": next_images,
            }
        )

    def build(self, last_value: torch.Tensor) -> Trajectory:
        stack = lambda key: torch.stack([s[key] for s in self.steps])  # noqa: E731
        first = self.steps[0]
        observation = Observation(
            state=stack("state"),
            images={k: torch.stack([s["images"][k] for s in self.steps]) for k in first["images"]},
            instruction=self.instruction,
        )
        plain = {f.name for f in fields(Trajectory)} - {"observation", "record", "last_value", "next_images"}
        return Trajectory(
            observation=observation,
            last_value=last_value,
            record={k: torch.stack([s["record"][k] for s in self.steps]) for k in first["record"]},
            next_images={k: torch.stack([s["next_images"][k] for s in self.steps]) for k in first["next_images"]},
            **{name: stack(name) for name in plain},
        )
