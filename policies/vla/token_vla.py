"""Autoregressive token VLA (OpenVLA / OpenVLA-OFT style) on a transformers causal LM or
vision-language model.

The prefix is each camera's image tokens (vision-language backbones: their own vision tower
and projector, `embodied.policies.vla.vlm`), the instruction's tokens, then one embedding of the
(normalised) state;
then come C x A action positions whose tokens are the last 256 vocabulary ids
(`embodied.policies.vla.action_tokens`). Without images in front, the instruction's positions depend on
the instruction alone, so they run once per distinct instruction of a batch and every row
reads their keys and values (a multi-task batch holds a few instructions: most of the
sequence is computed a few times instead of once per row). Two decoders:

- causal: one action token after another, each fed back as the next input (OpenVLA);
- parallel: all C x A positions from one forward pass (OpenVLA-OFT). Their inputs are
  learned query embeddings instead of sampled tokens, so given the observation the positions
  are independent and sampling them all at once is exact.

The log-prob of an action chunk is the sum of its tokens' log-probs under a softmax restricted
to the 256 action tokens, with the same temperature at rollout and in training. The value
head reads the hidden state just before the first action position (linear, or an MLP with
`critic_hidden`, which can also read the normalised state: `value_reads_state`). `backbone=tiny` builds a
small random Qwen2 (and a byte-level instruction tokenizer) that runs anywhere, and
`backbone=tiny_vlm` a small random PaliGemma that also reads camera images; a local path or
hub id loads a causal LM (Llama, Qwen2, ...) or a vision-language model (PaliGemma, SmolVLM)
with its tokenizer. With
`lora_rank > 0` the backbone is frozen and only LoRA adapters, heads and embeddings train,
so only they travel as weight updates. `precision=bfloat16` runs the backbone's arithmetic in
bfloat16 (autocast, for GPUs; the action logits come out of a bfloat16 matmul); its weights,
the optimizer, the action log-softmax and the value head stay float32."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from embodied.core.errors import ConfigError
from embodied.core.policy import Policy, Recomputed
from embodied.core.registry import POLICIES
from embodied.core.types import ActionChunk, EnvSpec, Observation
from embodied.policies.gaussian.mlp import mlp
from embodied.policies.normalization import FeatureStatistics, RunningNormalizer, range_feature
from embodied.policies.vla.action_tokens import NUM_BINS, ActionTokenizer
from embodied.policies.vla.backbones import TINY_BACKBONES, build_backbone, prefix_embeddings, vision_prefix
from embodied.policies.vla.vlm import is_vision_language

DECODERS = ("causal", "parallel")
PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16}


def env_bounds(spec: EnvSpec) -> FeatureStatistics:
    """The env's action bounds onto [-1, 1]: the action statistics of a model without a
    dataset's."""
    low, high = np.array(spec.action_low, dtype=np.float64), np.array(spec.action_high, dtype=np.float64)
    return range_feature("the env's bounds", "the env's action bounds", low, high - low)


@dataclass
class TokenPolicyConfig:
    """What every token VLA sets: decoding, sampling, precision, LoRA and the value head."""

    name: str = "token_vla"
    chunk_size: int = 1
    decoder: str = "parallel"  # causal | parallel
    hidden_size: int = 64  # tiny backbones only
    num_layers: int = 2
    num_heads: int = 4
    vocab_size: int = 1024  # tiny backbones: 256 action ids at the end, instruction bytes at the start
    max_instruction_tokens: int = 48
    temperature: float = 1.0  # the same at rollout and in the training forward pass
    # SFT targets: 0 puts all of a demonstrated action's mass on its bin; > 0 spreads it over
    # the neighbouring bins as a Gaussian of this width (in bins), so the SFT policy samples
    # local noise of about that scale, rather than a sharp mode with a thin spread of far bins.
    label_sigma_bins: float = 0.0
    # float32 | bfloat16: the backbone's arithmetic under autocast (its output logits included).
    # Weights, optimizer state, the residual stream's input, the action log-softmax and the value
    # head stay float32 either way.
    precision: str = "float32"
    lora_rank: int = 0  # > 0: freeze the backbone, train LoRA adapters of this rank
    lora_alpha: int = 16
    value_from_detached: bool = False  # stop the value loss's gradient at the backbone
    # The value head: linear on that hidden state (the default), or an MLP of these widths;
    # with value_reads_state it also reads the normalised state, so the critic need not rely
    # on what a backbone tuned to predict actions keeps of it (values depend on progress).
    critic_hidden: list[int] = field(default_factory=list)
    value_reads_state: bool = False  # the value head also reads the normalised state


