"""OpenVLA / OpenVLA-OFT (policy=openvla) at tiny widths with the published key names, CPU."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec, Observation
from embodied.policies.pretrained.openvla import OpenVLAConfig, OpenVLAPolicy, OpenVLAPrompt
from embodied.policies.pretrained.openvla_checkpoint import current_names, installed_names
from embodied.policies.pretrained.prismatic import ImagePixels, tower_spec
from embodied.policies.pretrained.statistics import read_checkpoint_statistics, read_openvla_statistics
from embodied.policies.vla.action_tokens import ActionTokenizer
from embodied.runtime.wire import published_weights

HERE = Path(__file__).parent
SPEC = EnvSpec(
    state_dim=5,
    action_dim=3,
    action_low=(-1.0, -2.0, 0.0),
    action_high=(1.0, 2.0, 1.0),
    image_shapes={"image": (40, 48, 3), "wrist": (40, 48, 3)},
)
FLOAT32 = dict(precision="float32", lora_rank=0)


def observation(batch=3, seed=0) -> Observation:
    g = torch.Generator().manual_seed(seed)
    images = {
        name: torch.randint(0, 256, (batch, 40, 48, 3), generator=g, dtype=torch.uint8) for name in ("image", "wrist")
    }
    texts = ["Push the cube", "lift it up high please", ""][:batch]
    return Observation(state=torch.randn(batch, 5, generator=g), images=images, instruction=texts)


def tiny(**overrides) -> OpenVLAPolicy:
    torch.manual_seed(0)
    return OpenVLAPolicy(OpenVLAConfig(**{**FLOAT32, **overrides}), SPEC)


def published_patterns(shapes: dict) -> set[str]:
    return {re.sub(r"\.(\d+)\.", ".{i}.", name) for name in shapes}


def test_the_7b_architecture_builds_exactly_the_published_tensors():
    expected = {}
    for line in (HERE / "openvla_7b_tensors.txt").read_text().splitlines():
        if line.startswith("#"):
            continue
        pattern, shape, count = line.split()
        for index in range(int(count)):
            expected[pattern.replace("{i}", str(index))] = tuple(int(d) for d in shape.split("x"))
    spec = EnvSpec(
        state_dim=8, action_dim=7, action_low=(-1.0,) * 7, action_high=(1.0,) * 7, image_shapes={"image": (224, 224, 3)}
    )
    with torch.device("meta"):  # 7.5 B parameters: shapes only
        policy = OpenVLAPolicy(OpenVLAConfig(variant="7b", **FLOAT32), spec)
    assert policy.published_shapes() == expected
    assert len(expected) == 982


def test_a_tiny_model_names_every_published_tensor_and_round_trips_bit_exactly(tmp_path):
    listed = {
        line.split()[0]
        for line in (HERE / "openvla_7b_tensors.txt").read_text().splitlines()
        if not line.startswith("#")
    }
    policy = tiny()
    with torch.no_grad():  # LayerScale and position embeddings away from their initial values
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.01)
        policy.vision.featurizer.model.embeddings.position_embeddings[:, 0] = 0
    assert published_patterns(policy.published_shapes()) == listed
    folder = policy.save_published(tmp_path / "openvla", dtype=torch.float32)
    loaded = OpenVLAPolicy(OpenVLAConfig(pretrained=str(folder), statistics_key="env_bounds", **FLOAT32), SPEC)
    theirs, ours = loaded.published_state_dict(), policy.published_state_dict()
    assert set(theirs) == set(ours)
    for name in ours:
        assert torch.equal(theirs[name], ours[name]), name
    mine = policy.state_dict()
    for name, value in loaded.state_dict().items():
        if name.startswith(("backbone.", "vision.", "projector.")) and not name.endswith("mask_token"):
            assert torch.equal(value, mine[name]), name
    obs = observation()
    torch.testing.assert_close(
        loaded.act(obs, deterministic=True).actions, policy.act(obs, deterministic=True).actions, rtol=0, atol=0
    )


def test_a_checkpoint_that_does_not_fit_is_refused_with_what_is_missing_left_over_or_misshapen(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tiny().save_published(tmp_path / "openvla", dtype=torch.float32)
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["vision_backbone.featurizer.blocks.1.ls1.scale_factor"]
    tensors["vision_backbone.featurizer.blocks.1.ls1.gamma"] = torch.ones(32)
    tensors["projector.fc3.weight"] = torch.zeros(3, 3)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ConfigError) as error:
        OpenVLAPolicy(OpenVLAConfig(pretrained=str(folder), statistics_key="env_bounds", **FLOAT32), SPEC)
    message = str(error.value)
    assert "missing: vision_backbone.featurizer.blocks.1.ls1.scale_factor" in message
    assert "left over: vision_backbone.featurizer.blocks.1.ls1.gamma" in message
    assert "of another shape: projector.fc3.weight (3, 3)" in message


def _layer_norm(x, tensors, name):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], tensors[name + ".weight"], tensors[name + ".bias"], 1e-6)


def timm_vit(tensors: dict, prefix: str, pixels: torch.Tensor, family: str) -> torch.Tensor:
    """A timm ViT written out from its published tensors in float64: patch embedding, position
    embedding (DINOv2: patches only, then class and register tokens in front), blocks up to
    the second-to-last, prefix tokens dropped."""
    t = {k.removeprefix(prefix): v.double() for k, v in tensors.items() if k.startswith(prefix)}
    spec = tower_spec("tiny_dinov2_reg4" if family == "dinov2" else "tiny_siglip")
    x = torch.nn.functional.conv2d(pixels, t["patch_embed.proj.weight"], t["patch_embed.proj.bias"], stride=spec.patch)
    x = x.flatten(2).transpose(1, 2) + t["pos_embed"]
    if family == "dinov2":
        x = torch.cat([t["cls_token"].expand(len(x), -1, -1), t["reg_token"].expand(len(x), -1, -1), x], 1)
    heads, width = spec.heads, spec.width
    for i in range(spec.depth - 1):
        b = f"blocks.{i}."
        y = _layer_norm(x, t, b + "norm1")
        q, k, v = (y @ t[b + "attn.qkv.weight"].T + t[b + "attn.qkv.bias"]).chunk(3, -1)
        q, k, v = (z.reshape(len(x), -1, heads, width // heads).transpose(1, 2) for z in (q, k, v))
        attention = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(width // heads), -1) @ v
        attention = (
            attention.transpose(1, 2).reshape(len(x), -1, width) @ t[b + "attn.proj.weight"].T + t[b + "attn.proj.bias"]
        )
        x = x + (attention * t[b + "ls1.scale_factor"] if family == "dinov2" else attention)
        y = _layer_norm(x, t, b + "norm2")
        y = torch.nn.functional.gelu(y @ t[b + "mlp.fc1.weight"].T + t[b + "mlp.fc1.bias"])
        y = y @ t[b + "mlp.fc2.weight"].T + t[b + "mlp.fc2.bias"]
        x = x + (y * t[b + "ls2.scale_factor"] if family == "dinov2" else y)
    return x[:, 1 + spec.registers :] if family == "dinov2" else x


def test_the_fused_towers_equal_timm_towers_written_out_in_float64_at_the_second_to_last_block():
    policy = tiny()
    with torch.no_grad():
        for p in policy.vision.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        policy.vision.featurizer.model.embeddings.position_embeddings[:, 0] = 0
    tensors = policy.published_state_dict()
    pixels = torch.randn(2, 6, 56, 56, dtype=torch.float64)
    expected = torch.cat(
        [
            timm_vit(tensors, "vision_backbone.featurizer.", pixels[:, :3], "dinov2"),
            timm_vit(tensors, "vision_backbone.fused_featurizer.", pixels[:, 3:], "siglip"),
        ],
        -1,
    )
    found = policy.vision.double()(pixels)
    assert found.shape == (2, 16, 32 + 48)
    torch.testing.assert_close(found, expected, rtol=0, atol=1e-10)


def test_patches_follow_each_rows_bos_and_padded_rows_score_as_they_do_alone():
    policy = tiny()
    obs = observation()
    prefix, mask = policy._prefix(obs)
    ids, _ = policy.instructions(obs.instruction, 256)
    patches = policy._patches(obs)
    embed = policy._token_embeddings()
    for row in range(3):
        tokens = policy.instructions.rows([obs.instruction[row]])[0]
        alone = torch.cat([embed(torch.tensor(tokens[:1])), patches[row], embed(torch.tensor(tokens[1:]))])
        content = mask[row].bool()
        torch.testing.assert_close(prefix[row, content], alone, rtol=0, atol=0)
        with torch.no_grad():
            logits = policy.backbone(inputs_embeds=alone[None]).logits[0, -1]
            batched = policy.backbone(inputs_embeds=prefix, attention_mask=mask).logits[row, -1]
        torch.testing.assert_close(batched, logits, rtol=0, atol=2e-5)


def test_action_tokens_decode_by_the_published_rule_in_float64(tmp_path):
    q01, q99 = np.array([-0.03, -0.5, 0.1, 0.0]), np.array([0.04, 0.7, 0.3, 1.0])
    mask = np.array([True, True, True, False])
    action = {"q01": q01.tolist(), "q99": q99.tolist(), "mask": mask.tolist()}
    (tmp_path / "dataset_statistics.json").write_text(json.dumps({"libero_10_no_noops": {"action": action}}))
    tokenizer = ActionTokenizer(32000, read_openvla_statistics(tmp_path).action)
    tokens = np.arange(31744, 32000)[:, None].repeat(4, 1)
    centres = (np.linspace(-1, 1, 256)[:-1] + np.linspace(-1, 1, 256)[1:]) / 2
    normalized = centres[np.clip(32000 - tokens - 1, 0, 254)]
    expected = np.where(mask, 0.5 * (normalized + 1) * (q99 - q01) + q01, normalized)
    # one affine map per dimension (the normaliser every pretrained model shares) against the
    # published arithmetic: a few ulps apart in float64, identical once cast to float32
    np.testing.assert_allclose(tokenizer.decode(tokens), expected, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(tokenizer.decode(tokens).astype(np.float32), expected.astype(np.float32))


def test_the_prompt_and_the_image_processing_are_the_published_ones(tmp_path):
    from PIL import Image

    prompt = OpenVLAPrompt.bytes()
    row = prompt.rows(["Put The Bowl on the plate"])[0]
    text = "In: What action should the robot take to put the bowl on the plate?\nOut:"
    assert row == [257, *[b + 1 for b in text.encode()], 258]  # BOS, the prompt, then "▁"
    # the published processor: PIL bicubic to 224, to [0, 1], (x - mean) / std per tower; its
    # stored DINOv2 constants are rounded to bfloat16 and are what it applies
    dino = {"mean": [0.484375, 0.455078125, 0.40625], "std": [0.228515625, 0.2236328125, 0.224609375]}
    siglip = {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}
    frame = np.random.default_rng(0).integers(0, 256, (128, 160, 3), dtype=np.uint8)
    resized = np.asarray(Image.fromarray(frame).resize((224, 224), Image.BICUBIC), dtype=np.float64) / 255
    expected = np.concatenate(
        [((resized - np.array(p["mean"])) / np.array(p["std"])).transpose(2, 0, 1) for p in (dino, siglip)]
    )
    specs = [tower_spec("vit_large_patch14_reg4_dinov2.lvd142m"), tower_spec("vit_so400m_patch14_siglip_224")]
    pixels = ImagePixels(specs, normalization=[(dino["mean"], dino["std"]), (siglip["mean"], siglip["std"])])
    found = pixels(torch.as_tensor(frame)[None])[0].double().numpy()
    assert found.shape == (6, 224, 224)
    # torch's antialiased bicubic on 8-bit pixels against PIL's: one level apart on few pixels
    levels = np.abs(found[3:] - expected[3:]) * 0.5 * 255
    assert levels.max() <= 1.001 and np.mean(levels > 0.5) < 0.01
    np.testing.assert_allclose(found[:3], expected[:3], rtol=0, atol=1.001 / 255 / 0.2236328125)
    # a checkpoint folder's preprocessor_config.json is where the constants come from
    policy = tiny()
    folder = policy.save_published(tmp_path / "openvla", dtype=torch.float32)
    (folder / "preprocessor_config.json").write_text(json.dumps({"tvf_normalize_params": [dino, siglip]}))
    loaded = OpenVLAPolicy(OpenVLAConfig(pretrained=str(folder), statistics_key="env_bounds", **FLOAT32), SPEC)
    torch.testing.assert_close(loaded.pixels.mean.flatten()[:3], torch.tensor(dino["mean"]))


def test_statistics_come_from_the_checkpoint_by_statistics_key_and_their_absence_is_refused(tmp_path):
    action = {"q01": [-0.5, -1.0, 0.0], "q99": [0.5, 1.0, 1.0], "mask": [True, True, False]}
    config = {"norm_stats": {"bridge_orig": {"action": action}, "libero_goal_no_noops": {"action": action}}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"policy.statistics_key=<one of \['bridge_orig', 'libero_goal_no_noops'\]>"):
        read_openvla_statistics(tmp_path)
    found = read_checkpoint_statistics(tmp_path, quantiles=False, key="libero_goal")  # the one reader of all layouts
    assert found.key == "libero_goal_no_noops" and found.published == {"action": action} and found.state is None
    assert found.action.source == f"{tmp_path / 'config.json'}:norm_stats[libero_goal_no_noops].action"
    (tmp_path / "config.json").write_text(json.dumps({}))
    with pytest.raises(ConfigError, match="no normalisation statistics"):
        read_openvla_statistics(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"norm_stats": {"x": {"action": {"q01": [0.0]}}}}))
    with pytest.raises(ConfigError, match=r"norm_stats\[x\].action: statistics \['q99'\] are missing"):
        read_openvla_statistics(tmp_path)
    # a saved model's statistics unnormalise its actions; the mask leaves the gripper as it is
    folder = tiny().save_published(tmp_path / "openvla", dtype=torch.float32)
    (folder / "dataset_statistics.json").write_text(json.dumps({"bridge_orig": {"action": action}}))
    loaded = OpenVLAPolicy(OpenVLAConfig(pretrained=str(folder), **FLOAT32), SPEC)
    np.testing.assert_array_equal(loaded.actions.unnormalize(np.array([[1.0, 1.0, 0.3]])), [[0.5, 1.0, 0.3]])
    np.testing.assert_array_equal(loaded.actions.normalize(np.array([[-0.5, 0.0, 0.7]])), [[-1.0, 0.0, 0.7]])
    wrong = EnvSpec(
        state_dim=5, action_dim=7, action_low=(-1.0,) * 7, action_high=(1.0,) * 7, image_shapes=SPEC.image_shapes
    )
    with pytest.raises(
        ConfigError, match=r"\[bridge_orig\].action: statistics of shape \(3,\) do not fit the env's \(7,\)"
    ):
        OpenVLAPolicy(OpenVLAConfig(pretrained=str(folder), **FLOAT32), wrong)
    flat = {"q01": [-0.5, 0.2, 0.0], "q99": [0.5, 0.2, 0.0], "mask": [True, True, False]}  # masked: may be flat
    (folder / "dataset_statistics.json").write_text(json.dumps({"bridge_orig": {"action": flat}}))
    with pytest.raises(ConfigError, match=r"dataset_statistics.json\[bridge_orig\].action: .* not dimensions \[1\]"):
        OpenVLAPolicy(OpenVLAConfig(pretrained=str(folder), **FLOAT32), SPEC)


@pytest.mark.parametrize("decoder", ["causal", "parallel"])
def test_sampled_log_probs_and_values_equal_the_training_recomputation(decoder):
    policy = tiny(decoder=decoder, chunk_size=2, temperature=1.6)
    obs = observation()
    chunk = policy.act(obs, generator=torch.Generator().manual_seed(1))
    recomputed = policy.recompute(obs, chunk)
    torch.testing.assert_close(recomputed.log_prob, chunk.log_prob, rtol=0, atol=1e-5)
    torch.testing.assert_close(recomputed.value, chunk.value, rtol=0, atol=1e-5)
    assert chunk.actions.shape == (3, 2, 3) and chunk.record["action_tokens"].shape == (3, 6)
    decoded = policy.actions.decode(chunk.record["action_tokens"].view(3, 2, 3).numpy())
    np.testing.assert_allclose(chunk.actions.numpy(), decoded, rtol=0, atol=1e-6)  # the sampled tokens' bins


def test_padded_rows_of_the_bidirectional_pass_read_as_each_row_alone():
    policy = tiny(decoder="parallel", chunk_size=2)
    obs = observation()  # three instructions of different lengths: the shorter rows are padded
    logits, hidden, _ = policy._parallel_pass(obs)
    for row in range(3):
        alone = Observation(
            state=obs.state[row : row + 1],
            images={name: frames[row : row + 1] for name, frames in obs.images.items()},
            instruction=obs.instruction[row : row + 1],
        )
        row_logits, row_hidden, _ = policy._parallel_pass(alone)
        torch.testing.assert_close(hidden[row : row + 1], row_hidden, rtol=0, atol=2e-5)
        torch.testing.assert_close(logits[row : row + 1], row_logits, rtol=0, atol=2e-5)


def test_openvla_libero_grippers_are_binarised_and_inverted_for_the_env(tmp_path):
    """OpenVLA's LIBERO fine-tunes: the gripper (masked, so raw) in [0, 1] with 1 open; LIBERO
    takes -1 open and +1 closed."""
    spec = EnvSpec(
        state_dim=5, action_dim=3, action_low=(-1.0,) * 3, action_high=(1.0,) * 3, image_shapes=SPEC.image_shapes
    )
    folder = OpenVLAPolicy(OpenVLAConfig(**FLOAT32), spec).save_published(tmp_path / "openvla", dtype=torch.float32)
    action = {"q01": [-0.5, -0.5, 0.0], "q99": [0.5, 0.5, 1.0], "mask": [True, True, False]}
    (folder / "dataset_statistics.json").write_text(json.dumps({"libero_goal_no_noops": {"action": action}}))
    policy = OpenVLAPolicy(OpenVLAConfig(pretrained=str(folder), gripper="openvla_libero", **FLOAT32), spec)
    raw = OpenVLAPolicy(OpenVLAConfig(pretrained=str(folder), **FLOAT32), spec)
    obs = observation()
    chunk = policy.act(obs, generator=torch.Generator().manual_seed(0))
    gripper = raw.actions.decode(chunk.record["action_tokens"].view(3, 1, 3).numpy())[..., -1]
    np.testing.assert_array_equal(chunk.actions[..., -1].numpy(), -np.sign(2 * gripper - 1))
    assert set(np.unique(chunk.actions[..., -1].numpy())) <= {-1.0, 1.0}
    with pytest.raises(ConfigError, match="policy.gripper must be one of"):
        tiny(gripper="libero")


def test_a_full_fine_tune_from_a_folder_trains_the_towers_and_saves_the_published_layout_again(tmp_path):
    folder = tiny().save_published(tmp_path / "openvla", dtype=torch.float32)
    policy = tiny(pretrained=str(folder), freeze_vision=False)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        policy.bc_loss(observation(), torch.zeros(3, 1, 3)).backward()
        optimizer.step()
        optimizer.zero_grad()
    changed = {n for n, p in policy.named_parameters() if not torch.equal(p, before[n])}
    assert any(n.startswith("vision.featurizer") for n in changed) and any(n.startswith("projector.") for n in changed)
    # timm has no position for DINOv2's class token: it is never read, so it stays zero
    assert torch.all(policy.vision.featurizer.model.embeddings.position_embeddings[:, 0] == 0)
    again = OpenVLAPolicy(
        OpenVLAConfig(pretrained=str(policy.save_published(tmp_path / "again", dtype=torch.float32)), **FLOAT32), SPEC
    )
    for name, tensor in policy.published_state_dict().items():
        assert torch.equal(again.published_state_dict()[name], tensor), name


def test_the_published_layout_of_a_lora_model_has_its_adapters_merged_in():
    policy = tiny(lora_rank=4)
    layer = policy.backbone.get_base_model().model.layers[0].self_attn.q_proj
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()  # adapters away from their zero start
    merged = policy.published_state_dict()["language_model.model.layers.0.self_attn.q_proj.weight"]
    delta = layer.lora_B["default"].weight @ layer.lora_A["default"].weight * layer.scaling["default"]
    torch.testing.assert_close(merged, layer.base_layer.weight + delta)
    assert policy.published_shapes() == tiny().published_shapes()  # the names under the adapters
    assert layer.lora_B["default"].weight.abs().sum() > 0  # the policy's own adapters stay


def test_the_parallel_decoder_is_one_bidirectional_pass_read_one_position_early():
    policy = tiny(decoder="parallel", chunk_size=2)
    obs = observation(batch=1)
    logits, hidden, _ = policy._parallel_pass(obs)
    prefix, _ = policy._prefix(obs)
    zeros = torch.zeros(1, policy.positions, prefix.shape[-1])
    eos = policy._token_embeddings()(torch.tensor([[2]]))
    sequence = torch.cat([prefix, zeros, eos], 1)
    full = torch.ones(1, 1, sequence.shape[1], sequence.shape[1], dtype=torch.bool)
    with torch.no_grad():
        out = policy.backbone(inputs_embeds=sequence, attention_mask=full, output_hidden_states=True)
        causal = policy.backbone(inputs_embeds=sequence, output_hidden_states=True)
    start = prefix.shape[1] - 1  # the last prompt position reads the first action
    expected = out.hidden_states[-1][:, start : start + policy.positions]
    torch.testing.assert_close(hidden, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(logits, out.logits[:, start : start + policy.positions, 384:640], rtol=0, atol=1e-5)
    assert (causal.hidden_states[-1][:, start] - expected[:, 0]).abs().max() > 1e-3  # the placeholders are seen


def test_oft_heads_load_from_their_files_and_the_l1_gaussian_recomputes(tmp_path):
    policy = tiny(decoder="parallel", action_head="l1", proprio=True, chunk_size=2)
    folder = policy.save_published(tmp_path / "oft", dtype=torch.float32)
    stats = json.loads((folder / "dataset_statistics.json").read_text())
    stats["env_bounds"]["proprio"] = {"q01": [-1.0] * 5, "q99": [1.0] * 5}
    (folder / "dataset_statistics.json").write_text(json.dumps(stats))
    head = {f"module.model.{n}": torch.randn_like(t) for n, t in policy.action_head.state_dict().items()}
    proprio = {f"module.{n}": torch.randn_like(t) for n, t in policy.proprio_projector.state_dict().items()}
    torch.save(head, folder / "action_head--100_checkpoint.pt")
    torch.save({n: t * 0 for n, t in head.items()}, folder / "action_head--50_checkpoint.pt")  # older: not read
    torch.save(proprio, folder / "proprio_projector--100_checkpoint.pt")
    loaded = OpenVLAPolicy(
        OpenVLAConfig(
            pretrained=str(folder), decoder="parallel", action_head="l1", proprio=True, chunk_size=2, **FLOAT32
        ),
        SPEC,
    )
    torch.testing.assert_close(loaded.action_head.fc1.weight, head["module.model.fc1.weight"])
    torch.testing.assert_close(loaded.proprio_projector.fc2.bias, proprio["module.fc2.bias"])
    obs = observation()
    chunk = loaded.act(obs, generator=torch.Generator().manual_seed(0))
    recomputed = loaded.recompute(obs, chunk)
    torch.testing.assert_close(recomputed.log_prob, chunk.log_prob, rtol=0, atol=1e-4)
    assert chunk.actions.shape == (3, 2, 3)
    # saved again, the heads come back under OFT's names
    again = OpenVLAPolicy(
        OpenVLAConfig(
            pretrained=str(loaded.save_published(tmp_path / "again", dtype=torch.float32)),
            decoder="parallel",
            action_head="l1",
            proprio=True,
            chunk_size=2,
            **FLOAT32,
        ),
        SPEC,
    )
    torch.testing.assert_close(again.action_head.fc1.weight, head["module.model.fc1.weight"])
    torch.testing.assert_close(again.proprio_projector.fc2.bias, proprio["module.fc2.bias"])
    # the deterministic chunk is the head's regression, unnormalised by the bounds
    mean = loaded._gaussian(obs)[0].mean.clamp(-1, 1).detach().numpy()
    expected = loaded.actions.unnormalize(mean)
    expected = np.clip(expected, np.array(SPEC.action_low), np.array(SPEC.action_high))
    np.testing.assert_allclose(loaded.act(obs, deterministic=True).actions.numpy(), expected, rtol=0, atol=1e-6)


def test_oft_proprio_and_cameras_go_through_the_shared_pipeline(tmp_path):
    """The proprio is normalised as OFT's normalize_proprio does (masked dimensions as they
    are, then clipped), by the normaliser pi0 uses, and kept fixed; the cameras are chosen by
    `policy.features`, in the mapping's order."""
    q01, q99 = np.array([-0.5, 0.0, -2.0, 1.0, 0.0]), np.array([0.5, 2.0, 2.0, 1.0, 1.0])
    mask = np.array([True, True, True, True, False])
    folder = tiny(proprio=True).save_published(tmp_path / "oft", dtype=torch.float32)
    stats = json.loads((folder / "dataset_statistics.json").read_text())
    stats["env_bounds"]["proprio"] = {"q01": q01.tolist(), "q99": q99.tolist(), "mask": mask.tolist()}
    (folder / "dataset_statistics.json").write_text(json.dumps(stats))
    torch.save(
        {f"module.{n}": t for n, t in tiny(proprio=True).proprio_projector.state_dict().items()},
        folder / "proprio_projector--1_checkpoint.pt",
    )
    loaded = OpenVLAPolicy(
        OpenVLAConfig(pretrained=str(folder), proprio=True, features="a=wrist,b=image", **FLOAT32), SPEC
    )
    assert loaded.cameras == ["wrist", "image"]
    obs = observation()
    obs.state[0] = torch.tensor([0.25, 3.0, -1.0, 1.0, 0.4])  # one clipped, one flat, one masked
    state = obs.state.double().numpy()
    expected = np.clip(np.where(mask, 2 * (state - q01) / (q99 - q01 + 1e-8) - 1, state), -1.0, 1.0)
    before = {n: b.clone() for n, b in loaded.normalizer.named_buffers()}
    loaded.update_normalization(obs)  # a checkpoint's statistics stay as they are
    assert all(torch.equal(b, before[n]) for n, b in loaded.normalizer.named_buffers())
    np.testing.assert_allclose(loaded._proprio(obs).double().numpy(), expected, rtol=0, atol=1e-6)
    # a run saved when the proprio's running normaliser sat unused beside the bounds loads, with them
    saved = {n: t for n, t in loaded.state_dict().items() if not n.startswith("normalizer.")}
    saved.update({f"normalizer.{n}": t for n, t in tiny(proprio=True).normalizer.state_dict().items()})
    again = OpenVLAPolicy(
        OpenVLAConfig(pretrained=str(folder), proprio=True, features="a=wrist,b=image", **FLOAT32), SPEC
    )
    again.load_state_dict(saved)
    np.testing.assert_allclose(again._proprio(obs).double().numpy(), expected, rtol=0, atol=1e-6)
    stats["env_bounds"].pop("proprio")
    (folder / "dataset_statistics.json").write_text(json.dumps(stats))
    with pytest.raises(ConfigError, match=r"policy.proprio=true: .*\[env_bounds\].action has no proprio beside it"):
        OpenVLAPolicy(OpenVLAConfig(pretrained=str(folder), proprio=True, **FLOAT32), SPEC)


