"""Continuous actions as tokens of a language model's vocabulary (OpenVLA style).

Each action dimension is normalised to [-1, 1] by the model's action statistics (OpenVLA's:
its dataset's q01/q99, dimensions such as the gripper left as they are;
`policies/pretrained/statistics.py`) and clipped there, then discretised against 256 uniform
bin edges over [-1, 1] and mapped to the LAST 256 ids of the vocabulary:

    token = vocab_size - digitize(x, edges)        digitize in 1..256, so tokens in [V-256, V-1]

Decoding maps a token back to the centre of its bin. 256 edges bound only 255 bins, so the
token for digitize = 256 (x exactly +1) decodes to the same centre as its neighbour: 256
token ids, 255 reachable actions. This is kept, rather than "fixed", so that checkpoints
trained with this scheme decode identically here."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from embodied.policies.normalization import FeatureStatistics

NUM_BINS = 256


@dataclass
class ActionTokenizer:
    vocab_size: int
    statistics: FeatureStatistics  # the actions' normalisation onto [-1, 1], per dimension (A,)

    def __post_init__(self) -> None:
        if len(self.statistics.shape) != 1:
            raise ValueError(f"{self.statistics.source}: action statistics of shape {self.statistics.shape}, not (A,)")
        if self.vocab_size <= NUM_BINS:
            raise ValueError(f"vocab_size {self.vocab_size} leaves no room for {NUM_BINS} action tokens")
        self.edges = np.linspace(-1.0, 1.0, NUM_BINS)
        self.centres = (self.edges[:-1] + self.edges[1:]) / 2.0  # 255 values

    @property
    def first_token(self) -> int:
        """The lowest action token id; action tokens are [first_token, vocab_size)."""
        return self.vocab_size - NUM_BINS

    @property
    def action_dim(self) -> int:
        return self.statistics.shape[0]

    def normalize(self, actions: np.ndarray) -> np.ndarray:
        scaled = (np.asarray(actions, dtype=np.float64) - self.statistics.offset) / self.statistics.scale_in
        return np.clip(scaled, -1.0, 1.0)

    def unnormalize(self, normalized: np.ndarray) -> np.ndarray:
        return np.asarray(normalized) * self.statistics.scale_out + self.statistics.offset

    def encode(self, actions: np.ndarray) -> np.ndarray:
        """Actions (..., A) in env units -> token ids (..., A)."""
        return self.vocab_size - np.digitize(self.normalize(actions), self.edges)

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        """Token ids (..., A) -> actions (..., A) in env units (bin centres)."""
        tokens = np.asarray(tokens)
        if np.any((tokens < self.first_token) | (tokens >= self.vocab_size)):
            raise ValueError(f"action token ids must lie in [{self.first_token}, {self.vocab_size})")
        index = np.clip(self.vocab_size - tokens - 1, 0, NUM_BINS - 2)
        return self.unnormalize(self.centres[index])

    def to_bin_index(self, tokens: np.ndarray) -> np.ndarray:
        """Token ids -> positions 0..255 among the action tokens (for a softmax restricted to them)."""
        return np.asarray(tokens) - self.first_token
