"""The action-chunk broker: turns chunks of C actions from the policy server into one action
per control tick.

Time is counted in control ticks. A chunk answers the observation taken at tick s: its action
j is meant for j ticks of motion after it. So an answer that took longer than a tick to arrive
starts part way in: the actions for the ticks the robot executed meanwhile (from the previous
chunk) are skipped (and counted), never executed late. Ticks on which the robot had nothing to
execute and stood still (an episode's start, a chunk run out before the next arrived) do not
count: the chunk starts where the robot stands.

- chunk mode: the newest chunk is executed; the client asks for the next one once
  `execute_steps` (k) of the current chunk's ticks have passed, and keeps executing the rest
  of the current chunk while the answer is on its way.
- ensemble mode (ACT's temporal ensembling): every stored chunk that has an action for this
  tick votes, weighted exp(-decay * i) with i = 0 for the oldest; the client asks every
  `execute_steps` ticks (usually 1).

With real-time chunking (chunk mode) a query also carries what the newest chunk still has
from its tick on (`pending`): the server samples the next chunk to agree with those actions,
so the switch from one chunk to the next does not jump."""

from __future__ import annotations

import collections

import numpy as np

from embodied.core.errors import ConfigError

MODES = ("chunk", "ensemble")


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ConfigError(f"broker mode must be one of {MODES}, got '{mode}'")


class ChunkBroker:
    def __init__(self, chunk_size: int, execute_steps: int, mode: str = "chunk", ensemble_decay: float = 0.01):
        check_mode(mode)
        if not np.isfinite(ensemble_decay) or ensemble_decay < 0:
            raise ConfigError(f"ensemble_decay must be a finite number >= 0, got {ensemble_decay}")
        if not 1 <= execute_steps <= chunk_size:
            raise ConfigError(f"execute_steps must be in [1, chunk size {chunk_size}], got {execute_steps}")
        self.chunk_size = chunk_size
        self.execute_steps = execute_steps
        self.mode = mode
        self.ensemble_decay = ensemble_decay
        # (tick of the chunk's observation, tick its first kept action is for, the actions)
        self.chunks: collections.deque[tuple[int, int, np.ndarray]] = collections.deque()
        self.skipped = 0  # chunk actions for ticks the robot executed before the chunk arrived
        self.acted_until = 0  # one past the last tick an action was given for

    def clear(self) -> None:
        """A new episode: nothing of the last one may be executed."""
        self.chunks.clear()
        self.acted_until = 0

    def add(self, actions: np.ndarray, start_tick: int, now_tick: int) -> None:
        """A chunk (C, A) for the observation taken at `start_tick`, arriving at `now_tick`."""
        if start_tick > now_tick or (self.chunks and start_tick <= self.chunks[-1][0]):
            return  # from the future (a previous episode's answer) or older than one already held
        executed = min(max(self.acted_until - start_tick, 0), now_tick - start_tick)  # ticks the robot moved
        self.chunks.append((start_tick, now_tick - executed, np.asarray(actions, dtype=np.float32)))
        self.skipped += min(executed, self.chunk_size)
        while self.chunks and self.chunks[0][1] + self.chunk_size <= now_tick:
            self.chunks.popleft()

    def stalled(self, first: int, end: int) -> None:
        """Ticks [first, end) the control loop fell behind on and skipped: where a chunk had
        actions for them they count as executed, for the chunks to come as for those held."""
        covered = [tick for tick in range(first, end) if self._live(tick)]
        if covered:
            self.acted_until = max(self.acted_until, covered[-1] + 1)

    def _live(self, tick: int) -> list[tuple[int, np.ndarray]]:
        """The chunks that have an action for `tick` (with the tick of their first), oldest first."""
        return [(start, actions) for _, start, actions in self.chunks if 0 <= tick - start < self.chunk_size]

    def action(self, tick: int) -> np.ndarray | None:
        """The action for `tick`, or None when no chunk covers it (the robot stands still; the
        watchdog's business)."""
        live = self._live(tick)
        if not live:
            return None
        self.acted_until = max(self.acted_until, tick + 1)
        if self.mode == "chunk":
            start, actions = live[-1]
            return actions[tick - start]
        weights = np.exp(-self.ensemble_decay * np.arange(len(live)))
        votes = np.stack([actions[tick - start] for start, actions in live])
        return (weights[:, None] * votes).sum(0) / weights.sum()

    def pending(self, tick: int) -> np.ndarray | None:
        """The newest chunk's actions from `tick` on (P, A), or None when no chunk covers it."""
        live = self._live(tick)
        if not live:
            return None
        start, actions = live[-1]
        return actions[tick - start :]

    def wants_query(self, tick: int) -> bool:
        """Whether to send a new observation at `tick` (if none is on its way already)."""
        if not self.chunks:
            return True
        newest = self.chunks[-1][1]
        return tick - newest >= self.execute_steps