@dataclass
class TokenVLAConfig(TokenPolicyConfig):
    # tiny: a small random Qwen2; tiny_vlm: a small random PaliGemma (reads images); else a
    # causal LM's or vision-language model's local path or hub id
    backbone: str = "tiny"
    image_size: int = 32  # tiny_vlm: the vision tower's input (camera frames are resized to it)
    patch_size: int = 8


class TokenVLAPolicy(nn.Module, Policy):
    lora_targets = ("q_proj", "v_proj")  # the backbone's modules LoRA adapts

    def __init__(self, cfg: TokenPolicyConfig, spec: EnvSpec):
        super().__init__()
        if cfg.decoder not in DECODERS:
            raise ConfigError(f"policy.decoder must be one of {DECODERS}, got '{cfg.decoder}'")
        if cfg.precision not in PRECISIONS:
            raise ConfigError(f"policy.precision must be one of {tuple(PRECISIONS)}, got '{cfg.precision}'")
        if cfg.temperature <= 0:
            raise ConfigError(f"policy.temperature must be > 0, got {cfg.temperature}")
        if cfg.label_sigma_bins < 0:
            raise ConfigError(f"policy.label_sigma_bins must be >= 0, got {cfg.label_sigma_bins}")
        self.cfg, self.spec, self.chunk_size = cfg, spec, cfg.chunk_size
        self.backbone, self.instructions = self._build_backbone()
        self.cameras = sorted(spec.image_shapes)
        self.image_tokens = self._image_tokens()
        self.shares_instruction = self._prefix_is_instruction_only()
        if cfg.lora_rank > 0:
            from peft import LoraConfig, get_peft_model

            self.backbone = get_peft_model(
                self.backbone,
                LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=list(self.lora_targets)),
            )
        hidden = self.backbone.config.get_text_config().hidden_size
        self.actions = self._action_tokenizer()
        self.positions = cfg.chunk_size * spec.action_dim
        self.normalizer = RunningNormalizer(spec.state_dim)
        self.state_embedding = nn.Linear(spec.state_dim, hidden)
        self.action_queries = nn.Parameter(torch.randn(self.positions, hidden) * 0.02)  # parallel decoder inputs
        value_inputs = hidden + (spec.state_dim if cfg.value_reads_state else 0)
        if cfg.critic_hidden or cfg.value_reads_state:
            self.value_head = mlp([value_inputs, *cfg.critic_hidden, 1], nn.Tanh, out_gain=1.0)
        else:
            self.value_head = nn.Linear(hidden, 1)  # the value head, as OpenVLA-based PPO has it

    def _build_backbone(self) -> tuple[nn.Module, Any]:
        """The language model (or vision-language model) and its instruction tokenizer."""
        return build_backbone(self.cfg)

    def _image_tokens(self) -> nn.Module | None:
        """What turns camera frames into the backbone's image tokens (None without cameras)."""
        return vision_prefix(self.backbone, self.cfg.backbone, self.cameras)

    def _prefix_is_instruction_only(self) -> bool:
        """Without images in front, a row's instruction positions depend on its instruction
        alone: they run once per distinct instruction in a batch (`_instruction_cache`)."""
        return self.image_tokens is None and not is_vision_language(self.backbone)

    def _action_tokenizer(self) -> ActionTokenizer:
        """Action tokens at the end of the backbone's vocabulary, bins over the env's bounds."""
        vocab_size = self.backbone.config.get_text_config().vocab_size
        return ActionTokenizer(vocab_size, env_bounds(self.spec))

    def pretrained_frozen(self) -> tuple[str, list[str]] | None:
        """With LoRA on a backbone loaded from a path or hub id, the frozen backbone: a
        checkpoint then holds the adapters, heads and statistics (megabytes, not gigabytes)."""
        if self.cfg.lora_rank <= 0 or self.cfg.backbone in TINY_BACKBONES:
            return None
        names = self.frozen_parameter_names()
        return (self.cfg.backbone, names) if names else None

    # ---- pieces -----------------------------------------------------------------------------
    def _token_embeddings(self) -> nn.Module:
        return self.backbone.get_input_embeddings()

    def _autocast(self) -> torch.autocast:
        """The backbone's arithmetic at `precision` (a no-op for float32)."""
        dtype = PRECISIONS[self.cfg.precision]
        return torch.autocast(self.action_queries.device.type, dtype=dtype or torch.float32, enabled=dtype is not None)

    def _state(self, observation: Observation) -> torch.Tensor:
        return self.normalizer(observation.state.to(self.action_queries.device, torch.float32))

    def _prefix(self, observation: Observation) -> tuple[torch.Tensor, torch.Tensor]:
        return prefix_embeddings(
            observation,
            self._token_embeddings(),
            self.instructions,
            self.cfg.max_instruction_tokens,
            self.image_tokens,
            self.cameras,
            self.state_embedding(self._state(observation)),
        )

    def _instruction_cache(self, observation: Observation) -> tuple[Any, torch.Tensor]:
        """The backbone's keys and values over each row's instruction, computed once per
        distinct instruction (a batch holds few), and the instructions' attention mask (B, L)."""
        texts = observation.instruction or [""] * observation.state.shape[0]
        distinct = sorted(set(texts))
        rows = torch.tensor([distinct.index(text) for text in texts], device=self.action_queries.device)
        ids, mask = self.instructions(distinct, self.cfg.max_instruction_tokens)
        ids, mask = ids.to(rows.device), mask.to(rows.device)
        cache = self.backbone(
            inputs_embeds=self._token_embeddings()(ids), attention_mask=mask, use_cache=True, logits_to_keep=1
        ).past_key_values
        cache.batch_select_indices(rows)
        return cache, mask[rows]

    def _run(
        self, observation: Observation, inputs: torch.Tensor | None, keep: int, use_cache: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, Any, torch.Tensor]:
        """The backbone over [prefix, inputs]: the action tokens' logits at the last `keep`
        positions, the hidden state of the prefix's last position (the state's, which the value
        head reads), and the keys and values (with `use_cache`) and attention mask to decode on from."""
        with self._autocast():
            if self.shares_instruction:
                cache, mask = self._instruction_cache(observation)  # the mask covers the cached positions
                embeddings = self.state_embedding(self._state(observation))[:, None]
                covered = 0
            else:
                cache = None
                embeddings, mask = self._prefix(observation)
                covered = embeddings.shape[1]
            state_position = embeddings.shape[1] - 1
            if inputs is not None:
                embeddings = torch.cat([embeddings, inputs], 1)
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], embeddings.shape[1] - covered)], 1)
            # float32 in on every path (the state embedding alone comes out of autocast in
            # bfloat16), so the residual stream has one dtype at rollout and in training
            out = self.backbone(
                inputs_embeds=embeddings.float(),
                attention_mask=mask,
                past_key_values=cache,
                use_cache=use_cache or cache is not None,
                output_hidden_states=True,
                logits_to_keep=keep,
            )
        return (
            self._action_logits(out.logits),
            out.hidden_states[-1][:, state_position].float(),
            out.past_key_values,
            mask,
        )

    def _action_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The 256 action tokens' columns of the backbone's logits, in float32."""
        return logits[..., self.actions.first_token : self.actions.first_token + NUM_BINS].float()

    def _action_log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Log-softmax over the 256 action tokens' logits, at the policy's temperature."""
        return torch.log_softmax(logits / self.cfg.temperature, dim=-1)

    def _value(self, hidden_before_actions: torch.Tensor, observation: Observation) -> torch.Tensor:
        inputs = hidden_before_actions.detach() if self.cfg.value_from_detached else hidden_before_actions
        if self.cfg.value_reads_state:
            inputs = torch.cat([inputs, self._state(observation)], -1)
        return self.value_head(inputs).squeeze(-1)

    def _score(self, observation: Observation, bins: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-position action log-probs (B, P, 256) and value (B,). For the causal decoder,
        `bins` (B, P) are the action tokens fed back (teacher forcing)."""
        batch = observation.state.shape[0]
        if self.cfg.decoder == "parallel":
            inputs = self.action_queries[None].expand(batch, -1, -1)  # each query predicts its own token
        else:
            inputs = self._token_embeddings()(bins[:, :-1] + self.actions.first_token)  # position t predicts t + 1
        logits, hidden, _, _ = self._run(observation, inputs, keep=self.positions)
        return self._action_log_probs(logits), self._value(hidden, observation)

    # ---- the policy contract ----------------------------------------------------------------
    def act(
        self, observation: Observation, deterministic: bool = False, generator: torch.Generator | None = None
    ) -> ActionChunk:
        if self.cfg.decoder == "parallel":
            log_probs, value = self._score(observation, None)
            bins = self._pick(log_probs, deterministic, generator)
        else:
            bins, value = self._decode_causally(observation, deterministic, generator)
            log_probs, _ = self._score(observation, bins)
        per_token = log_probs.gather(-1, bins[..., None]).squeeze(-1)
        tokens = bins + self.actions.first_token
        per_action = tokens.view(-1, self.chunk_size, self.spec.action_dim).cpu().numpy()
        actions = torch.as_tensor(self.actions.decode(per_action), dtype=torch.float32)
        return ActionChunk(
            actions=actions.to(value.device),
            log_prob=per_token.sum(-1),
            value=value,
            record={"action_tokens": tokens, "term_log_prob": per_token},
        )

    def _pick(self, log_probs: torch.Tensor, deterministic: bool, generator: torch.Generator | None) -> torch.Tensor:
        if deterministic:
            return log_probs.argmax(-1)
        flat = log_probs.reshape(-1, NUM_BINS).exp()
        return torch.multinomial(flat, 1, generator=generator).view(log_probs.shape[:-1])

    def _decode_causally(
        self, observation: Observation, deterministic: bool, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits, hidden, cache, mask = self._run(observation, None, keep=1, use_cache=True)
        value = self._value(hidden, observation)
        picked = []
        with self._autocast():  # one context for all steps: its casts of the weights are reused
            for position in range(self.positions):
                bins = self._pick(self._action_log_probs(logits), deterministic, generator)
                picked.append(bins)
                if position + 1 < self.positions:
                    mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
                    step = self._token_embeddings()(bins + self.actions.first_token).float()
                    logits = self._action_logits(
                        self.backbone(
                            inputs_embeds=step,
                            attention_mask=mask,
                            past_key_values=cache,
                            use_cache=True,
                            logits_to_keep=1,
                        ).logits
                    )
        return torch.cat(picked, 1), value

    def recompute(self, observation: Observation, chunk: ActionChunk) -> Recomputed:
        bins = chunk.record["action_tokens"].to(self.action_queries.device) - self.actions.first_token
        log_probs, value = self._score(observation, bins)
        per_token = log_probs.gather(-1, bins[..., None]).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1).sum(-1)
        return Recomputed(log_prob=per_token.sum(-1), entropy=entropy, value=value, term_log_prob=per_token)

    def value(self, observation: Observation) -> torch.Tensor:
        return self._value(self._run(observation, None, keep=1)[1], observation)

    def bc_loss(self, observation: Observation, actions: torch.Tensor) -> torch.Tensor:
        """Token cross-entropy of demonstrated actions (B, C, A)."""
        tokens = self.actions.encode(actions.reshape(actions.shape[0], -1, self.spec.action_dim).cpu().numpy())
        bins = torch.as_tensor(tokens - self.actions.first_token, device=self.action_queries.device)
        bins = bins.reshape(actions.shape[0], self.positions)
        log_probs, _ = self._score(observation, bins)
        if self.cfg.label_sigma_bins == 0:
            return -log_probs.gather(-1, bins[..., None]).squeeze(-1).sum(-1).mean()
        return -(smoothed_targets(bins, self.cfg.label_sigma_bins) * log_probs).sum(-1).sum(-1).mean()

    def value_parameters(self) -> list[nn.Parameter]:
        return list(self.value_head.parameters())

    def update_normalization(self, observation: Observation) -> None:
        self.normalizer.update(observation.state.to(self.action_queries.device))


def smoothed_targets(bins: torch.Tensor, sigma: float) -> torch.Tensor:
    """(..., 256) distributions: a Gaussian over bin positions around each of `bins`, truncated
    to the 256 action tokens and normalised. Neighbouring positions are neighbouring actions."""
    positions = torch.arange(NUM_BINS, device=bins.device, dtype=torch.float32)
    weights = torch.exp(-0.5 * ((positions - bins[..., None].float()) / sigma) ** 2)
    return weights / weights.sum(-1, keepdim=True)


@POLICIES.register("token_vla", TokenVLAConfig)
def make_token_vla(cfg: TokenVLAConfig, spec: EnvSpec) -> Policy:
    return TokenVLAPolicy(cfg, spec)
