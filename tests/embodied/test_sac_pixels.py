"""SAC/RLPD from camera images: the frozen backbone and its cached features, DrQ's shift, the
critic's targets on pixels against a float64 recomputation, image buffers through resume,
and training on real ManiSkill frames under both runtimes."""

import copy
import json
import math
import sys
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from embodied.algos.augment import random_shift
from embodied.algos.replay import Transitions
from embodied.algos.sac_config import SACConfig
from embodied.algos.sac_rlpd import SACRLPD
from embodied.build import build_env
from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec, Observation
from embodied.policies.gaussian.squashed_gaussian import SquashedGaussianConfig, SquashedGaussianPolicy
from embodied.policies.image_backbones import EFFICIENTNET_SPATIAL_BLOCKS, frozen_backbone
from embodied.runs.checkpoint import load_checkpoint, save_checkpoint
from embodied.runtime.rollout import Rollout
from embodied.sim.maniskill import ManiSkillConfig
from tests.embodied.test_cli import embodied

SIZE = 24
SPEC = EnvSpec(
    state_dim=3,
    action_dim=2,
    action_low=(-1.0, -1.0),
    action_high=(1.0, 1.0),
    control_hz=10.0,
    image_shapes={"base": (SIZE, SIZE, 3), "wrist": (SIZE, SIZE, 3)},
)
SMALL = dict(batch_size=8, num_critics=3, critic_subset=2, critic_hidden=[16], utd_ratio=2, replay_capacity=64)


def pixel_policy(spec=SPEC, backbone="random_cnn"):
    torch.manual_seed(0)
    return SquashedGaussianPolicy(
        SquashedGaussianConfig(hidden=[16], image_backbone=backbone, image_projection=8), spec
    )


def pixel_transitions(count, seed=0):
    g = torch.Generator().manual_seed(seed)
    frames = lambda: {  # noqa: E731
        camera: torch.randint(0, 256, (count, SIZE, SIZE, 3), generator=g, dtype=torch.uint8)
        for camera in SPEC.image_shapes
    }
    return Transitions(
        state=torch.randn(count, 3, generator=g),
        action=torch.rand(count, 2, generator=g) * 2 - 1,
        reward=torch.randn(count, generator=g),
        next_state=torch.randn(count, 3, generator=g),
        discount=(torch.rand(count, generator=g) > 0.3).float(),
        intervened=torch.zeros(count, dtype=torch.bool),
        mc_return=torch.full((count,), -torch.inf),
        images=frames(),
        next_images=frames(),
    )


def maniskill_batches(policy, steps):
    env = build_env(ManiSkillConfig(task="PushCube-v1", num_envs=2, num_workers=0, obs_mode="rgb", image_size=32), 0)
    try:
        rollout = Rollout(env, policy, torch.device("cpu"))
        rollout.start()
        return env.spec, [rollout.collect(1)[0] for _ in range(steps)]
    finally:
        env.close()


def test_random_shift_crops_the_edge_padded_frame_at_one_offset_per_image():
    images = torch.randint(0, 256, (6, 10, 12, 3), dtype=torch.uint8)
    shifted = random_shift(images, 2, torch.Generator().manual_seed(0))
    assert shifted.dtype == torch.uint8 and shifted.shape == images.shape
    padded = F.pad(images.permute(0, 3, 1, 2).float(), (2, 2, 2, 2), mode="replicate").permute(0, 2, 3, 1)
    offsets = []
    for image, out in zip(padded, shifted):
        matches = [
            (dy, dx)
            for dy in range(5)
            for dx in range(5)
            if torch.equal(image[dy : dy + 10, dx : dx + 12], out.float())
        ]
        assert len(matches) == 1
        offsets += matches
    assert len(set(offsets)) > 1  # per image, not one shift for the batch
    assert torch.equal(random_shift(images, 0), images)


# EfficientNet-Lite0's features of a 32 px frame: the head's 1280 channels averaged, or the
# map after stage 4 (80 channels at 1/16 of the frame: 2 x 2)
EFFICIENTNET_WIDTH_AT_32PX = {"pooled": 1280, "spatial": 80 * 2 * 2}


