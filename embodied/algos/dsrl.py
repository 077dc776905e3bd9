"""DSRL (Wagenmaker et al. 2025): SAC in the latent-noise space of a frozen denoising policy.

The policy (`policy=flow`, `flow_vla`, `pi0`, `pi05`, `smolvla` or `diffusion`, with
`policy.latent_actor=true`, usually from an SFT run through `init=` or from a published
checkpoint) never changes; its latent actor chooses each chunk's initial noise and the
policy's deterministic sampler (a flow's ODE, DDIM) maps that noise to the actions. This is
SAC/RLPD (`sac_rlpd.py`, every option of it) on transitions (context, noise, chunk reward,
next context), where the context is what the latent actor reads (the policy's input
vector, or a VLM prefix pooled), fixed while the policy is frozen, and the action is the
squashed noise. One transition is one executed chunk: the reward summed over its actions,
one discount per chunk.

An operator's correction has no noise of its own: the learner maps the executed chunk to the
noise whose sampler reproduces it (the sampler run backwards, clipped into the latent range),
so a correction is an action of the latent actor like any other, and with `retain_offline` it
joins the offline half of each batch as in RLPD. Recorded demos (`algo.dataset`) are not read
yet: they hold single actions, not chunks with their contexts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from embodied.algos.buffers import Trajectory
from embodied.algos.replay import Transitions
from embodied.algos.sac_config import SACConfig
from embodied.algos.sac_rlpd import SACRLPD
from embodied.core.errors import ConfigError
from embodied.core.policy import Policy
from embodied.core.registry import ALGOS
from embodied.core.types import EnvSpec, Observation


@dataclass
class DSRLConfig(SACConfig):
    name: str = "dsrl"


class _Context(nn.Identity):
    """The critics read the context as it is (it has no images of its own to project)."""

    def __init__(self, width: int):
        super().__init__()
        self.output_dim = width


class LatentActor:
    """A denoising policy's latent actor with the actor interface SAC/RLPD trains: its inputs
    are the policy's latent contexts, its action space the squashed noise [-1, 1]^D."""

    cameras: list[str] = []

    def __init__(self, flow: Policy):
        self.flow = flow
        width = flow.latent_actor.noise_dim
        self.input_dim = flow.latent_width
        self.spec = EnvSpec(
            state_dim=flow.latent_width,
            action_dim=width,
            action_low=(-1.0,) * width,
            action_high=(1.0,) * width,
            control_hz=flow.spec.control_hz,
        )

    @property
    def device(self) -> torch.device:
        return self.flow.device

    def parameters(self) -> Iterator[nn.Parameter]:
        return self.flow.latent_actor.parameters()

    def sample(
        self,
        inputs: torch.Tensor,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
        samples: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.flow.latent_actor.sample(inputs, deterministic, generator, samples)

    def log_prob(self, inputs: torch.Tensor, squashed: torch.Tensor) -> torch.Tensor:
        return self.flow.latent_actor.log_prob(inputs, squashed)

    def to_squashed(self, squashed: torch.Tensor) -> torch.Tensor:
        return squashed

    def new_projection(self) -> nn.Module:
        return _Context(self.input_dim)


class DSRL(SACRLPD):
    def __init__(self, cfg: DSRLConfig, policy: Policy):
        if getattr(policy, "latent_actor", None) is None:
            name = getattr(getattr(policy, "cfg", None), "name", type(policy).__name__)
            raise ConfigError(
                "algo=dsrl steers a frozen flow or diffusion policy through its initial noise: use policy=flow, "
                "flow_vla, pi0, pi05, smolvla or diffusion with policy.latent_actor=true "
                f"(got policy '{name}' without a latent actor)"
            )
        if cfg.dataset:
            raise ConfigError(
                "algo=dsrl does not read algo.dataset yet (datasets hold single actions, not chunks with "
                "their contexts); operator corrections during training do reach it"
            )
        self.flow = policy
        super().__init__(cfg, LatentActor(policy))  # type: ignore[arg-type]

    def transitions(self, batch: Trajectory) -> Transitions:
        if "latent" not in batch.record:
            raise ConfigError(
                "algo=dsrl needs the chunks' noise in the batch: the rollout's policy has no latent actor"
            )
        rows = batch.num_steps * batch.num_envs
        flat = lambda x: x.reshape(rows, *x.shape[2:])  # noqa: E731
        observation = batch.flat_observation(slice(None))
        instruction = list(observation.instruction)
        following = Observation(
            state=flat(batch.next_state),
            images={k: flat(v) for k, v in batch.next_images.items()},
            instruction=instruction,
        )
        context = self.flow.latent_context(observation)
        next_context = self.flow.latent_context(following)
        latent = flat(batch.record["latent"]).to(context.device).clone()  # corrections replace rows
        intervened = flat(batch.intervened).bool()
        if intervened.any():  # the noise that reproduces what the operator executed
            driven = torch.nonzero(intervened).flatten()
            executed = flat(batch.executed_action)[driven]
            # past an episode's end the chunk holds zeros: repeat its last executed action there
            last = flat(batch.executed_steps)[driven].clamp(min=1) - 1
            kept = torch.minimum(torch.arange(executed.shape[1], device=last.device)[None, :], last[:, None])
            executed = executed.gather(1, kept[..., None].expand_as(executed))
            latent[driven.to(latent.device)] = self.flow.latent_for_actions(batch.flat_observation(driven), executed)
        return Transitions(
            state=context.cpu(),
            action=latent.cpu(),
            reward=flat(batch.reward).float().cpu(),
            next_state=next_context.cpu(),
            discount=1.0 - flat(batch.terminated).float().cpu(),
            intervened=intervened.cpu(),
            mc_return=torch.full((rows,), -torch.inf),
        )


@ALGOS.register("dsrl", DSRLConfig)
def make_dsrl(cfg: DSRLConfig, policy: Policy) -> DSRL:
    return DSRL(cfg, policy)
