"""The reference side of the pi0 parity test; runs under the reference virtualenv
(.venv-pi0ref: lerobot 0.4.4 and transformers 4.57, made by tools/setup.sh test).

    python pi0_reference.py <work folder>

Reads `spec.json` and `inputs.npz` there, builds lerobot's PI0Policy at the sizes the spec
gives with every weight drawn at random, saves it with lerobot's own `save_pretrained`
(`checkpoint/`), and writes the action chunk its `sample_actions` makes from the given noise
(`reference.npz`).

lerobot's pi0 runs on its fork of transformers, which is not on PyPI. On the released 4.57 it
needs four changes, each what the fork (and openpi's model) does:
  1. the fork's version check module;
  2. PaliGemma's image features are not divided by sqrt(width);
  3. Gemma does not multiply its input embeddings by sqrt(width) (pi0 scales the
     instruction's embeddings itself);
  4. a denoising step attends to the prefix's cached keys and values without appending its
     own to them (the released cache always appends).
The sizes come in through lerobot's own hooks: its Gemma variant table, and the PaliGemma
config it builds (vision tower width and depth)."""

from __future__ import annotations

import copy
import json
import math
import sys
import types
from pathlib import Path

import numpy as np
import torch


def import_torchvision() -> None:
    """The registry's torchvision needs its two operator schemas on a CPU torch."""
    try:
        import torchvision  # noqa: F401
    except RuntimeError:
        library = torch.library.Library("torchvision", "DEF")
        library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        library.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
        import_torchvision.library = library
        import torchvision  # noqa: F401


def adapt_transformers() -> None:
    check = types.ModuleType("transformers.models.siglip.check")
    check.check_whether_transformers_replace_is_installed_correctly = lambda: True
    sys.modules[check.__name__] = check

    from transformers.models.gemma.modeling_gemma import GemmaModel
    from transformers.models.paligemma.modeling_paligemma import PaliGemmaModel

    def image_features(self, pixel_values):
        return self.multi_modal_projector(self.vision_tower(pixel_values).last_hidden_state)

    PaliGemmaModel.get_image_features = image_features

    gemma_forward = GemmaModel.forward

    def unscaled_forward(self, *args, inputs_embeds=None, **kwargs):
        normalizer = torch.tensor(self.config.hidden_size ** 0.5, dtype=inputs_embeds.dtype)
        return gemma_forward(self, *args, inputs_embeds=inputs_embeds / normalizer, **kwargs)

    GemmaModel.forward = unscaled_forward


def sized_model_classes(spec: dict) -> None:
    from lerobot.policies.pi0 import modeling_pi0

    sizes = {"gemma_2b": spec["vlm"], "gemma_300m": spec["expert"]}
    modeling_pi0.get_gemma_config = lambda variant: modeling_pi0.GemmaConfig(
        width=sizes[variant]["width"], depth=sizes[variant]["depth"], mlp_dim=sizes[variant]["mlp_dim"],
        num_heads=sizes[variant]["num_heads"], num_kv_heads=sizes[variant]["num_kv_heads"],
        head_dim=sizes[variant]["head_dim"])

    paligemma_class = modeling_pi0.PaliGemmaForConditionalGeneration

    def sized_paligemma(config):
        vision = spec["vision"]
        config.vision_config.hidden_size = vision["width"]
        config.vision_config.num_hidden_layers = vision["depth"]
        config.vision_config.intermediate_size = vision["mlp_dim"]
        config.vision_config.num_attention_heads = vision["num_heads"]
        config.vision_config.patch_size = vision["patch_size"]
        config.vision_config.projection_dim = config.text_config.hidden_size
        config.text_config.vocab_size = spec["vocab_size"]
        config._vocab_size = spec["vocab_size"]
        return paligemma_class(config=config)

    modeling_pi0.PaliGemmaForConditionalGeneration = sized_paligemma

    denoise_step = modeling_pi0.PI0Pytorch.denoise_step

    def step_on_prefix(self, state, prefix_pad_masks, past_key_values, x_t, timestep):
        return denoise_step(self, state, prefix_pad_masks, copy.deepcopy(past_key_values), x_t, timestep)

    modeling_pi0.PI0Pytorch.denoise_step = step_on_prefix


def main(work: Path) -> None:
    spec = json.loads((work / "spec.json").read_text())
    import_torchvision()
    adapt_transformers()
    sized_model_classes(spec)
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.pi0.configuration_pi0 import PI0Config
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy

    size = spec["image_size"]
    cameras = [f"observation.images.camera{i}" for i in range(spec["cameras"])]
    config = PI0Config(
        chunk_size=spec["horizon"], n_action_steps=spec["horizon"], max_state_dim=spec["max_state_dim"],
        max_action_dim=spec["max_action_dim"], num_inference_steps=spec["steps"], image_resolution=(size, size),
        device="cpu", tokenizer_max_length=spec["tokens"],
        input_features={"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(spec["max_state_dim"],)),
                        **{name: PolicyFeature(type=FeatureType.VISUAL, shape=(3, size, size)) for name in cameras}},
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(spec["max_action_dim"],))})
    policy = PI0Policy(config).eval()
    generator = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():  # every weight random and of a size that matters, norms included
        for parameter in policy.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) / math.sqrt(max(parameter.shape[-1], 1)))
    policy.save_pretrained(work / "checkpoint")

    inputs = np.load(work / "inputs.npz")
    images = [torch.from_numpy(inputs[f"image{i}"]) for i in range(spec["cameras"])]
    image_masks = [torch.from_numpy(inputs[f"image_mask{i}"]) for i in range(spec["cameras"])]
    with torch.no_grad():
        actions = policy.model.sample_actions(images, image_masks, torch.from_numpy(inputs["tokens"]),
                                              torch.from_numpy(inputs["token_mask"]), torch.from_numpy(inputs["state"]),
                                              noise=torch.from_numpy(inputs["noise"]))
    np.savez(work / "reference.npz", actions=actions.numpy())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