@pytest.mark.parametrize("features", ["pooled", "spatial"])
@pytest.mark.slow
def test_the_backbone_stays_frozen_and_cached_features_equal_a_fresh_forward_pass(features):
    """The shipped EfficientNet-Lite0 reads real ManiSkill frames; after updates its weights
    are unchanged, and every stored frame's cached features are the backbone's on that frame."""
    torch.manual_seed(0)
    env_spec = build_env(
        ManiSkillConfig(task="PushCube-v1", num_envs=1, num_workers=0, obs_mode="rgb", image_size=32), 0
    )
    spec = env_spec.spec
    env_spec.close()
    policy = SquashedGaussianPolicy(
        SquashedGaussianConfig(hidden=[16], image_projection=8, image_features=features), spec
    )
    width = EFFICIENTNET_WIDTH_AT_32PX[features]
    assert policy.input_dim == spec.state_dim + len(spec.image_shapes) * width
    assert features_match_the_backbone(policy, features)
    frozen = {name: value.clone() for name, value in policy.backbone.state_dict().items()}
    assert not any(p.requires_grad for p in policy.backbone.parameters())
    algo = SACRLPD(SACConfig(**SMALL), policy)
    _, batches = maniskill_batches(policy, 3)
    for batch in batches:
        algo.update(batch, 0.0)
    assert algo.critic_steps == 12 and len(algo.online) == 6
    for name, value in policy.backbone.state_dict().items():
        assert torch.equal(value, frozen[name]), name
    data, stored = algo.online.data, len(algo.online)
    fresh = policy.image_features({c: v[:stored] for c, v in data.images.items()})
    fresh_next = policy.image_features({c: v[:stored] for c, v in data.next_images.items()})
    assert torch.equal(data.features[:stored], fresh) and torch.equal(data.next_features[:stored], fresh_next)
    camera = policy.cameras[0]
    assert torch.equal(data.images[camera][0], batches[0].observation.images[camera][0, 0])
    assert torch.equal(data.next_images[camera][0], batches[1].observation.images[camera][0, 0])  # no episode ended


def features_match_the_backbone(policy, features):
    """The policy's features of a frame: the backbone's map flattened (spatial) or its pooled vector."""
    frames = {c: torch.randint(0, 256, (2, *policy.spec.image_shapes[c]), dtype=torch.uint8) for c in policy.cameras}
    net = policy.backbone.net
    expected = [
        net.feature_map(frames[c], EFFICIENTNET_SPATIAL_BLOCKS).flatten(1)
        if features == "spatial"
        else net.feature_map(frames[c]).mean((2, 3))
        for c in policy.cameras
    ]
    return torch.equal(policy.image_features(frames), torch.cat(expected, dim=-1))


def test_same_sized_cameras_share_one_backbone_pass_in_camera_order():
    policy = pixel_policy()
    frames = pixel_transitions(3).images
    per_camera = torch.cat([policy.backbone.features(frames[c]) for c in policy.cameras], dim=-1)
    torch.testing.assert_close(policy.image_features(frames), per_camera, rtol=0, atol=1e-4)
    none = policy.image_features({c: v[:0] for c, v in frames.items()})
    assert none.shape == (0, per_camera.shape[1])  # no frames: still each camera's width


def test_spatial_features_give_each_camera_its_own_width_from_its_frame_size():
    """Spatial features grow with the frame: cameras of different sizes get projections of
    different widths, and the policy acts on the concatenation."""
    spec = EnvSpec(**{**SPEC.__dict__, "image_shapes": {"base": (32, 32, 3), "wrist": (48, 48, 3)}})
    torch.manual_seed(0)
    policy = SquashedGaussianPolicy(
        SquashedGaussianConfig(hidden=[16], image_backbone="random_cnn", image_projection=8, image_features="spatial"),
        spec,
    )
    # random_cnn: three unpadded stride-2 3x3 convolutions, 32 channels: 32 -> 15 -> 7 -> 3, 48 -> 23 -> 11 -> 5
    assert policy.feature_dims == [32 * 3 * 3, 32 * 5 * 5]
    assert [head[0].in_features for head in policy.projection.heads] == policy.feature_dims
    frames = {c: torch.randint(0, 256, (4, *shape), dtype=torch.uint8) for c, shape in spec.image_shapes.items()}
    features = policy.image_features(frames)
    maps = [policy.backbone.feature_map(frames[c]) for c in ("base", "wrist")]
    assert torch.equal(features, torch.cat([m.flatten(1) for m in maps], dim=-1))
    pooled = frozen_backbone("random_cnn")
    assert pooled.output_dim((32, 32, 3)) == pooled.output_dim((48, 48, 3)) == 128  # pooled: one width for all
    observation = Observation(state=torch.zeros(4, 3), images=frames)
    assert policy.act(observation).actions.shape == (4, 1, 2)


