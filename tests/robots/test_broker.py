"""The action-chunk broker: k of C actions then a new query, latency-aware skipping, ensembling."""

import numpy as np
import pytest

from embodied.core.errors import ConfigError
from embodied.robots.broker import ChunkBroker


def chunk(start_value: float, size: int = 4) -> np.ndarray:
    return (start_value + np.arange(size, dtype=np.float32))[:, None]


def test_executes_k_actions_then_asks_while_finishing_the_chunk():
    broker = ChunkBroker(chunk_size=4, execute_steps=2)
    assert broker.wants_query(0)
    broker.add(chunk(10), start_tick=0, now_tick=0)
    assert broker.action(0)[0] == 10 and not broker.wants_query(0)
    assert broker.action(1)[0] == 11 and not broker.wants_query(1)
    assert broker.wants_query(2)  # k=2 executed: ask again, meanwhile the chunk goes on
    assert broker.action(2)[0] == 12 and broker.action(3)[0] == 13
    assert broker.action(4) is None  # past the chunk: the watchdog's business
    assert broker.skipped == 0


def test_actions_whose_tick_passed_during_inference_are_skipped():
    broker = ChunkBroker(chunk_size=4, execute_steps=2)
    broker.add(chunk(0), start_tick=0, now_tick=0)
    assert [broker.action(tick)[0] for tick in (0, 1, 2)] == [0, 1, 2]
    broker.add(chunk(20), start_tick=2, now_tick=3)  # asked at tick 2, answered at tick 3
    assert broker.action(3)[0] == 21  # the newest chunk's action for tick 3, not its first
    assert broker.skipped == 1


def test_a_chunk_that_finds_the_robot_standing_still_starts_at_its_first_action():
    """Only ticks the robot moved on are skipped: at an episode's start and after a chunk ran
    out, the robot waited for the answer, and so did its world."""
    broker = ChunkBroker(chunk_size=4, execute_steps=4)
    broker.add(chunk(0), start_tick=0, now_tick=3)  # the episode's first answer, 3 ticks late
    assert [broker.action(tick)[0] for tick in (3, 4, 5, 6)] == [0, 1, 2, 3]
    assert broker.action(7) is None and broker.wants_query(7)
    broker.add(chunk(20), start_tick=7, now_tick=9)  # asked when the chunk ran out (synchronous)
    assert broker.action(9)[0] == 20 and broker.skipped == 0


def test_a_chunk_skips_the_ticks_the_robot_moved_on_not_those_it_stood():
    broker = ChunkBroker(chunk_size=4, execute_steps=2)
    broker.add(chunk(20), start_tick=0, now_tick=0)
    assert [broker.action(tick)[0] for tick in (0, 1, 2, 3)] == [20, 21, 22, 23]
    # asked at tick 2 while 2 actions were left: those 2 ran, then the robot stood at tick 4
    broker.add(chunk(40), start_tick=2, now_tick=5)
    assert broker.action(5)[0] == 42 and broker.skipped == 2
    broker.clear()  # a new episode: its first answer finds the robot standing
    broker.add(chunk(60), start_tick=0, now_tick=3)
    assert broker.action(3)[0] == 60 and broker.skipped == 2


def test_ticks_the_loop_stalled_over_count_as_executed_where_a_chunk_covered_them():
    broker = ChunkBroker(chunk_size=8, execute_steps=4)
    broker.add(chunk(0, 8), start_tick=0, now_tick=0)
    assert [broker.action(tick)[0] for tick in range(4)] == [0, 1, 2, 3]
    broker.stalled(4, 7)  # the loop fell behind over ticks 4-6 (the held chunk had them)
    broker.add(chunk(100, 8), start_tick=3, now_tick=7)  # asked at tick 3, taken at tick 7
    assert broker.action(7)[0] == 104 and broker.skipped == 4  # the held chunk would give its 7th too


def test_an_answer_older_than_one_held_is_ignored():
    broker = ChunkBroker(chunk_size=4, execute_steps=1)
    broker.add(chunk(20), start_tick=2, now_tick=2)
    broker.add(chunk(0), start_tick=1, now_tick=2)
    assert broker.action(2)[0] == 20


def test_temporal_ensembling_weights_older_chunks_more():
    broker = ChunkBroker(chunk_size=4, execute_steps=1, mode="ensemble", ensemble_decay=0.5)
    broker.add(chunk(0), start_tick=0, now_tick=0)
    broker.add(chunk(100), start_tick=1, now_tick=1)
    weights = np.exp(-0.5 * np.arange(2))
    expected = (weights[0] * 1 + weights[1] * 100) / weights.sum()  # both chunks' action for tick 1
    assert broker.action(1)[0] == pytest.approx(expected)


def test_clear_forgets_the_last_episode():
    broker = ChunkBroker(chunk_size=4, execute_steps=2)
    broker.add(chunk(0), start_tick=0, now_tick=0)
    broker.clear()
    assert broker.action(1) is None and broker.wants_query(1)


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="execute_steps"):
        ChunkBroker(chunk_size=4, execute_steps=5)
    with pytest.raises(ConfigError, match="mode"):
        ChunkBroker(chunk_size=4, execute_steps=1, mode="smooth")


def test_an_answer_from_the_future_is_ignored():
    broker = ChunkBroker(chunk_size=4, execute_steps=2)
    broker.add(chunk(0), start_tick=98, now_tick=0)  # the last episode's late answer, after a reset
    assert broker.action(0) is None and broker.wants_query(0)


def test_ensemble_decay_must_be_finite_and_not_negative():
    for decay in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="ensemble_decay"):
            ChunkBroker(chunk_size=4, execute_steps=1, mode="ensemble", ensemble_decay=decay)
