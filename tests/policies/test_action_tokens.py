import numpy as np
import pytest

from embodied.policies.normalization import FeatureStatistics
from embodied.policies.vla.action_tokens import NUM_BINS, ActionTokenizer

VOCAB = 1000


def tokenizer():
    # two dimensions scaled from [q01, q99] and a gripper in [-1, 1] that is only clipped
    offset, scale = np.array([0.0, 1.0, 0.0]), np.array([0.5, 1.0, 1.0])
    return ActionTokenizer(VOCAB, FeatureStatistics("q01/q99", "test", offset, scale, scale))


def test_round_trip_is_within_half_a_bin():
    t = tokenizer()
    actions = np.random.default_rng(0).uniform([-0.5, 0.0, -1.0], [0.5, 2.0, 1.0], size=(1000, 3))
    decoded = t.decode(t.encode(actions))
    half_bin = (2.0 / (NUM_BINS - 1)) / 2 * (np.array([1.0, 2.0, 2.0]) / 2)  # in env units per dimension
    assert np.all(np.abs(decoded - actions) <= half_bin + 1e-12)


def test_tokens_are_the_last_256_ids_and_the_ends_map_as_documented():
    t = tokenizer()
    low, high = t.encode(np.array([[-0.5, 0.0, -1.0]])), t.encode(np.array([[0.5, 2.0, 1.0]]))
    assert (low == VOCAB - 1).all()  # x = -1 -> digitize 1 -> the very last id
    assert (high == VOCAB - NUM_BINS).all()  # x = +1 exactly -> digitize 256 -> the first action id
    assert t.first_token == VOCAB - NUM_BINS
    # 256 ids, 255 reachable actions: x = +1 and the bin just below decode alike
    just_below = t.encode(np.array([[0.4999, 1.9999, 0.9999]]))
    np.testing.assert_array_equal(t.decode(high), t.decode(just_below))
    assert len(np.unique(t.decode(np.arange(t.first_token, VOCAB)[:, None].repeat(3, 1))[:, 0])) == NUM_BINS - 1


def test_out_of_range_actions_clip_and_the_gripper_is_not_rescaled():
    t = tokenizer()
    np.testing.assert_array_equal(
        t.encode(np.array([[5.0, -3.0, 7.0]])), [[VOCAB - NUM_BINS, VOCAB - 1, VOCAB - NUM_BINS]]
    )
    np.testing.assert_allclose(t.normalize(np.array([0.25, 1.0, 0.3])), [0.5, 0.0, 0.3])
    with pytest.raises(ValueError, match="action token ids"):
        t.decode(np.array([[0, VOCAB - 1, VOCAB - 1]]))
    with pytest.raises(ValueError, match="leaves no room for 256 action tokens"):
        ActionTokenizer(NUM_BINS, t.statistics)