def test_spatial_embeddings_are_k_weighted_sums_over_each_channels_positions():
    """HIL-SERL's learned spatial embeddings against a float64 loop: output (c, k) is the sum
    over positions of the map times its kernel; each camera's head reads C x K of them, and the
    critics' projections get their own."""
    spec = EnvSpec(**{**SPEC.__dict__, "image_shapes": {"base": (32, 32, 3), "wrist": (48, 48, 3)}})
    config = SquashedGaussianConfig(
        hidden=[16], image_backbone="random_cnn", image_projection=8, image_features="spatial", spatial_embeddings=3
    )
    torch.manual_seed(0)
    policy = SquashedGaussianPolicy(config, spec)
    assert policy.map_shapes == [(32, 3, 3), (32, 5, 5)]
    embeddings, linear = policy.projection.heads[1][0], policy.projection.heads[1][1]
    assert embeddings.kernel.shape == (32, 5, 5, 3) and linear.in_features == 32 * 3
    features = torch.randn(2, 32 * 5 * 5)
    maps, kernel = features.double().view(2, 32, 5, 5), embeddings.kernel.detach().double()
    expected = torch.zeros(2, 32, 3, dtype=torch.float64)
    for b in range(2):
        for c in range(32):
            for k in range(3):
                expected[b, c, k] = sum(maps[b, c, h, w] * kernel[c, h, w, k] for h in range(5) for w in range(5))
    assert torch.allclose(embeddings(features).double(), expected.flatten(1), atol=1e-5)
    critic_projection = policy.new_projection()
    assert critic_projection.heads[0][0].kernel.data_ptr() != policy.projection.heads[0][0].kernel.data_ptr()
    frames = {c: torch.randint(0, 256, (4, *shape), dtype=torch.uint8) for c, shape in spec.image_shapes.items()}
    assert policy.act(Observation(state=torch.zeros(4, 3), images=frames)).actions.shape == (4, 1, 2)
    # SAC trains the kernels: the actor's through its step, the critics' through theirs
    policy = SquashedGaussianPolicy(config, SPEC)
    algo = SACRLPD(SACConfig(**SMALL), policy)
    heads = (policy.projection.heads[0], algo.critics.projection.heads[0])
    before = [head[0].kernel.detach().clone() for head in heads]
    algo.learn(algo.with_features(pixel_transitions(8)))
    after = [head[0].kernel for head in heads]
    assert all(not torch.equal(b, a) for b, a in zip(before, after))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(image_features="pooled", spatial_embeddings=8), "image_features=spatial"),
        (dict(image_features="spatial", spatial_embeddings=-1), ">= 0"),
    ],
)
def test_spatial_embeddings_without_a_spatial_map_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        SquashedGaussianPolicy(SquashedGaussianConfig(hidden=[16], image_backbone="random_cnn", **overrides), SPEC)


