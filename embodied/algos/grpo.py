"""GRPO's objective and its dynamic sampling.

Objective (per term t of rollout i: an action token, a trained denoising step, or the whole
chunk, as `ratio` and the policy decide; advantage A_i from `advantages.group_normalized`
broadcast over the rollout):

    r_t = exp(log pi(a_t) - log pi_old(a_t))
    loss = - sum_t min(r_t A_i, clip(r_t, 1 - clip_low, 1 + clip_high) A_i) / (number of tokens)

The clip is asymmetric ("clip-higher": a wider upper bound keeps low-probability tokens
that earned a positive advantage from being frozen out), the mean is over tokens of the whole
batch (not per rollout first), and there is no KL term by default.

Dynamic sampling keeps only groups whose success rate lies inside a band (all-fail and
all-succeed groups have zero advantage everywhere, so they only dilute the batch) and counts,
per task, what it kept and dropped, so a task that is always solved or never solved shows up
in the logs and in `uncovered()` instead of silently vanishing from training."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import torch

from embodied.algos.advantages import group_normalized
from embodied.algos.buffers import Trajectory
from embodied.algos.distributed import DataParallel
from embodied.algos.policy_gradient import (
    LossAverages,
    check_ratio,
    minibatch_order,
    optimizer_step,
    ratio_log_probs,
    recompute_rows,
    term_advantages,
)
from embodied.core.errors import ConfigError
from embodied.core.policy import Policy
from embodied.core.registry import ALGOS


@dataclass
class GRPOLoss:
    total: torch.Tensor
    policy_loss: torch.Tensor
    approx_kl: torch.Tensor
    clipfrac: torch.Tensor


def grpo_loss(
    new_log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
) -> GRPOLoss:
    """Token-level inputs (N, T) with `mask` marking real action tokens; `advantages` (N,) or (N, T)."""
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(new_log_prob)
    mask = mask.to(new_log_prob.dtype)
    tokens = mask.sum().clamp(min=1.0)
    log_ratio = new_log_prob - old_log_prob
    ratio = log_ratio.exp()
    per_token = -torch.min(ratio * advantages, ratio.clamp(1 - clip_low, 1 + clip_high) * advantages)
    policy_loss = (per_token * mask).sum() / tokens
    with torch.no_grad():
        approx_kl = (((ratio - 1) - log_ratio) * mask).sum() / tokens
        clipped = ((ratio < 1 - clip_low) | (ratio > 1 + clip_high)).to(mask.dtype)
        clipfrac = (clipped * mask).sum() / tokens
    return GRPOLoss(policy_loss, policy_loss, approx_kl, clipfrac)


@dataclass
class Group:
    task: str
    successes: int
    size: int

    @property
    def success_rate(self) -> float:
        return self.successes / self.size


class DynamicSampling:
    """Accepts groups whose success rate is within [low, high] until `groups_per_batch` are
    kept, with per-task accounting across the whole run."""

    def __init__(self, groups_per_batch: int, low: float = 0.1, high: float = 0.9):
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"the success band must satisfy 0 <= low <= high <= 1, got [{low}, {high}]")
        self.groups_per_batch = groups_per_batch
        self.low, self.high = low, high
        self.kept: list[Group] = []
        self.seen: collections.Counter[str] = collections.Counter()
        self.informative: collections.Counter[str] = collections.Counter()  # inside the band

    def offer(self, group: Group) -> bool:
        """Count the group for its task; keep it if it is informative and the batch has room."""
        self.seen[group.task] += 1
        if not self.low <= group.success_rate <= self.high:
            return False
        self.informative[group.task] += 1
        if self.full:
            return False
        self.kept.append(group)
        return True

    @property
    def full(self) -> bool:
        return len(self.kept) >= self.groups_per_batch

    def take_batch(self) -> list[Group]:
        batch, self.kept = self.kept, []
        return batch

    def uncovered(self) -> list[str]:
        """Tasks sampled so far whose groups were never informative (always or never solved)."""
        return sorted(task for task in self.seen if self.informative[task] == 0)

    def metrics(self) -> dict[str, float]:
        """Per task, the fraction of its groups inside the success band."""
        return {
            f"sampling/{task}/informative_fraction": self.informative[task] / self.seen[task]
            for task in sorted(self.seen)
        }


@dataclass
class GRPOConfig:
    name: str = "grpo"
    # Chunk steps per iteration. Every env starts an episode at the iteration's start, envs in
    # a group of `group_size` from the same initial state; only each env's first episode counts,
    # so this should cover the task's episode length.
    rollout_steps: int = 50
    group_size: int = 8  # env.num_envs must be a multiple
    lr: float = 1e-4
    adam_eps: float = 1e-8
    update_epochs: int = 1
    num_minibatches: int = 4
    clip_low: float = 0.2
    clip_high: float = 0.28
    max_grad_norm: float = 1.0
    outcome: str = "success"  # what a group compares: success (0/1) or return
    success_band: list[float] = field(default_factory=lambda: [0.1, 0.9])  # dynamic sampling; [0, 1] keeps all
    # Resample until full: collect batches until this many informative groups are kept, then
    # train on all of them (0: train on each batch's own informative groups) ...
    groups_per_batch: int = 0
    max_batches_per_update: int = 8  # ... but train on what there is after this many batches
    # One ratio per term of the policy's log-prob (action token, trained denoising step) or
    # per chunk; with terms, denoising step j of P weighs denoise_discount^(P - 1 - j).
    ratio: str = "term"
    denoise_discount: float = 1.0  # with ratio=term: denoising step j of P weighs this^(P-1-j)


def check_config(cfg: GRPOConfig) -> None:
    for key in ("rollout_steps", "group_size", "update_epochs", "num_minibatches"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"algo.{key} must be >= 1, got {getattr(cfg, key)}")
    if cfg.group_size < 2:
        raise ConfigError("algo.group_size must be >= 2: a group of one has nothing to compare with")
    if cfg.outcome not in ("success", "return"):
        raise ConfigError(f"algo.outcome must be 'success' or 'return', got '{cfg.outcome}'")
    if len(cfg.success_band) != 2:
        raise ConfigError(f"algo.success_band must be [low, high], got {cfg.success_band}")
    if cfg.groups_per_batch < 0 or cfg.max_batches_per_update < 1:
        raise ConfigError("algo.groups_per_batch must be >= 0 and algo.max_batches_per_update >= 1")
    check_ratio(cfg.ratio, cfg.denoise_discount)


@dataclass
class Kept:
    """The informative groups of one collected batch, waiting for an update."""

    batch: Trajectory
    rows: torch.Tensor  # flat (step, env) rows of the kept groups' first episodes
    advantages: torch.Tensor  # (B,) per env
    groups: int


class GRPO:
    def __init__(self, cfg: GRPOConfig, policy: Policy):
        check_config(cfg)
        self.cfg = cfg
        self.policy = policy
        self.group_size = cfg.group_size  # tells the runtime to start episodes in groups
        self.optimizer = torch.optim.Adam(
            [p for p in policy.parameters() if p.requires_grad], lr=cfg.lr, eps=cfg.adam_eps
        )
        self.sampling = DynamicSampling(groups_per_batch=1 << 30, low=cfg.success_band[0], high=cfg.success_band[1])
        self.kept: list[Kept] = []
        self.batches_collected = 0  # since the last update
        self.data_parallel: DataParallel | None = None  # set on every learner rank of a data-parallel run

    def _outcomes(self, batch: Trajectory) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per env: its first episode's steps (T, B), whether that episode ended, its success and return."""
        done = batch.terminated | batch.truncated
        first_episode = (done.long().cumsum(0) - done.long()) == 0  # up to and including the first done
        ended = done.any(0)
        success = (batch.success & first_episode).any(0)
        episode_return = (batch.reward * first_episode).sum(0)
        return first_episode, ended, success, episode_return

    def update(self, batch: Trajectory, progress: float, off_policy: bool = False) -> dict[str, float]:
        cfg, size = self.cfg, self.cfg.group_size
        if batch.num_envs % size:
            raise ConfigError(f"env.num_envs={batch.num_envs} is not a multiple of algo.group_size={size}")
        first_episode, ended, success, episode_return = self._outcomes(batch)
        if not ended.all():
            raise ConfigError(
                f"algo.rollout_steps={batch.num_steps} chunk steps did not reach the end of the first "
                f"episode of {int((~ended).sum())} envs; GRPO compares whole episodes, so set it to at "
                f"least the episode length in chunk steps (env steps / policy.chunk_size)"
            )
        device = batch.reward.device
        groups = torch.arange(batch.num_envs, device=device) // size
        outcome = success.float() if cfg.outcome == "success" else episode_return.float()
        advantages = group_normalized(outcome, groups)
        informative = torch.zeros(batch.num_envs, dtype=torch.bool, device=device)
        instructions = batch.observation.instruction
        for g in range(batch.num_envs // size):
            members = slice(g * size, (g + 1) * size)
            tasks = set(instructions[members]) if instructions else {"task"}
            if len(tasks) > 1:
                raise ConfigError(
                    f"the envs of GRPO group {g} run different tasks ({sorted(tasks)}); a group must "
                    f"share one task and initial state: give every env the same task, or make "
                    f"consecutive blocks of algo.group_size envs run one task"
                )
            task = tasks.pop()
            kept = self.sampling.offer(Group(task, int(success[members].sum()), size))
            informative[members] = kept
        self.sampling.take_batch()
        rows = torch.nonzero((first_episode & informative[None]).reshape(-1)).squeeze(-1)
        if rows.numel():
            self.kept.append(Kept(batch, rows, advantages, int(informative.sum()) // size))
        self.batches_collected += 1
        kept_groups = sum(k.groups for k in self.kept)
        metrics = {
            "grpo/success_rate": float(success.float().mean()),
            "grpo/informative_groups": float(informative.sum() // size),
            "grpo/kept_groups": float(kept_groups),
            **self.sampling.metrics(),
            "train/lr": cfg.lr,
        }
        if kept_groups < cfg.groups_per_batch and self.batches_collected < cfg.max_batches_per_update:
            return {**metrics, "grpo/resampling": 1.0}  # collect another batch before stepping
        kept, self.kept = self.kept, []
        metrics["grpo/batches_per_update"] = float(self.batches_collected)
        self.batches_collected = 0
        if not kept:
            return metrics  # every group all-success or all-failure: nothing to learn
        return {**metrics, **self._train(kept)}

    def _train(self, kept: list[Kept]) -> dict[str, float]:
        """Epochs of minibatches drawn across every kept batch. On learner ranks each rank
        takes a contiguous part of every minibatch, scaled so that the averaged gradient is
        the whole minibatch's token mean (the parts may differ in size)."""
        cfg, parallel = self.cfg, self.data_parallel
        sources = torch.cat([torch.full_like(k.rows, i) for i, k in enumerate(kept)])
        rows = torch.cat([k.rows for k in kept])
        minibatch = max(rows.numel() // cfg.num_minibatches, 1)
        parameters = [p for p in self.policy.parameters() if p.requires_grad]
        averages = LossAverages()
        for _ in range(cfg.update_epochs):
            order = minibatch_order(rows.numel(), parallel)
            for start in range(0, order.numel(), minibatch):
                picked = order[start : start + minibatch]
                mine = picked[parallel.part(len(picked))] if parallel else picked
                self.optimizer.zero_grad()
                loss = self._loss(kept, rows[mine], sources[mine]) if len(mine) else None
                if loss is not None:
                    share = parallel.world_size * len(mine) / len(picked) if parallel else 1.0
                    (loss.total * share).backward()
                (grad_norm,) = optimizer_step(self.optimizer, parameters, [parameters], cfg.max_grad_norm, parallel)
                if loss is not None:
                    averages.add(loss, grad_norm)
        return averages.metrics() if averages.count else {}

    def _loss(self, kept: list[Kept], rows: torch.Tensor, sources: torch.Tensor) -> GRPOLoss:
        """The objective over flat rows `rows` of the kept batches `sources`."""
        cfg = self.cfg
        new, old, advantages = [], [], []
        for i, k in enumerate(kept):
            mine = rows[sources == i]
            if mine.numel() == 0:
                continue
            _, chunk, new_log_prob = recompute_rows(self.policy, k.batch, mine, cfg.ratio)
            new.append(new_log_prob)
            old.append(ratio_log_probs(chunk.log_prob, chunk.record.get("term_log_prob"), cfg.ratio).to(new[-1].device))
            env_of_row = mine % k.batch.num_envs  # flat rows are (step, env) in time-major order
            advantages.append(
                term_advantages(k.advantages[env_of_row].to(new[-1].device), new[-1].shape[1], cfg.denoise_discount)
            )
        new_log_prob = torch.cat(new)
        return grpo_loss(
            new_log_prob,
            torch.cat(old),
            torch.cat(advantages),
            torch.ones_like(new_log_prob),
            cfg.clip_low,
            cfg.clip_high,
        )

    def state_dict(self) -> dict:
        """With the groups kept for the next update: a resumed run trains on the same data."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "batches_collected": self.batches_collected,
            "kept": [
                {
                    "batch": k.batch.state_dict(),
                    "rows": k.rows.cpu(),
                    "advantages": k.advantages.cpu(),
                    "groups": k.groups,
                }
                for k in self.kept
            ],
        }

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.batches_collected = int(state.get("batches_collected", 0))
        device = self.policy.device
        self.kept = [
            Kept(
                Trajectory.from_state_dict(k["batch"]).to(device),
                k["rows"].to(device),
                k["advantages"].to(device),
                int(k["groups"]),
            )
            for k in state.get("kept", [])
        ]


@ALGOS.register("grpo", GRPOConfig)
def make_grpo(cfg: GRPOConfig, policy: Policy) -> GRPO:
    return GRPO(cfg, policy)
