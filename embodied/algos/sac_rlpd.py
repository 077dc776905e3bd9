"""SAC with RLPD's recipe, offline-to-online: WSRL and Cal-QL are settings of the same learner.

- RLPD (Ball et al. 2023): an ensemble of LayerNorm critics, the target's min over a random
  subset of them, several critic updates per collected transition (`utd_ratio`), and each
  batch drawn half from online replay, half from demonstrations plus the operator's
  interventions (`offline_fraction`).
- Cal-QL (Nakamoto et al. 2023): `offline_pretrain_steps` on the offline data first, with a
  conservative term (`calql_alpha`) that pushes Q down on sampled actions and up on the
  data's, where a policy action's Q-value counts no lower than the Monte-Carlo return of
  its episode (the calibration).
- WSRL (Zhou et al. 2024): after pretraining, `warmup_steps` env steps collected by the frozen
  pretrained policy seed the online buffer, and with `retain_offline: false` the offline
  data is dropped from then on. `online_temperature` restarts the entropy temperature there:
  pretraining with BC holds the policy's entropy far below the target, so the temperature
  climbs, and once BC stops that temperature drives the actor toward the uniform policy.
  `online_bc: true` keeps the demonstrations for the actor's BC term alone after the
  hand-over (the critics' batches are online only, as WSRL's), so the anchor that held the
  pretrained policy stays. On PushCube it did not stop the collapse: the mode kept fitting
  the demos while greedy success fell to 0 (benchmarks/results/wsrl_collapse.md).
  `critic_warmup_steps` lets the critics alone learn for that many env steps after the
  hand-over, so the actor starts following critics already fitted to online data.
- `critic_loss: hl_gauss` trains the critics as classifiers over a value support.
- `bc_weight` (ConRFT's Cal-ConRFT, Chen et al. 2025): the actor also regresses its mode
  onto the data's actions on the offline rows, demonstrations and the operator's corrections,
  so a correction shapes the policy at once instead of only through the critic.
- From pixels (HIL-SERL): the policy's frozen backbone encodes each camera; actor and critics
  each project its features with their own trainable head, or with `actor_projection:
  critics` the actor reads the critics' projection detached, as HIL-SERL's actor reads its
  shared encoder (only the critics' loss shapes it). Without augmentation the
  features of every stored frame are computed once, when it is stored, so many updates per
  transition cost no backbone passes; `image_augmentation: shift` (DrQ) shifts the frames of
  each sampled batch instead, one shift per sample shared by its critic and actor steps, and
  pays the backbone on every batch; `image_augmentation: cached_shifts` stores the features
  of `cached_shifts` randomly shifted views of each frame, computed once, and each sample
  reads one of them (drawn per sample, for its frame and its next frame apart): DrQ's
  augmentation at the price of `cached_shifts` backbone passes per frame instead of per update.

It fits the learner contract: each rollout batch is added to replay and followed by
`utd_ratio` critic steps per new transition and one actor step per new transition. The
policy (`policies/gaussian/squashed_gaussian.py`) is the actor; critics, temperature, buffers and
counters are this algorithm's state and travel in checkpoints."""

from __future__ import annotations

import copy
import hashlib
import logging
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Optional

import numpy as np
import torch

from embodied.algos.augment import random_shift
from embodied.algos.buffers import Trajectory
from embodied.algos.critics import CriticEnsemble, HLGauss
from embodied.algos.replay import ReplayBuffer, Transitions, concat, from_dataset, from_trajectory
from embodied.algos.sac_config import SACConfig, check_sac_config
from embodied.core.errors import ConfigError
from embodied.core.policy import Policy
from embodied.core.registry import ALGOS

logger = logging.getLogger(__name__)

PRETRAIN_LOG_LINES = 10  # at most, over an offline pretraining (its last step's metrics the learner logs)


@contextmanager
def frozen(module: torch.nn.Module) -> Iterator[None]:
    """`module`'s trainable parameters get no gradient inside the block: backward skips
    the weight gradients no optimizer step would use."""
    trainable = [p for p in module.parameters() if p.requires_grad]
    for parameter in trainable:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter in trainable:
            parameter.requires_grad_(True)