def test_one_shift_per_sample_reaches_both_its_critic_and_actor_steps(monkeypatch):
    policy = pixel_policy()
    algo = SACRLPD(SACConfig(**SMALL, image_augmentation="shift", shift_pad=4), policy)
    algo.online.add(pixel_transitions(16))
    seen = []
    critic_step, actor_step = algo.critic_step, algo.actor_step
    monkeypatch.setattr(
        algo, "critic_step", lambda batch, rows: seen.append(("critic", batch)) or critic_step(batch, rows)
    )
    monkeypatch.setattr(
        algo, "actor_step", lambda batch, rows=0: seen.append(("actor", batch)) or actor_step(batch, rows)
    )
    algo.online.generator.manual_seed(3)
    for _ in range(2):
        batch, rows = algo.sample()
        algo.critic_step(batch, rows)
        algo.actor_step(batch, rows)
    (_, c1), (_, a1), (_, c2), (_, a2) = seen
    assert a1 is c1 and a2 is c2
    algo.online.generator.manual_seed(3)
    unshifted = algo.online.sample(SMALL["batch_size"])
    plain = policy.image_features(unshifted.images)
    torch.testing.assert_close(c1.state[:, :3], unshifted.state)
    assert not torch.allclose(c1.state[:, 3:], plain)  # the frames were shifted before the backbone


def test_the_actor_can_read_the_critics_projection_which_only_the_critics_loss_trains(tmp_path):
    """actor_projection=critics (HIL-SERL's shared encoder with the actor's gradient stopped):
    one projection module, in the critics' optimizer alone; an actor step gives it no gradient
    and leaves it as it was, a critic step moves it, and a resumed learner shares it again."""
    config = SACConfig(**SMALL, actor_projection="critics")
    algo = SACRLPD(config, policy := pixel_policy())
    assert algo.critics.projection is policy.projection
    shared = {id(p) for p in policy.projection.parameters()}
    assert not shared & {id(p) for group in algo.actor_optimizer.param_groups for p in group["params"]}
    assert shared <= {id(p) for group in algo.critic_optimizer.param_groups for p in group["params"]}
    algo.online.add(algo.with_features(pixel_transitions(16)))
    before = copy.deepcopy(policy.projection.state_dict())
    batch, rows = algo.sample()
    algo.critic_optimizer.zero_grad()
    net_before = [p.detach().clone() for p in policy.net.parameters()]
    algo.actor_step(batch, rows)
    assert all(p.grad is None or not p.grad.any() for p in policy.projection.parameters())
    assert all(torch.equal(before[k], v) for k, v in policy.projection.state_dict().items())
    assert any(not torch.equal(a, b) for a, b in zip(net_before, policy.net.parameters()))  # the actor did learn
    algo.critic_step(batch, rows)
    assert any(not torch.equal(before[k], v) for k, v in policy.projection.state_dict().items())
    # the target critics keep a copy of their own, moved by Polyak averaging
    assert algo.target_critics.projection is not policy.projection
    path = save_checkpoint(tmp_path, "iter_000001", policy.state_dict(), {"algo": algo.state_dict()}, "")
    weights, state = load_checkpoint(path)
    resumed = SACRLPD(config, resumed_policy := pixel_policy())
    resumed_policy.load_state_dict(weights)
    resumed.load_state_dict(state["algo"])
    assert resumed.critics.projection is resumed_policy.projection and resumed_policy.detach_projection
    for (name, x), y in zip(policy.projection.state_dict().items(), resumed_policy.projection.state_dict().values()):
        assert torch.equal(x, y), name


def test_sharing_the_critics_projection_needs_cameras_and_a_known_mode():
    state_spec = replace(SPEC, image_shapes={})
    with pytest.raises(ConfigError, match="actor_projection=critics .* reads no cameras"):
        SACRLPD(SACConfig(**SMALL, actor_projection="critics"), pixel_policy(state_spec))
    with pytest.raises(ConfigError, match="actor_projection must be own or critics, got 'shared'"):
        SACRLPD(SACConfig(**SMALL, actor_projection="shared"), pixel_policy())