def test_lora_trains_and_publishes_only_adapters_and_heads():
    policy = tiny(lora_rank=4)
    trainable = {name for name, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name or name.startswith("value_head") for name in trainable)
    assert any("mlp.down_proj.lora_A" in name for name in trainable)  # every linear layer of the LM
    sent = published_weights(policy)
    assert {n for n in sent if n in dict(policy.named_parameters())} == trainable
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    loss = policy.bc_loss(observation(), torch.zeros(3, 1, 3))
    loss.backward()
    optimizer.step()
    changed = {n for n, p in policy.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable


def test_bad_settings_are_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match="policy.action_head=l1 reads every action position at once"):
        tiny(action_head="l1")
    with pytest.raises(ConfigError, match=r"policy.features names cameras the env does not have: \['side'\]"):
        tiny(features="full_image=side")
    with pytest.raises(ConfigError, match="has no config.json"):
        tiny(pretrained=str(tmp_path))
    with pytest.raises(ConfigError, match="exceeds policy.max_instruction_tokens=20"):
        tiny(max_instruction_tokens=20).act(observation())
    folder = tiny().save_published(tmp_path / "openvla", dtype=torch.float32)
    with pytest.raises(ConfigError, match="no action_head--<step>_checkpoint.pt"):
        tiny(pretrained=str(folder), decoder="parallel", action_head="l1")


def test_towers_named_by_transformers_before_5_map_to_the_same_published_layout():
    """transformers 4.x names DINOv2's attention in two modules; the layout reads it either way."""
    prefix = "vision.featurizer.model.encoder.layer.0.attention."
    old = {f"{prefix}attention.query.weight": torch.ones(1), f"{prefix}output.dense.bias": torch.zeros(1)}
    new = current_names(old)
    assert sorted(new) == [f"{prefix}o_proj.bias", f"{prefix}q_proj.weight"]
    assert new[f"{prefix}q_proj.weight"] is old[f"{prefix}attention.query.weight"]
    # back into a module built by transformers 4.x; a 5.x module keeps the names as they are
    assert installed_names(new, ["encoder.layer.0.attention.attention.key.weight"]) == old
    assert installed_names(new, ["encoder.layer.0.attention.k_proj.weight"]) == new