def adam(parameters: Iterable[torch.Tensor], lr: float) -> torch.optim.Adam:
    """Adam with its fused kernel: the same update in one pass over every tensor, where the
    default steps each tensor with a chain of small ops. For these small networks on a CPU a
    step takes about a third of the default's time, and the optimizers step several times per
    env step (the critics `utd_ratio` times)."""
    return torch.optim.Adam(parameters, lr=lr, fused=True)


def polyak(target: torch.nn.Module, source: torch.nn.Module, tau: float) -> None:
    with torch.no_grad():
        # one call for every parameter, not one each
        torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


def frame_keys(frames: dict[str, torch.Tensor]) -> list[bytes]:
    """A digest of each row's frames, every camera's: equal keys, identical frames (a 128-bit
    BLAKE2 digest, so a demo set's keys stay small; two different frames sharing one is
    astronomically unlikely)."""
    cameras = sorted(frames)
    arrays = [np.ascontiguousarray(frames[c].numpy()) for c in cameras]
    keys = []
    for row in range(len(arrays[0]) if arrays else 0):
        digest = hashlib.blake2b(digest_size=16)
        for array in arrays:
            digest.update(array[row])
        keys.append(digest.digest())
    return keys


class SACRLPD:
    def __init__(self, cfg: SACConfig, policy: Policy):
        check_sac_config(cfg)
        for method in ("sample", "log_prob", "to_squashed", "new_projection"):
            if not hasattr(policy, method):
                raise ConfigError(
                    f"algo '{cfg.name}' needs a policy with a squashed action distribution "
                    f"(policy=squashed_gaussian), not '{type(policy).__name__}'"
                )
        self.cfg = cfg
        self.policy = policy
        spec = policy.spec
        device = policy.device
        self.hl_gauss = (
            HLGauss(cfg.hl_gauss_low, cfg.hl_gauss_high, cfg.hl_gauss_bins, cfg.hl_gauss_sigma_ratio).to(device)
            if cfg.critic_loss == "hl_gauss"
            else None
        )
        bins = cfg.hl_gauss_bins if self.hl_gauss is not None else 1
        torch.manual_seed(cfg.seed)
        shared = cfg.actor_projection == "critics"
        if shared and not policy.cameras:
            raise ConfigError(
                "algo.actor_projection=critics shares the critics' projection of camera features with the actor; "
                "this policy reads no cameras (use an rgb env, or actor_projection=own)"
            )
        projection = policy.projection if shared else policy.new_projection()
        if shared:
            policy.detach_projection = True  # the critics' loss trains it, never the actor's
        # HIL-SERL's grasp critic: a policy with a discrete gripper has Q-values of its own for it,
        # and the ensemble sees the arm's action dimensions only
        self.gripper = getattr(policy, "gripper_critic", None)
        self.arm_dim = getattr(policy, "arm_dim", spec.action_dim)
        self.critics = CriticEnsemble(
            cfg.num_critics,
            projection.output_dim,
            self.arm_dim,
            cfg.critic_hidden,
            cfg.critic_layer_norm,
            bins,
            projection if policy.cameras else None,
        ).to(device)
        self.target_critics = copy.deepcopy(self.critics).requires_grad_(False)
        self.log_temperature = torch.tensor(math.log(cfg.init_temperature), device=device, requires_grad=True)
        self.target_entropy = cfg.target_entropy if cfg.target_entropy is not None else -self.arm_dim / 2
        not_the_actors = set(self.gripper.parameters()) if self.gripper is not None else set()
        if shared:
            not_the_actors |= set(projection.parameters())
        self.actor_optimizer = adam([p for p in policy.parameters() if p not in not_the_actors], lr=cfg.actor_lr)
        if self.gripper is not None:
            self.target_gripper = copy.deepcopy(self.gripper).requires_grad_(False)
            self.gripper_optimizer = adam(self.gripper.parameters(), lr=cfg.critic_lr)
        self.critic_optimizer = adam(self.critics.parameters(), lr=cfg.critic_lr)
        self.temperature_optimizer = adam([self.log_temperature], lr=cfg.temperature_lr)
        self.image_shapes = {camera: tuple(spec.image_shapes[camera]) for camera in policy.cameras}
        # frozen features are cached per stored frame unless each batch's frames are shifted
        self.caches_features = bool(self.image_shapes) and cfg.image_augmentation != "shift"
        self.views = cfg.cached_shifts if cfg.image_augmentation == "cached_shifts" else 1  # features per frame
        self.augment_generator = torch.Generator().manual_seed(cfg.seed + 3)
        self.online = self._buffer(cfg.replay_capacity, seed=cfg.seed)
        self.offline = self._buffer(cfg.replay_capacity, seed=cfg.seed + 1)
        self.bc_demos: Optional[ReplayBuffer] = None  # online_bc: the demos the actor's BC term keeps online
        self.demo_transitions = 0
        if cfg.dataset:
            demos = from_dataset(
                cfg.dataset, policy.to_squashed, cfg.gamma, spec.state_dim, spec.action_dim, self.image_shapes
            )
            self.offline.add(self.with_features(demos))
            self.demo_transitions = len(demos)
            logger.info("offline data: %d transitions from %s", len(demos), cfg.dataset)
        self.generator = torch.Generator().manual_seed(cfg.seed + 2)  # the target's critic subsets
        self.env_steps = 0
        self.critic_steps = 0
        self.pretrained = False
        self.online_started = False  # past pretraining and warm-up: online updates have begun

    @property
    def temperature(self) -> torch.Tensor:
        return self.log_temperature.exp()

    def _buffer(self, capacity: int, seed: int = 0) -> ReplayBuffer:
        spec = self.policy.spec
        feature_dim = (self.policy.input_dim - spec.state_dim) * self.views if self.caches_features else 0
        return ReplayBuffer(capacity, spec.state_dim, spec.action_dim, seed, self.image_shapes, feature_dim)

    # ---- pixels: the input vectors of actor and critics ---------------------------------------
    def with_features(self, transitions: Transitions) -> Transitions:
        """`transitions` with the frozen features of their frames, where they are cached. Each
        frame is encoded once: a transition's first frame is, apart from an episode's start,
        the next frame of the one before it (in this batch, or the last batch stored), so its
        features (and, with cached_shifts, its shifted views) are that next frame's."""
        if not self.caches_features:
            return transitions
        next_features = self.encode(transitions.next_images)
        recent = self.online.latest(len(transitions))
        known = dict(zip(frame_keys(recent.next_images), recent.next_features))
        known.update(zip(frame_keys(transitions.next_images), next_features))
        keys = frame_keys(transitions.images)
        missing = [row for row, key in enumerate(keys) if key not in known]
        if missing:
            rows = torch.tensor(missing)
            encoded = self.encode({camera: frames[rows] for camera, frames in transitions.images.items()})
            known.update(zip((keys[row] for row in missing), encoded))
        features = torch.stack([known[key] for key in keys]) if keys else next_features[:0]
        return replace(transitions, features=features, next_features=next_features)

    def encode(self, frames: dict[str, torch.Tensor]) -> torch.Tensor:
        """(N, views x F): the features of each of `frames`' views side by side (with
        cached_shifts, each view shifted at random)."""
        shifts_cached = self.cfg.image_augmentation == "cached_shifts"
        rows = len(next(iter(frames.values())))
        step = max(1, self.cfg.feature_batch // self.views)  # frames per backbone pass, all views included
        parts = []
        for i in range(0, rows, step):
            chunk = {c: v[i : i + step] for c, v in frames.items()}
            views = [self.shifted(chunk) if shifts_cached else chunk for _ in range(self.views)]
            # one backbone pass over every view: a CPU encodes a few frames at a time far below its rate
            stacked = self.policy.image_features({c: torch.cat([view[c] for view in views]) for c in chunk})
            parts.append(torch.cat(stacked.split(len(stacked) // self.views), dim=-1).cpu())
        return torch.cat(parts) if parts else torch.zeros(0, self.online.feature_dim)

    def shifted(self, frames: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each camera's frames, each shifted at random (DrQ)."""
        return {c: random_shift(v, self.cfg.shift_pad, self.augment_generator) for c, v in frames.items()}

    def one_view(self, features: torch.Tensor) -> torch.Tensor:
        """(N, F): one of each row's cached views, drawn per row."""
        if self.views == 1:
            return features
        rows = len(features)
        pick = torch.randint(self.views, (rows,), generator=self.augment_generator).to(features.device)
        return features.view(rows, self.views, -1)[torch.arange(rows, device=features.device), pick]

    def inputs(self, batch: Transitions) -> Transitions:
        """`batch` with its states replaced by the input vectors [state, frozen features]: the
        cached features (one cached view each), or those of randomly shifted frames. One call per
        sampled batch, so its critic and actor steps see the same shift."""
        if not self.image_shapes:
            return batch
        if self.caches_features:
            features, next_features = self.one_view(batch.features), self.one_view(batch.next_features)
        else:
            features = self.policy.image_features(self.shifted(batch.images))
            next_features = self.policy.image_features(self.shifted(batch.next_images))
        return replace(
            batch,
            state=torch.cat([batch.state, features], dim=-1),
            next_state=torch.cat([batch.next_state, next_features], dim=-1),
            images={},
            next_images={},
            features=None,
            next_features=None,
        )

    # ---- the learner contract ----------------------------------------------------------------
    def before_training(self) -> dict[str, float]:
        """Offline pretraining, once per run (a resumed run has done it already)."""
        if self.pretrained or not self.cfg.offline_pretrain_steps:
            self.pretrained = True
            return {}
        logger.info(
            "pretraining on %d offline transitions for %d steps", len(self.offline), self.cfg.offline_pretrain_steps
        )
        metrics: dict[str, float] = {}
        steps = self.cfg.offline_pretrain_steps
        every = math.ceil(steps / PRETRAIN_LOG_LINES)
        for step in range(1, steps + 1):
            batch = self.offline.sample(self.cfg.batch_size, frames=not self.caches_features)
            batch = self.inputs(batch.to(self.policy.device))
            metrics = self.critic_step(batch, offline_rows=len(batch))
            metrics.update(self.actor_step(batch, offline_rows=len(batch)))
            if step % every == 0 and step < steps:  # the last step's metrics are the learner's to log
                # progress, and what tells a hand-over that will go wrong: the critics' values on
                # the data against their targets, the policy's entropy against the temperature
                logger.info(
                    "pretraining step %d/%d: %s",
                    step,
                    steps,
                    ", ".join(f"{k.split('/')[-1]}={v:.4g}" for k, v in metrics.items()),
                )
        self.pretrained = True
        return {f"pretrain/{k.split('/')[-1]}": v for k, v in metrics.items()}

    def update(self, batch: Trajectory, progress: float, off_policy: bool = False) -> dict[str, float]:
        return self.learn(self.transitions(batch))

    def transitions(self, batch: Trajectory) -> Transitions:
        """A rollout batch as replay transitions (with cached features where they are cached)."""
        if set(self.image_shapes) - set(batch.next_images):
            raise ConfigError(
                f"algo '{self.cfg.name}' learns from cameras {sorted(self.image_shapes)}, but the batch holds "
                f"next frames of {sorted(batch.next_images)} only: its collector did not keep them"
            )
        return self.with_features(from_trajectory(batch, self.policy.to_squashed, self.image_shapes))

    def learn(self, new: Transitions) -> dict[str, float]:
        """Store `new`, then `utd_ratio` critic steps per new transition and an actor step
        after every `actor_every` of them (default: one per transition)."""
        self.online.add(new)
        if self.cfg.retain_offline and bool(new.intervened.any()):  # HIL-SERL: corrections are demos too
            self.offline.add(new.select(new.intervened))
        self.env_steps += len(new)
        metrics: dict[str, float] = {
            "replay/online": len(self.online),
            "replay/offline": len(self.offline),
            "replay/intervened": float(new.intervened.float().mean()),
        }
        if self.env_steps <= self.cfg.warmup_steps:
            return {**metrics, "train/warming_up": 1.0}
        if not self.online_started:
            self.start_online()
        critics_only = self.env_steps <= self.cfg.warmup_steps + self.cfg.critic_warmup_steps
        every = self.cfg.actor_every
        for i in range(self.cfg.utd_ratio * len(new)):
            sample, offline_rows = self.sample()
            metrics.update(self.critic_step(sample, offline_rows))
            if critics_only:
                continue
            if ((i + 1) % self.cfg.utd_ratio if every is None else self.critic_steps % every) == 0:
                metrics.update(self.actor_step(sample, offline_rows))
        return {**metrics, "train/critics_only": 1.0} if critics_only else metrics

    def start_online(self) -> None:
        """The hand-over to online learning, once per run: WSRL drops the offline data, and
        the temperature restarts where `online_temperature` says."""
        self.online_started = True
        if not self.cfg.retain_offline:
            self.drop_offline_data()
            logger.info(
                "online learning starts: offline data dropped from the critics' batches%s",
                ", kept for the actor's BC term (online_bc)" if self.bc_demos is not None else "",
            )
        if self.cfg.online_temperature is not None:
            with torch.no_grad():
                self.log_temperature.fill_(math.log(self.cfg.online_temperature))
            self.temperature_optimizer = adam([self.log_temperature], lr=self.cfg.temperature_lr)
            logger.info("online learning starts: temperature set to %g", self.cfg.online_temperature)

    def drop_offline_data(self) -> None:
        """WSRL after its warm-up: an empty offline buffer, so every batch is online; with
        `online_bc` the demos move to the actor's BC term."""
        if self.cfg.online_bc:
            self.bc_demos = self.offline
        self.offline = self._buffer(1)

    # ---- the objective -----------------------------------------------------------------------
    def sample(self) -> tuple[Transitions, int]:
        """A batch of input vectors: `offline_fraction` of it from demos + interventions where
        there are any."""
        size = self.cfg.batch_size
        offline_rows = int(round(size * self.cfg.offline_fraction)) if len(self.offline) else 0
        frames = not self.caches_features  # cached features stand in for the frames
        parts = [self.offline.sample(offline_rows, frames)] if offline_rows else []
        parts.append(self.online.sample(size - offline_rows, frames))
        return self.inputs(concat(parts).to(self.policy.device)), offline_rows

    def q_values(
        self,
        critics: CriticEnsemble,
        state: torch.Tensor,
        action: torch.Tensor,
        members: torch.Tensor | None = None,
        repeats: int = 1,
    ) -> torch.Tensor:
        out = critics(state, action, members, repeats)  # (N, B, bins), or (M, B, bins) of the members chosen
        return self.hl_gauss.value(out) if self.hl_gauss is not None else out.squeeze(-1)

    def td_target(self, batch: Transitions) -> torch.Tensor:
        with torch.no_grad():
            next_action, next_log_prob = self.policy.sample(batch.next_state)
            subset = torch.randperm(self.cfg.num_critics, generator=self.generator)[: self.cfg.critic_subset]
            # only the subset's target critics are evaluated: the min needs no others
            next_q = self.q_values(self.target_critics, batch.next_state, next_action, subset.to(batch.state.device))
            next_v = next_q.min(dim=0).values
            if self.cfg.backup_entropy:
                next_v = next_v - self.temperature * next_log_prob
            return batch.reward + self.cfg.gamma * batch.discount * next_v

    def critic_step(self, batch: Transitions, offline_rows: int) -> dict[str, float]:
        gripper_metrics = self.gripper_step(batch) if self.gripper is not None else {}
        target = self.td_target(batch)
        out = self.critics(batch.state, batch.action[:, : self.arm_dim])  # (N, B, bins)
        if self.hl_gauss is not None:
            td_loss = self.hl_gauss.loss(out, target.expand(out.shape[:2])).mean(1).sum()
            q_data = self.hl_gauss.value(out)
        else:
            q_data = out.squeeze(-1)
            td_loss = (q_data - target).pow(2).mean(1).sum()  # summed over critics: each learns at full rate
        loss = td_loss
        metrics: dict[str, float] = {}
        if self.cfg.calql_alpha > 0 and offline_rows:
            conservative = self.calql_penalty(batch, q_data, offline_rows)
            loss = loss + self.cfg.calql_alpha * conservative
            metrics["train/calql_penalty"] = conservative.item()
        self.critic_optimizer.zero_grad()
        loss.backward()
        self.critic_optimizer.step()
        polyak(self.target_critics, self.critics, self.cfg.tau)
        self.critic_steps += 1
        return {
            **metrics,
            **gripper_metrics,
            "train/critic_loss": td_loss.item() / self.cfg.num_critics,
            "train/q_mean": q_data.mean().item(),
            "train/target_mean": target.mean().item(),
        }

    def gripper_step(self, batch: Transitions) -> dict[str, float]:
        """Double DQN on the discrete gripper's Q-values: the online critic picks the next
        command, the target critic values it (HIL-SERL's grasp critic, without its penalty
        for gripper changes)."""
        with torch.no_grad():
            best = self.gripper(batch.next_state).argmax(-1, keepdim=True)
            next_q = self.target_gripper(batch.next_state).gather(-1, best).squeeze(-1)
            target = batch.reward + self.cfg.gamma * batch.discount * next_q
        chosen = self.policy.gripper_index(batch.action).unsqueeze(-1)
        q = self.gripper(batch.state).gather(-1, chosen).squeeze(-1)
        loss = (q - target).pow(2).mean()
        self.gripper_optimizer.zero_grad()
        loss.backward()
        self.gripper_optimizer.step()
        polyak(self.target_gripper, self.gripper, self.cfg.tau)
        return {"train/gripper_critic_loss": loss.item(), "train/gripper_q_mean": q.mean().item()}

    def calql_penalty(self, batch: Transitions, q_data: torch.Tensor, offline_rows: int) -> torch.Tensor:
        """CQL's logsumexp over sampled actions minus Q on the data's actions, on the offline
        rows; policy actions' Q-values floored at the Monte-Carlo return (Cal-QL)."""
        state, mc_return = batch.state[:offline_rows], batch.mc_return[:offline_rows]
        k, rows, action_dim = self.cfg.calql_actions, offline_rows, self.arm_dim
        # k actions per state, each state projected once (from pixels the projection of its
        # frozen features costs more than the critics' layers)
        with torch.no_grad():
            policy_action, policy_log_prob = self.policy.sample(state, samples=k)  # (rows * k, A)
        uniform = torch.rand(rows * k, action_dim, device=state.device) * 2 - 1
        q_policy = self.q_values(self.critics, state, policy_action, repeats=k).view(-1, rows, k)
        q_uniform = self.q_values(self.critics, state, uniform, repeats=k).view(-1, rows, k)
        q_policy = torch.maximum(q_policy, mc_return.view(1, rows, 1))  # the calibration
        # importance weights: log-densities of the proposals (uniform on [-1, 1]^A: -A log 2)
        scores = torch.cat([q_uniform + action_dim * math.log(2), q_policy - policy_log_prob.view(1, rows, k)], dim=-1)
        return (torch.logsumexp(scores, dim=-1) - q_data[:, :offline_rows]).mean(1).sum()

    def bc_batch(self) -> Optional[Transitions]:
        """online_bc: as many demo rows as a batch would have held offline, for BC alone."""
        if self.bc_demos is None:
            return None
        rows = max(1, int(round(self.cfg.batch_size * self.cfg.offline_fraction)))
        return self.inputs(self.bc_demos.sample(rows, frames=not self.caches_features).to(self.policy.device))

    def actor_step(self, batch: Transitions, offline_rows: int = 0) -> dict[str, float]:
        action, log_prob = self.policy.sample(batch.state)
        with frozen(self.critics):  # the actor's gradient flows through the critics, not into their weights
            q = self.q_values(self.critics, batch.state, action).mean(0)  # RLPD: the ensemble's mean for the actor
        actor_loss = (self.temperature.detach() * log_prob - q).mean()
        metrics: dict[str, float] = {}
        bc_rows = None
        if self.cfg.bc_weight > 0:
            bc_rows = batch.select(slice(0, offline_rows)) if offline_rows else self.bc_batch()
        if bc_rows is not None:
            # on the mode (tanh of the mean): the sample's noise is the entropy term's business
            mode, _ = self.policy.sample(bc_rows.state, deterministic=True)
            bc = (mode - bc_rows.action[:, : self.arm_dim]).pow(2).sum(-1).mean()
            actor_loss = actor_loss + self.cfg.bc_weight * bc
            metrics["train/bc_loss"] = bc.item()
        self.actor_optimizer.zero_grad()
        actor_loss.backward()
        self.actor_optimizer.step()
        temperature_loss = (self.temperature * (-log_prob.detach() - self.target_entropy)).mean()
        self.temperature_optimizer.zero_grad()
        temperature_loss.backward()
        self.temperature_optimizer.step()
        return {
            **metrics,
            "train/actor_loss": actor_loss.item(),
            "train/entropy": -log_prob.mean().item(),
            "train/temperature": self.temperature.item(),
        }

    # ---- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "critics": self.critics.state_dict(),
            "target_critics": self.target_critics.state_dict(),
            "log_temperature": self.log_temperature.detach().clone(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "temperature_optimizer": self.temperature_optimizer.state_dict(),
            "online": self.online.state_dict(),
            "offline": self.offline.state_dict(),
            "bc_demos": self.bc_demos.state_dict() if self.bc_demos is not None else None,
            **(
                {
                    "target_gripper": self.target_gripper.state_dict(),
                    "gripper_optimizer": self.gripper_optimizer.state_dict(),
                }
                if self.gripper is not None
                else {}
            ),
            "generator": self.generator.get_state(),
            "augment_generator": self.augment_generator.get_state(),
            "env_steps": self.env_steps,
            "critic_steps": self.critic_steps,
            "pretrained": self.pretrained,
            "online_started": self.online_started,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.critics.load_state_dict(state["critics"])
        self.target_critics.load_state_dict(state["target_critics"])
        with torch.no_grad():
            self.log_temperature.copy_(state["log_temperature"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.temperature_optimizer.load_state_dict(state["temperature_optimizer"])
        if self.gripper is not None:
            self.target_gripper.load_state_dict(state["target_gripper"])
            self.gripper_optimizer.load_state_dict(state["gripper_optimizer"])
        self.online.load_state_dict(state["online"])
        # checkpoints from before online_temperature say only whether the offline data was dropped
        self.online_started = bool(state.get("online_started", state.get("offline_dropped")))
        if self.online_started and not self.cfg.retain_offline:
            self.drop_offline_data()
        self.offline.load_state_dict(state["offline"])
        if self.bc_demos is not None and state.get("bc_demos") is not None:
            self.bc_demos.load_state_dict(state["bc_demos"])
        self.generator.set_state(state["generator"])
        if "augment_generator" in state:  # checkpoints from before pixel observations lack it
            self.augment_generator.set_state(state["augment_generator"])
        self.env_steps, self.critic_steps = int(state["env_steps"]), int(state["critic_steps"])
        self.pretrained = bool(state["pretrained"])


@ALGOS.register("sac_rlpd", SACConfig)
def make_sac_rlpd(cfg: SACConfig, policy: Policy) -> SACRLPD:
    return SACRLPD(cfg, policy)