def test_cached_shifts_store_shifted_views_once_and_each_sample_reads_one_of_them():
    policy = pixel_policy()
    algo = SACRLPD(SACConfig(**SMALL, image_augmentation="cached_shifts", cached_shifts=3, shift_pad=4), policy)
    items = pixel_transitions(5)
    generator = copy.deepcopy(algo.augment_generator)
    stored = algo.with_features(items)
    width = policy.input_dim - SPEC.state_dim

    def shifted_features(frames):  # what the backbone gives for one random shift per frame and camera
        return policy.image_features({c: random_shift(v, 4, generator) for c, v in frames.items()})

    # the next frames first; then the first frames, none of which is a next frame here
    next_expected = torch.cat([shifted_features(items.next_images) for _ in range(3)], -1)
    expected = torch.cat([shifted_features(items.images) for _ in range(3)], -1)
    assert stored.features.shape == (5, 3 * width)
    # the views go through the backbone in one pass, which rounds apart from a pass per view
    torch.testing.assert_close(stored.features, expected, rtol=0, atol=1e-4)
    torch.testing.assert_close(stored.next_features, next_expected, rtol=0, atol=1e-4)
    assert not torch.allclose(expected[:, :width], expected[:, width : 2 * width])  # the views differ
    # each sample reads one view of its frame and, drawn apart, one of its next frame
    picks = torch.randint(3, (5,), generator=generator), torch.randint(3, (5,), generator=generator)
    inputs = algo.inputs(stored)
    rows = torch.arange(5)
    torch.testing.assert_close(inputs.state[:, 3:], expected.view(5, 3, -1)[rows, picks[0]])
    torch.testing.assert_close(inputs.next_state[:, 3:], next_expected.view(5, 3, -1)[rows, picks[1]])
    assert len(algo.online.data.features[0]) == 3 * width  # the buffer holds every view
    with pytest.raises(ConfigError, match="cached_shifts must be >= 1"):
        SACRLPD(SACConfig(**SMALL, image_augmentation="cached_shifts", cached_shifts=0), pixel_policy())


@pytest.mark.parametrize("augmentation", ["none", "cached_shifts"])
def test_each_frame_is_encoded_once_and_a_first_frame_reads_the_features_of_the_next_frame_it_was(augmentation):
    """A rollout's first frames are, after the first step, the next frames of the step before
    (in the same batch or the last one stored): the backbone sees every distinct frame once,
    and a frame's features (its shifted views too) are the same wherever it appears."""
    policy = pixel_policy()
    algo = SACRLPD(SACConfig(**SMALL, image_augmentation=augmentation, cached_shifts=2), policy)
    frames = pixel_transitions(7, seed=5).images  # one episode's 7 frames in a row
    episode = pixel_transitions(6, seed=6)

    def steps(first, last):  # frames first..last-1 -> first+1..last
        part = episode.select(torch.arange(first, last))
        return replace(
            part,
            images={c: v[first:last] for c, v in frames.items()},
            next_images={c: v[first + 1 : last + 1] for c, v in frames.items()},
        )

    encoded = []
    image_features = policy.image_features
    policy.image_features = lambda chunk: encoded.append(len(next(iter(chunk.values())))) or image_features(chunk)
    first = algo.with_features(steps(0, 3))
    algo.online.add(first)
    second = algo.with_features(steps(3, 6))
    views = 2 if augmentation == "cached_shifts" else 1
    assert sum(encoded) == 7 * views  # 7 distinct frames, each once per view
    features = torch.cat([first.features, second.features])
    next_features = torch.cat([first.next_features, second.next_features])
    torch.testing.assert_close(features[1:], next_features[:-1], rtol=0, atol=0)
    if augmentation == "none":  # nothing random: what encoding each frame on its own gives
        torch.testing.assert_close(features, image_features({c: v[:6] for c, v in frames.items()}))
    # a first frame that is no next frame seen yet (a new episode) is encoded on its own
    fresh = algo.with_features(pixel_transitions(2, seed=7))
    assert sum(encoded) == (7 + 4) * views and fresh.features.shape == (2, first.features.shape[1])


