"""pi0 and pi0.5: the flow VLAs of Physical Intelligence, built from their equations, that
load their checkpoints (the PyTorch layout lerobot and openpi save: `model.safetensors` and
`config.json`) and fine-tune them with this project's flow samplers and RL.

The model (`Pi0Model`):
    prefix = [each camera's SigLIP patch tokens, projected to the VLM's width (not rescaled),
              the instruction's token embeddings x sqrt(width)]
    suffix = [state_proj(state), for each of the H actions: MLP([action_in_proj(x_t), time(t)])]
Two Gemma stacks of equal depth and heads, the VLM (PaliGemma's Gemma) for the prefix and the
action expert for the suffix, share every layer's attention: the prefix sees only itself
(all of its valid tokens), the state token sees the prefix and itself, the action tokens see
everything. Positions count the valid tokens of both. The velocity is action_out_proj of the
action tokens' outputs. Because the prefix never sees the suffix, its per-layer keys and
values are computed once per observation and reused at every denoising step, which is the
context the flow samplers pass around (`_state`).

time(t) is the sinusoid of t with periods from 4e-3 to 4 over the expert's width (sines, then
cosines); t runs from 1 (noise) to 0 (actions), as in `policy=flow`. State and actions are
zero-padded to `max_state_dim` / `max_action_dim` (32): the chunk is denoised in that padded
space, and the env's actions are its first dimensions.

pi0.5 (`policy=pi05`) differs in three places: the state is not a token but text in the
prompt ("Task: <instruction>, State: <256-bin indices>;\nAction: "); the action tokens are
action_in_proj(x_t) alone, all of them seeing each other and the prefix; and the time enters
the action expert through its adaptive norms, conditioned on silu(MLP(time(t))).

Value head (`value_from`): `expert`, the action expert's output at the state token (pi0: it
sees the prefix and the state, never the noisy actions, so one token's pass gives it; pi0.5:
the action tokens' mean output for a zero chunk at t = 1), or `prefix`, the mean of the VLM's
valid outputs with the normalised state. Flow-Noise's noise head reads the action tokens'
outputs. Neither is in a checkpoint: both start fresh.

Architectures (`paligemma_variant`, `expert_variant`): gemma_2b and gemma_300m (pi0 is
gemma_2b + gemma_300m with a 27-layer SigLIP So400m/14 at 224 px), and `tiny` / `tiny_expert`
with a small SigLIP, which run anywhere. `auto` takes them from the checkpoint's config.json."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from embodied.core.errors import ConfigError
from embodied.core.registry import POLICIES
from embodied.core.types import EnvSpec, Observation
from embodied.policies.denoising.flow import FlowPolicyConfig
from embodied.policies.gaussian.mlp import mlp
from embodied.policies.pretrained.gemma import GemmaSize, GemmaStack, SiglipSize, SiglipVision
from embodied.policies.pretrained.pretrained_flow import (
    PretrainedFlowVLA,
    assign_weights,
    check_normalization,
    euler_sample,
    pooled,
    published_config,
    time_features,
)
from embodied.policies.vla.backbones import ByteTokenizer

GEMMA_SIZES = {
    "gemma_2b": GemmaSize(width=2048, depth=18, mlp_dim=16384, num_heads=8, num_kv_heads=1, head_dim=256),
    "gemma_300m": GemmaSize(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256),
    "tiny": GemmaSize(width=64, depth=2, mlp_dim=128, num_heads=2, num_kv_heads=1, head_dim=16),
    "tiny_expert": GemmaSize(width=32, depth=2, mlp_dim=64, num_heads=2, num_kv_heads=1, head_dim=16),
}
SO400M = SiglipSize(width=1152, depth=27, mlp_dim=4304, num_heads=16, patch_size=14)
TINY_SIGLIP = SiglipSize(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=8)
PALIGEMMA_VOCAB = 257152
STATE_BINS = 256  # pi0.5 writes each state dimension as one of 256 bins of [-1, 1]
# pi0.5 reads states quantile-normalised to [-1, 1] (1st and 99th percentiles at the ends);
# the policy's running normaliser gives z-scores, and a normal variable's 1st and 99th
# percentiles lie 2.33 standard deviations out.
Z_AT_99TH_PERCENTILE = 2.33
VALUE_FROM = ("expert", "prefix")

# A pi0 checkpoint's parameter names -> this module's: the policy wrapper's `model.` goes,
# and PaliGemma's nesting becomes `vision`, `projector`, `vlm`; `expert` is the action expert.
RENAMES = (
    ("paligemma_with_expert.paligemma.model.vision_tower.vision_model.", "vision."),
    ("paligemma_with_expert.paligemma.model.multi_modal_projector.linear.", "projector."),
    ("paligemma_with_expert.paligemma.model.language_model.", "vlm."),
    ("paligemma_with_expert.gemma_expert.model.", "expert."),
)
# Language-model heads: pi0 predicts actions, never tokens. PaliGemma's is tied to its token
# embedding, which a checkpoint may store under this name alone.
LM_HEADS = ("paligemma_with_expert.paligemma.lm_head.weight", "paligemma_with_expert.gemma_expert.lm_head.weight")


@dataclass
class Pi0Config(FlowPolicyConfig):
    name: str = "pi0"  # pi0 | pi05
    pretrained: str = ""  # a local folder with model.safetensors (and config.json), or a .safetensors file
    paligemma_variant: str = "auto"  # auto: the checkpoint's config.json, else tiny | gemma_2b | gemma_300m
    expert_variant: str = "auto"  # auto: the checkpoint's config.json, else tiny_expert | gemma_300m | gemma_2b
    vocab_size: int = PALIGEMMA_VOCAB  # PaliGemma's
    max_state_dim: int = 0  # state and actions are zero-padded to these; 0: the checkpoint's, else 32
    max_action_dim: int = 0
    horizon: int = 0  # 0: the checkpoint's chunk_size (pi0's is 50), else 4
    denoise_steps: int = 0  # 0: the checkpoint's num_inference_steps (pi0's is 10), else 4
    image_size: int = 0  # 0: 224 for the real variants, 32 for tiny
    tokenizer: str = ""  # a PaliGemma tokenizer's local path or hub id; empty: UTF-8 bytes (tiny models)
    max_instruction_tokens: int = 0  # 0: the checkpoint's tokenizer_max_length, else 48 (pi0.5: 200)
    train_expert_only: bool = False  # freeze the VLM and the vision encoder
    freeze_vision: bool = False
    value_from: str = "expert"  # expert | prefix
    detach_value_input: bool = True
    # checkpoint: with `pretrained`, the state and action statistics it was trained with (lerobot's
    # processor files or openpi's norm_stats.json; refused if it has none); dataset: computed by
    # SFT from its demonstrations in the model's published mode (pi0 mean/std, pi0.5 quantiles),
    # for a new robot; running: this run's own, from scratch (state z-scores, actions over the
    # env's bounds), as without `pretrained`
    normalization: str = "checkpoint"
    sft_time: str = "beta"  # as pi0 and pi0.5 were trained: Beta(1.5, 1) * 0.999 + 0.001
    # whose statistics, where the checkpoint holds several sets (openpi: assets/<key>/norm_stats.json)
    statistics_key: str = ""
    # which env camera feeds which of the checkpoint's image inputs, in its order: empty (the
    # inputs' own short names), a preset (libero_lerobot | libero_openpi) or
    # <input>=<camera>,... (`empty`: masked, as trained without that camera)
    features: str = ""


@dataclass
class Pi05Config(Pi0Config):
    name: str = "pi05"
    value_from: str = "prefix"  # prefix: mean VLM output + state | expert: the action tokens' mean output


def resolve_architecture(cfg: Pi0Config) -> Pi0Config:
    """`cfg` with the variants (and padded sizes) a checkpoint's config.json names, where they
    are `auto`; refused when anything the checkpoint fixes disagrees with what was asked."""
    saved = published_config(cfg.pretrained) if cfg.pretrained else {}
    if saved and saved.get("type", cfg.name) != cfg.name:
        raise ConfigError(
            f"{cfg.pretrained} holds a '{saved.get('type')}' policy; policy={cfg.name} loads {cfg.name} checkpoints"
        )
    defaults = {"paligemma_variant": "tiny", "expert_variant": "tiny_expert"}
    resolved = {}
    for name in ("paligemma_variant", "expert_variant"):
        value = getattr(cfg, name)
        saved_value = saved.get("action_expert_variant" if name == "expert_variant" else name)
        resolved[name] = value if value != "auto" else (saved_value or defaults[name])
        if resolved[name] not in GEMMA_SIZES:
            raise ConfigError(f"policy.{name} must be one of {sorted(GEMMA_SIZES)} or auto, got '{resolved[name]}'")
    for name in ("max_state_dim", "max_action_dim"):
        asked = getattr(cfg, name)
        if asked and name in saved and saved[name] != asked:
            raise ConfigError(f"{cfg.pretrained} was trained with {name}={saved[name]}; policy.{name} is {asked}")
        resolved[name] = asked or saved.get(name, 32)
    vlm, expert = GEMMA_SIZES[resolved["paligemma_variant"]], GEMMA_SIZES[resolved["expert_variant"]]
    if (vlm.depth, vlm.num_heads, vlm.num_kv_heads, vlm.head_dim) != (
        expert.depth,
        expert.num_heads,
        expert.num_kv_heads,
        expert.head_dim,
    ):
        raise ConfigError(
            f"{resolved['paligemma_variant']} and {resolved['expert_variant']} cannot share attention: "
            f"their depth and heads differ"
        )
    # as the checkpoint was trained and sampled, unless asked otherwise
    resolved["horizon"] = cfg.horizon or int(saved.get("chunk_size") or 4)
    resolved["denoise_steps"] = cfg.denoise_steps or int(saved.get("num_inference_steps") or 4)
    default_tokens = 200 if cfg.name == "pi05" else 48  # pi0.5's prompt carries the state
    resolved["max_instruction_tokens"] = cfg.max_instruction_tokens or int(
        saved.get("tokenizer_max_length") or default_tokens
    )
    if cfg.image_size:
        image_size = cfg.image_size
    elif resolved["paligemma_variant"] == "tiny":
        image_size = 32
    else:
        image_size = (saved.get("image_resolution") or [224])[0]
    return replace(cfg, image_size=int(image_size), **resolved)


class Pi0Model(nn.Module):
    """The network itself: vision encoder, VLM, action expert and the projections between them."""

    def __init__(self, cfg: Pi0Config):
        super().__init__()
        vlm, expert = GEMMA_SIZES[cfg.paligemma_variant], GEMMA_SIZES[cfg.expert_variant]
        vision = TINY_SIGLIP if cfg.paligemma_variant == "tiny" else SO400M
        if cfg.image_size % vision.patch_size:
            raise ConfigError(
                f"policy.image_size must be a multiple of the vision patch ({vision.patch_size}), got {cfg.image_size}"
            )
        self.vision = SiglipVision(vision, cfg.image_size)
        self.projector = nn.Linear(vision.width, vlm.width)
        self.pi05 = cfg.name == "pi05"
        self.vlm = GemmaStack(vlm, vocab_size=cfg.vocab_size)
        self.expert = GemmaStack(expert, adaptive=self.pi05)
        self.action_in_proj = nn.Linear(cfg.max_action_dim, expert.width)
        self.action_out_proj = nn.Linear(expert.width, cfg.max_action_dim)
        if self.pi05:
            self.time_mlp_in = nn.Linear(expert.width, expert.width)
            self.time_mlp_out = nn.Linear(expert.width, expert.width)
        else:
            self.state_proj = nn.Linear(cfg.max_state_dim, expert.width)
            self.action_time_mlp_in = nn.Linear(2 * expert.width, expert.width)
            self.action_time_mlp_out = nn.Linear(expert.width, expert.width)

    # ---- prefix ----------------------------------------------------------------------------
    def embed_prefix(
        self,
        images: list[torch.Tensor],
        image_masks: list[torch.Tensor],
        tokens: torch.Tensor,
        token_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Images (B, 3, S, S) in [-1, 1], whether each camera is there (B,), instruction token
        ids and mask (B, T) -> the prefix embeddings (B, L, width) and which are valid (B, L)."""
        embeddings, valid = [], []
        for pixels, present in zip(images, image_masks):
            patches = self.projector(self.vision(pixels))
            embeddings.append(patches)
            valid.append(present[:, None].expand(-1, patches.shape[1]))
        words = self.vlm.embed_tokens(tokens)
        embeddings.append(words * math.sqrt(words.shape[-1]))
        valid.append(token_mask.bool())
        return torch.cat(embeddings, 1), torch.cat(valid, 1)

    def encode_prefix(
        self, embeddings: torch.Tensor, valid: torch.Tensor
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """The VLM over the prefix, each valid token seeing every valid token: its outputs and
        every layer's keys and values."""
        positions = valid.long().cumsum(1) - 1
        return self.vlm(embeddings, positions, valid[:, None, :] & valid[:, :, None])

    # ---- suffix ----------------------------------------------------------------------------
    def embed_suffix(
        self, state: torch.Tensor, x: torch.Tensor | None, t: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The suffix tokens and the expert's norm condition (pi0.5; None for pi0). pi0:
        [state token, H action tokens] (B, 1 + H, width), the state token alone without x;
        pi0.5: the H action tokens."""
        if self.pi05:
            condition = time_features(t, self.action_in_proj.out_features)
            condition = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(condition))))
            return self.action_in_proj(x), condition
        tokens = [self.state_proj(state)[:, None]]
        if x is not None:
            actions = self.action_in_proj(x)
            times = time_features(t, actions.shape[-1])[:, None].expand_as(actions)
            fused = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(torch.cat([actions, times], -1))))
            tokens.append(fused)
        return torch.cat(tokens, 1), None

    def run_suffix(
        self,
        suffix: torch.Tensor,
        condition: torch.Tensor | None,
        prefix_valid: torch.Tensor,
        prefix_cache: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> torch.Tensor:
        """The action expert over the suffix, attending to the cached prefix. pi0: the state
        token sees the prefix and itself, the action tokens the prefix and the whole suffix;
        pi0.5: every action token sees the prefix and the whole suffix."""
        batch, length = suffix.shape[:2]
        positions = prefix_valid.long().sum(1, keepdim=True) + torch.arange(length, device=suffix.device)
        own = torch.ones(length, length, dtype=torch.bool, device=suffix.device)
        if not self.pi05:
            own[0, 1:] = False
        mask = torch.cat([prefix_valid[:, None, :].expand(-1, length, -1), own.expand(batch, -1, -1)], 2)
        return self.expert(suffix, positions, mask, past=prefix_cache, cond=condition)[0]

    def velocity(
        self,
        state: torch.Tensor,
        x: torch.Tensor,
        t: torch.Tensor,
        prefix_valid: torch.Tensor,
        prefix_cache: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The velocity (B, H, max_action_dim) of noisy chunks x at times t, and the action
        tokens' outputs (B, H, width)."""
        out = self.run_suffix(*self.embed_suffix(state, x, t), prefix_valid, prefix_cache)
        out = out if self.pi05 else out[:, 1:]
        return self.action_out_proj(out), out

    @torch.no_grad()
    def sample(
        self,
        images: list[torch.Tensor],
        image_masks: list[torch.Tensor],
        tokens: torch.Tensor,
        token_mask: torch.Tensor,
        state: torch.Tensor,
        noise: torch.Tensor,
        steps: int,
    ) -> torch.Tensor:
        """The ODE from `noise` (B, H, max_action_dim) at t = 1 to actions at t = 0 in `steps`
        Euler steps: pi0's own inference, for checking a loaded checkpoint."""
        embeddings, valid = self.embed_prefix(images, image_masks, tokens, token_mask)
        _, cache = self.encode_prefix(embeddings, valid)
        return euler_sample(lambda x, t: self.velocity(state, x, t, valid, cache)[0], noise, steps)


def load_checkpoint(model: Pi0Model, path: str) -> None:
    """Load a pi0 checkpoint's weights into `model` (which may be on the meta device: the
    loaded tensors become its parameters, in float32), refusing any mismatch by name: every
    parameter must be there, at its shape, and nothing but the language heads left over."""
    from safetensors.torch import load_file

    file = Path(path) / "model.safetensors" if Path(path).is_dir() else Path(path)
    if not file.is_file():
        raise ConfigError(f"policy.pretrained: no {file}")
    saved = load_file(str(file))
    renamed, tied_embedding = {}, None
    for key, tensor in saved.items():
        key = key.removeprefix("model.")
        if key in LM_HEADS:
            if key == LM_HEADS[0]:
                tied_embedding = tensor
            continue
        for old, new in RENAMES:
            if key.startswith(old):
                key = new + key[len(old) :]
                break
        renamed[key] = tensor.float() if tensor.is_floating_point() else tensor
    if "vlm.embed_tokens.weight" not in renamed and tied_embedding is not None:
        renamed["vlm.embed_tokens.weight"] = tied_embedding
    assign_weights(model, renamed, file, "policy=pi0 with paligemma_variant/expert_variant as resolved")


def prompts(instructions: list[str], state: torch.Tensor | None) -> list[str]:
    """pi0's prompt: the instruction (underscores and newlines made spaces) and a newline;
    pi0.5's, given the state in [-1, 1]: "Task: <instruction>, State: <bins>;\nAction: ", each
    dimension as the index of its bin among 256 equal ones."""
    cleaned = [text.strip().replace("_", " ").replace("\n", " ") for text in instructions]
    if state is None:
        return [text + "\n" for text in cleaned]
    edges = torch.linspace(-1.0, 1.0, STATE_BINS + 1, dtype=torch.float64)[:-1]
    bins = torch.bucketize(state.detach().cpu().double(), edges, right=True) - 1
    return [f"Task: {text}, State: {' '.join(map(str, row.tolist()))};\nAction: " for text, row in zip(cleaned, bins)]


def resize_with_pad(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 frames (B, H, W, 3) -> (B, 3, size, size) in [-1, 1]: resized keeping the aspect
    ratio (bilinear), then padded with black, centred."""
    pixels = images.permute(0, 3, 1, 2).float() / 255.0 * 2.0 - 1.0
    height, width = pixels.shape[-2:]
    if (height, width) == (size, size):
        return pixels
    ratio = max(width / size, height / size)
    new_height, new_width = int(height / ratio), int(width / ratio)
    pixels = F.interpolate(pixels, size=(new_height, new_width), mode="bilinear", align_corners=False).clamp(-1, 1)
    top, left = (size - new_height) // 2, (size - new_width) // 2
    return F.pad(pixels, (left, size - new_width - left, top, size - new_height - top), value=-1.0)


class PaliGemmaPrompt:
    """A PaliGemma tokenizer as pi0 uses it: BOS and the prompt, cut and right-padded to the
    length."""

    def __init__(self, path: str):
        from transformers import AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as error:
            raise ConfigError(f"policy.tokenizer '{path}' could not be loaded: {error}") from None

    def __call__(self, texts: list[str], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.zeros(len(texts), length, dtype=torch.long)
        mask = torch.zeros(len(texts), length, dtype=torch.long)
        for row, text in enumerate(texts):
            bos = [self.tokenizer.bos_token_id] if self.tokenizer.bos_token_id is not None else []
            tokens = [*bos, *self.tokenizer.encode(text, add_special_tokens=False)][:length]
            ids[row, : len(tokens)] = torch.tensor(tokens)
            mask[row, : len(tokens)] = 1
        return ids, mask


class Pi0Policy(PretrainedFlowVLA):
    def __init__(self, cfg: Pi0Config, spec: EnvSpec):
        if cfg.value_from not in VALUE_FROM:
            raise ConfigError(f"policy.value_from must be one of {VALUE_FROM}, got '{cfg.value_from}'")
        check_normalization(cfg)  # before the checkpoint is read
        cfg = resolve_architecture(cfg)
        if spec.state_dim > cfg.max_state_dim or spec.action_dim > cfg.max_action_dim:
            raise ConfigError(
                f"the env's state ({spec.state_dim}) and actions ({spec.action_dim}) must fit "
                f"policy.max_state_dim={cfg.max_state_dim} and max_action_dim={cfg.max_action_dim}"
            )
        if not cfg.tokenizer and cfg.paligemma_variant != "tiny":
            raise ConfigError(
                f"policy.tokenizer: a {cfg.paligemma_variant} VLM reads PaliGemma's tokens; give the "
                f"local path of a PaliGemma tokenizer (e.g. google/paligemma-3b-pt-224's files)"
            )
        tokenizer = PaliGemmaPrompt(cfg.tokenizer) if cfg.tokenizer else ByteTokenizer()
        if cfg.pretrained:  # no random init of weights about to be replaced (billions, for the real sizes)
            with torch.device("meta"):
                model = Pi0Model(cfg)
            load_checkpoint(model, cfg.pretrained)
        else:
            model = Pi0Model(cfg)
        super().__init__(cfg, spec, context_dim=self._context_width(cfg, model))
        self.model, self.instructions = model, tokenizer
        self.published_mode = "QUANTILES" if model.pi05 else "MEAN_STD"  # as lerobot and openpi train each
        self._use_normalization(cfg, spec, published_config(cfg.pretrained) if cfg.pretrained else {})
        if cfg.train_expert_only:
            for part in (model.vision, model.projector, model.vlm):
                part.requires_grad_(False)
        if cfg.freeze_vision:
            model.vision.requires_grad_(False)

    def fsdp_units(self) -> list[nn.Module]:
        """Each is run through its own forward: the vision tower, the token embedding, the VLM
        and the action expert (the embedding first: it lies inside the VLM's module)."""
        return [self.model.vision, self.model.vlm.embed_tokens, self.model.vlm, self.model.expert]

    @staticmethod
    def _context_width(cfg: Pi0Config, model: Pi0Model) -> int:
        vlm = model.vlm.size
        return 1 + cfg.max_state_dim + vlm.width + vlm.depth * 2 * vlm.num_kv_heads * vlm.head_dim

    def _action_width(self) -> int:
        return self.cfg.max_action_dim

    def _build_heads(self, context_dim: int) -> None:
        cfg = self.cfg
        expert_width = GEMMA_SIZES[cfg.expert_variant].width
        self.noise_head = nn.Linear(expert_width, cfg.max_action_dim)
        nn.init.normal_(self.noise_head.weight, std=0.01)
        nn.init.zeros_(self.noise_head.bias)
        value_dim = (
            expert_width if cfg.value_from == "expert" else GEMMA_SIZES[cfg.paligemma_variant].width + cfg.max_state_dim
        )
        self.critic = mlp([value_dim, *cfg.critic_hidden, 1], nn.Tanh, out_gain=1.0)

    # The context the flow reads, one tensor (B, L, C) so the samplers select its rows as they
    # do a state vector. Per prefix token: [valid, the padded normalised state (the same on
    # every token), the VLM's output, each layer's key and value].
    def _state(self, observation: Observation) -> torch.Tensor:
        device = self.low.device
        state = self._normalized_state(observation)
        state = F.pad(state, (0, self.cfg.max_state_dim - state.shape[-1]))
        batch = state.shape[0]
        images = [resize_with_pad(observation.images[name].to(device), self.cfg.image_size) for name in self.cameras]
        present = [torch.ones(batch, dtype=torch.bool, device=device) for _ in images]
        instructions = observation.instruction or [""] * batch
        unit_state = None
        if self.model.pi05:  # a checkpoint's statistics put it in [-1, 1] as pi0.5 was trained
            unit_state = state if self.fixed_statistics else (state / Z_AT_99TH_PERCENTILE).clamp(-1, 1)
        tokens, token_mask = self.instructions(prompts(instructions, unit_state), self.cfg.max_instruction_tokens)
        embeddings, valid = self.model.embed_prefix(images, present, tokens.to(device), token_mask.to(device))
        hidden, cache = self.model.encode_prefix(embeddings, valid)
        keys_values = [part.transpose(1, 2).flatten(2) for pair in cache for part in pair]  # each (B, L, kv x d)
        length = valid.shape[1]
        return torch.cat(
            [valid[..., None].to(hidden.dtype), state[:, None].expand(-1, length, -1), hidden, *keys_values], -1
        )

    def _unpack(
        self, context: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        size, state_dim = self.model.vlm.size, self.cfg.max_state_dim
        valid = context[..., 0] > 0.5
        state = context[:, 0, 1 : 1 + state_dim]
        hidden = context[..., 1 + state_dim : 1 + state_dim + size.width]
        flat = context[..., 1 + state_dim + size.width :].split(size.num_kv_heads * size.head_dim, -1)
        heads = [part.unflatten(-1, (size.num_kv_heads, size.head_dim)).transpose(1, 2) for part in flat]
        return valid, state, hidden, list(zip(heads[0::2], heads[1::2]))

    def _field(
        self, context: torch.Tensor, x: torch.Tensor, t: torch.Tensor, noise: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        valid, state, _, cache = self._unpack(context)
        chunk = x.view(len(x), self.cfg.horizon, self.action_width)
        velocity, tokens = self.model.velocity(state, chunk, t, valid, cache)
        return velocity.reshape(x.shape), self.noise_head(tokens).reshape(x.shape) if noise else None

    def _latent_width(self) -> int:
        return GEMMA_SIZES[self.cfg.paligemma_variant].width + self.cfg.max_state_dim

    def latent_input(self, context: torch.Tensor) -> torch.Tensor:
        """DSRL's latent actor reads the prefix pooled over its valid tokens, and the state."""
        valid, state, hidden, _ = self._unpack(context)
        return torch.cat([pooled(hidden, valid), state], -1)

    def _value(self, context: torch.Tensor) -> torch.Tensor:
        valid, state, hidden, cache = self._unpack(context)
        if self.cfg.value_from == "expert" and self.model.pi05:
            batch = len(state)
            query = torch.zeros(batch, self.cfg.horizon, self.action_width, device=state.device)
            features = self.model.velocity(state, query, torch.ones(batch, device=state.device), valid, cache)[1].mean(
                1
            )
        elif self.cfg.value_from == "expert":
            features = self.model.run_suffix(*self.model.embed_suffix(state, None, None), valid, cache)[:, 0]
        else:
            features = torch.cat([pooled(hidden, valid), state], -1)
        return self.critic(features.detach() if self.cfg.detach_value_input else features).squeeze(-1)


@POLICIES.register("pi0", Pi0Config)
def make_pi0(cfg: Pi0Config, spec: EnvSpec) -> Pi0Policy:
    return Pi0Policy(cfg, spec)


@POLICIES.register("pi05", Pi05Config)
def make_pi05(cfg: Pi05Config, spec: EnvSpec) -> Pi0Policy:
    return Pi0Policy(cfg, spec)
