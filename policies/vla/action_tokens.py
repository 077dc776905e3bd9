"""Continuous actions as tokens of a language model's vocabulary (OpenVLA style).

Each action dimension is normalised to [-1, 1] with its q01/q99 bounds (dimensions named in
`exempt`, e.g. a gripper already in [-1, 1], are only clipped), then discretised against 256
uniform bin edges over [-1, 1] and mapped to the LAST 256 ids of the vocabulary:

    token = vocab_size - digitize(x, edges)        digitize in 1..256, so tokens in [V-256, V-1]

Decoding maps a token back to the centre of its bin. 256 edges bound only 255 bins, so the
token for digitize = 256 (x exactly +1) decodes to the same centre as its neighbour: 256
token ids, 255 reachable actions. This is kept, rather than "fixed", so that checkpoints
trained with this scheme decode identically here."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

NUM_BINS = 256


@dataclass
class ActionTokenizer:
    vocab_size: int
    q01: np.ndarray  # (A,) lower bound per dimension, from the demonstrations
    q99: np.ndarray  # (A,) upper bound
    exempt: list[int] = field(default_factory=list)  # dimensions already in [-1, 1] (e.g. the gripper)

    def __post_init__(self) -> None:
        self.q01 = np.asarray(self.q01, dtype=np.float64)
        self.q99 = np.asarray(self.q99, dtype=np.float64)
        if self.q01.shape != self.q99.shape or self.q01.ndim != 1:
            raise ValueError(f"q01 and q99 must be vectors of one length, got {self.q01.shape} and {self.q99.shape}")
        self.scaled = np.ones(self.q01.shape, dtype=bool)
        self.scaled[list(self.exempt)] = False
        flat = np.flatnonzero(self.scaled & (self.q99 <= self.q01))
        if len(flat):  # an exempt dimension passes as it is: its bounds are never used
            raise ValueError(f"every scaled dimension's q99 must exceed its q01: not dimensions {flat.tolist()}")
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
        return int(self.q01.shape[0])

    def normalize(self, actions: np.ndarray) -> np.ndarray:
        actions = np.asarray(actions, dtype=np.float64)
        scaled = 2.0 * (actions - self.q01) / (self.q99 - self.q01) - 1.0
        return np.clip(np.where(self.scaled, scaled, actions), -1.0, 1.0)

    def unnormalize(self, normalized: np.ndarray) -> np.ndarray:
        unscaled = (np.asarray(normalized) + 1.0) / 2.0 * (self.q99 - self.q01) + self.q01
        return np.where(self.scaled, unscaled, normalized)

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