def test_pixel_critic_targets_and_loss_match_a_float64_recomputation():
    policy = pixel_policy()
    algo = SACRLPD(SACConfig(**SMALL, gamma=0.9, init_temperature=0.3), policy)
    batch = algo.with_features(pixel_transitions(8, seed=4))
    inputs = algo.inputs(batch)
    subset_generator = copy.deepcopy(algo.generator)
    critics, targets = copy.deepcopy(algo.critics).double(), copy.deepcopy(algo.target_critics).double()
    actor_projection, actor_net = copy.deepcopy(policy.projection).double(), copy.deepcopy(policy.net).double()
    torch.manual_seed(7)
    metrics = algo.critic_step(inputs, offline_rows=0)
    with torch.no_grad():  # the float64 recomputation
        backbone = copy.deepcopy(policy.backbone.net).double()
        pooled = lambda maps: F.adaptive_avg_pool2d(maps, 2).flatten(1)  # noqa: E731
        features = lambda frames: torch.cat(  # noqa: E731
            [pooled(backbone(frames[c].permute(0, 3, 1, 2).double() / 255)) for c in sorted(frames)], -1
        )
        state = torch.cat([batch.state.double(), features(batch.images)], -1)
        next_state = torch.cat([batch.next_state.double(), features(batch.next_images)], -1)
        mean, raw = actor_net(actor_projection(next_state)).chunk(2, -1)
        log_std = -5 + 0.5 * 7 * (torch.tanh(raw) + 1)
        torch.manual_seed(7)
        u = mean + log_std.exp() * torch.randn(mean.shape).double()
        gaussian = (
            -0.5 * ((u - mean) / log_std.exp()) ** 2
            - log_std
            - 0.5 * torch.log(torch.tensor(2 * torch.pi, dtype=torch.float64))
        )
        log_prob = (gaussian - torch.log(1 - torch.tanh(u) ** 2)).sum(-1)
        subset = torch.randperm(3, generator=subset_generator)[:2]
        next_q = targets(next_state, torch.tanh(u)).squeeze(-1)[subset].min(0).values
        target = batch.reward.double() + 0.9 * batch.discount.double() * (next_q - 0.3 * log_prob)
        q = critics(state, batch.action.double()).squeeze(-1)
        loss = (q - target).pow(2).mean(1).sum() / 3
    assert metrics["train/target_mean"] == pytest.approx(float(target.mean()), rel=1e-5, abs=1e-5)
    assert metrics["train/critic_loss"] == pytest.approx(float(loss), rel=1e-5)
    assert metrics["train/q_mean"] == pytest.approx(float(q.mean()), rel=1e-5, abs=1e-5)


def test_calql_projects_each_state_once_for_its_sampled_actions_as_repeated_states_would_give():
    """The conservative term's k actions per state share one projection of its frozen
    features: penalty and gradients equal those computed on the states repeated k times."""
    policy = pixel_policy()
    algo = SACRLPD(SACConfig(**SMALL, calql_actions=3), policy)
    batch = algo.with_features(pixel_transitions(6, seed=2))
    inputs = replace(algo.inputs(batch), mc_return=torch.linspace(-1.0, 1.0, 6))
    q_data = algo.q_values(algo.critics, inputs.state, inputs.action)

    def penalty_and_gradients(penalty_of):
        algo.critics.zero_grad()
        torch.manual_seed(11)
        penalty = penalty_of()
        penalty.backward(retain_graph=True)
        return penalty.detach(), [p.grad.clone() for p in algo.critics.parameters() if p.grad is not None]

    once, once_grads = penalty_and_gradients(lambda: algo.calql_penalty(inputs, q_data, offline_rows=6))

    def on_repeated_states():
        k, rows = 3, 6
        repeated = inputs.state.repeat_interleave(k, dim=0)
        with torch.no_grad():
            action, log_prob = policy.sample(repeated)
        uniform = torch.rand(rows * k, 2) * 2 - 1
        q_policy = algo.critics(repeated, action).squeeze(-1).view(-1, rows, k)
        q_uniform = algo.critics(repeated, uniform).squeeze(-1).view(-1, rows, k)
        q_policy = torch.maximum(q_policy, inputs.mc_return.view(1, rows, 1))
        scores = torch.cat([q_uniform + 2 * math.log(2), q_policy - log_prob.view(1, rows, k)], dim=-1)
        return (torch.logsumexp(scores, dim=-1) - q_data).mean(1).sum()

    repeated, repeated_grads = penalty_and_gradients(on_repeated_states)
    torch.testing.assert_close(once, repeated, rtol=1e-6, atol=1e-6)
    assert len(once_grads) == len(repeated_grads) == len(list(algo.critics.parameters()))
    for one, other in zip(once_grads, repeated_grads):
        torch.testing.assert_close(one, other, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("augmentation", ["none", "shift", "cached_shifts"])
def test_image_buffers_and_the_shift_generator_survive_resume_bit_exactly(tmp_path, augmentation):
    config = SACConfig(**SMALL, image_augmentation=augmentation, cached_shifts=2)
    first = SACRLPD(config, policy := pixel_policy())
    first.online.add(first.with_features(pixel_transitions(20)))
    first.offline.add(first.with_features(pixel_transitions(5, seed=1)))
    first.sample()
    path = save_checkpoint(tmp_path, "iter_000001", policy.state_dict(), {"algo": first.state_dict()}, "")
    weights, state = load_checkpoint(path)
    resumed = SACRLPD(config, resumed_policy := pixel_policy())
    resumed_policy.load_state_dict(weights)
    resumed.load_state_dict(state["algo"])
    for one, two in ((first.online, resumed.online), (first.offline, resumed.offline)):
        assert len(one) == len(two)
        for (name, x), y in zip(one.data.columns().items(), two.data.columns().values()):
            assert x.dtype == y.dtype and torch.equal(x[: len(one)], y[: len(two)]), name
    assert first.online.data.images["base"].dtype == torch.uint8
    for _ in range(2):
        (a, _), (b, _) = first.sample(), resumed.sample()
        assert torch.equal(a.state, b.state) and torch.equal(a.next_state, b.next_state)


def test_a_buffer_of_frames_grows_as_transitions_come_and_wraps_at_its_capacity(monkeypatch):
    from embodied.algos import replay

    monkeypatch.setattr(replay, "INITIAL_ROWS", 4)
    buffer = replay.ReplayBuffer(10, 2, 1, seed=3, image_shapes={"base": (2, 2, 3)}, feature_dim=5)
    assert len(buffer.data) == 4  # not the capacity's worth of frames up front

    def batch(start, count):
        ids = torch.arange(start, start + count, dtype=torch.float32)
        frames = ids.view(-1, 1, 1, 1).expand(count, 2, 2, 3).to(torch.uint8)
        return Transitions(
            state=ids.view(-1, 1).expand(count, 2),
            action=ids.view(-1, 1),
            reward=ids,
            next_state=ids.view(-1, 1).expand(count, 2) + 1,
            discount=torch.ones(count),
            intervened=torch.zeros(count, dtype=torch.bool),
            mc_return=ids,
            images={"base": frames},
            next_images={"base": frames + 1},
            features=ids.view(-1, 1).expand(count, 5),
            next_features=ids.view(-1, 1).expand(count, 5) + 1,
        )

    sizes = []
    for start in range(0, 15, 3):  # 15 transitions into room for 10: the first 5 are overwritten
        buffer.add(batch(start, 3))
        sizes.append(len(buffer.data))
    assert sizes == [4, 8, 10, 10, 10] and len(buffer) == 10
    assert buffer.data.reward.tolist() == [10, 11, 12, 13, 14, 5, 6, 7, 8, 9]
    assert torch.equal(buffer.data.images["base"][:, 0, 0, 0], buffer.data.reward.to(torch.uint8))
    resumed = replay.ReplayBuffer(10, 2, 1, image_shapes={"base": (2, 2, 3)}, feature_dim=5)
    resumed.load_state_dict(buffer.state_dict())  # the same rows and the same draws to come
    framed, bare = buffer.sample(6), resumed.sample(6, frames=False)
    assert torch.equal(framed.images["base"][:, 0, 0, 0], framed.reward.to(torch.uint8))
    assert torch.equal(bare.reward, framed.reward) and torch.equal(bare.features, framed.features)
    assert not bare.images and not bare.next_images


@pytest.mark.slow
def test_recorded_demos_bring_their_frames_and_the_next_frame_of_each_step(tmp_path, monkeypatch):
    """A LeRobotDataset written by the robot client with two cameras: each transition holds
    the frames of its step and of the next one; the terminal step's next frame is its own."""
    import numpy as np

    from embodied.robots.recording import DatasetRecorder, RecordingConfig

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    recorder = DatasetRecorder(RecordingConfig(dataset=str(tmp_path / "demos")), SPEC, 10.0, "push")
    recorder.open()
    frames = [
        {c: np.full((SIZE, SIZE, 3), 10 * t + i, np.uint8) for i, c in enumerate(SPEC.image_shapes)} for t in range(4)
    ]
    for t, images in enumerate(frames):
        recorder.add(np.full(3, t, np.float32), images, np.array([0.5, -0.5]), None, False, float(t == 3))
    recorder.end_episode(True, terminated=True)
    recorder.close()
    algo = SACRLPD(SACConfig(**SMALL, dataset=str(tmp_path / "demos")), pixel_policy())
    data = algo.offline.data
    assert len(algo.offline) == 4
    for t in range(4):
        following = min(t + 1, 3)
        for camera in SPEC.image_shapes:
            assert torch.equal(data.images[camera][t], torch.from_numpy(frames[t][camera]))
            assert torch.equal(data.next_images[camera][t], torch.from_numpy(frames[following][camera]))
    assert data.discount[:4].tolist() == [1.0, 1.0, 1.0, 0.0]
    # a frame's features come from whichever batch it was first encoded in: equal up to float rounding
    torch.testing.assert_close(
        data.features[:4], algo.policy.image_features({c: v[:4] for c, v in data.images.items()})
    )
    torch.testing.assert_close(data.features[1:4], data.next_features[:3], rtol=0, atol=0)  # encoded once
    bad = EnvSpec(**{**SPEC.to_dict(), "image_shapes": {"base": (SIZE, SIZE, 3), "side": (SIZE, SIZE, 3)}})
    with pytest.raises(ConfigError, match="observation.images.side"):
        SACRLPD(SACConfig(**SMALL, dataset=str(tmp_path / "demos")), pixel_policy(bad))


def test_backbones_are_refused_by_name_with_what_would_serve():
    with pytest.raises(ConfigError, match="efficientnet_lite0, random_cnn, timm:<model> or torchvision:<model>"):
        frozen_backbone("resnet")
    with pytest.raises(ConfigError, match="image_augmentation"):
        SACRLPD(SACConfig(**SMALL, image_augmentation="crop"), pixel_policy())
    with pytest.raises(ConfigError, match="image_features must be pooled or spatial, got 'grid'"):
        frozen_backbone("random_cnn", "grid")
    with pytest.raises(ConfigError, match="torchvision:resnet18 does not give here: use efficientnet_lite0"):
        frozen_backbone("torchvision:resnet18", "spatial")


def test_a_timm_or_torchvision_backbone_without_its_package_says_how_to_get_it(monkeypatch):
    for package in ("timm", "torchvision"):
        monkeypatch.setitem(sys.modules, package, None)
        with pytest.raises(ConfigError, match=f"pip install {package}"):
            frozen_backbone(f"{package}:resnet18")


PIXEL_SAC = [
    "env=maniskill_pushcube",
    "env.obs_mode=rgb",
    "env.image_size=32",
    "env.num_envs=2",
    "env.num_workers=0",
    "policy=squashed_gaussian",
    "policy.hidden=[16]",
    "policy.image_backbone=random_cnn",
    "policy.image_projection=8",
    "algo=sac_rlpd",
    "algo.critic_hidden=[16]",
    "algo.num_critics=2",
    "algo.batch_size=8",
    "algo.utd_ratio=1",
    "algo.replay_capacity=100",
    "eval_episodes=0",
    "checkpoint_every=2",
    "logger.progress_bar=false",
    "runtime.device=cpu",
]


@pytest.mark.slow
def test_pixel_sac_trains_on_maniskill_frames_under_procs_and_resumes(tmp_path):
    """The rollout process keeps each step's next frames and sends them over the wire; the
    resumed run continues with its image buffers whole."""
    run_dir = tmp_path / "run"
    embodied(
        "train",
        *PIXEL_SAC,
        "policy.image_features=spatial",
        "runtime=procs",
        "runtime.rollout_device=cpu",
        "total_env_steps=8",
        f"run_dir={run_dir}",
    )
    embodied("train", f"resume={run_dir}", "total_env_steps=12")
    updates = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "train/iteration" in line
    ]
    assert [u["replay/online"] for u in updates] == [2, 4, 6, 8, 10, 12]
    assert all(u["train/critic_loss"] == u["train/critic_loss"] for u in updates[1:])  # finite, not NaN
