"""The learner <-> rollout link over real ZeroMQ sockets on loopback."""

import threading
import time

import numpy as np
import pytest
import torch

from embodied.core.security import generate_keys
from embodied.core.sockets import EndpointError
from embodied.runtime.learner_link import LearnerLink, LinkError
from embodied.runtime.rollout_link import RolloutLink
from embodied.runtime.wire import tensors_from_wire, tensors_to_wire
from tests.netproxy import DropProxy
from tests.waiting import wait_until

HELLO = {"policy": "mlp_gaussian", "chunk_size": 1, "spec": {"state_dim": 3, "action_low": (-1.0, -1.0)}}
EXPECTED = {"protocol": 1, "policy": "mlp_gaussian", "chunk_size": 1}
FAST = {"heartbeat_s": 0.1}


def rollout_link(learner: LearnerLink, trajectory_endpoint: str | None = None, **kwargs) -> RolloutLink:
    options = {"heartbeat_s": 0.1, "timeout_s": 1.0, "reconnect_timeout_s": 30.0, **kwargs}
    return RolloutLink(
        trajectory_endpoint or learner.trajectory_endpoint,
        learner.weights_endpoint,
        {"sender": "rollout-0", **HELLO},
        **options,
    )


def receive_all(learner: LearnerLink, count: int, timeout_s: float = 10.0) -> list[int]:
    seqs = []
    deadline = time.monotonic() + timeout_s
    while len(seqs) < count and time.monotonic() < deadline:
        delivery = learner.next_trajectory(0.1)
        if delivery is not None:
            assert delivery.body["step"] == delivery.seq  # the payload that was sent under this number
            seqs.append(delivery.seq)
            learner.consumed(delivery, policy_version=delivery.seq)
    return seqs


@pytest.fixture
def learner():
    link = LearnerLink("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", EXPECTED, **FAST)
    yield link
    link.close(tell_rollouts=False)


def test_trajectories_arrive_in_order_and_checkpoint_makes_them_durable(learner):
    rollout = rollout_link(learner)
    try:
        for step in range(1, 6):
            rollout.send_trajectory({"step": step, "observation": np.full((4, 3), step, np.float32)})
        assert receive_all(learner, 5) == [1, 2, 3, 4, 5]
        rollout.wait(lambda: rollout.consumed == 5, "consumed mark", 5)
        assert rollout.durable == 0 and rollout.in_flight() == 0
        learner.checkpointed(learner.delivery_state())
        rollout.wait(lambda: rollout.durable == 5, "durable mark", 5)
        assert rollout.learner_version == 5
    finally:
        rollout.close()


def test_reconnecting_rollout_resends_unacked_trajectories_after_network_drop(learner):
    port = int(learner.trajectory_endpoint.rsplit(":", 1)[1])
    proxy = DropProxy(port)
    rollout = rollout_link(learner, proxy.endpoint)
    try:
        rollout.send_trajectory({"step": 1})
        assert receive_all(learner, 1) == [1]
        proxy.cut()
        for step in (2, 3):
            rollout.send_trajectory({"step": step})
        # past the rollout's 1 s timeout it takes the learner for gone
        wait_until(lambda: not rollout.connected, "the rollout to take the learner for gone")
        assert learner.next_trajectory(0.2) is None  # nothing got through the cut
        proxy.restore()
        assert receive_all(learner, 2) == [2, 3]
        rollout.send_trajectory({"step": 4})
        assert receive_all(learner, 1) == [4]
        assert learner.next_trajectory(0.5) is None  # and nothing twice
        # at least one reconnection: on a busy machine a handshake slower than the 1 s timeout
        # takes another try, and what matters is above: nothing lost, nothing twice
        assert rollout.reconnects >= 1
    finally:
        rollout.close()
        proxy.close()


def test_a_closing_learner_says_close_until_the_rollout_answers(caplog):
    """A 'close' lost on the way (here: a cut connection) is said again each heartbeat, and
    the learner stops only once the rollout has answered it."""
    learner = LearnerLink("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", EXPECTED, **FAST)
    port = int(learner.trajectory_endpoint.rsplit(":", 1)[1])
    proxy = DropProxy(port)
    rollout = rollout_link(learner, proxy.endpoint)
    closer = threading.Thread(target=learner.close, kwargs={"finish_timeout_s": 120.0})
    try:
        rollout.wait(lambda: rollout.connected, "the welcome", 30)
        proxy.cut()
        closer.start()  # its first 'close' finds no connection to the rollout
        rollout.wait(lambda: not rollout.connected, "the rollout to notice the cut", 30)
        assert not rollout.closed and closer.is_alive()
        proxy.restore()
        rollout.wait(lambda: False, "the learner's close", 30)  # returns as soon as the link is closed
        closer.join(timeout=30)
        assert not closer.is_alive()
        assert "did not confirm" not in caplog.text
    finally:
        rollout.close()
        proxy.close()
        if closer.ident is not None:  # started
            closer.join(timeout=120)


def test_restarted_learner_gets_exactly_what_its_checkpoint_lacks(learner):
    # Connected for longer than its reconnect timeout: only the silence since losing the
    # learner may count against it.
    rollout = rollout_link(learner, reconnect_timeout_s=2.0)
    try:
        for step in range(1, 6):
            rollout.send_trajectory({"step": step})
        assert receive_all(learner, 5) == [1, 2, 3, 4, 5]
        checkpoint = {"rollout-0": 3}  # the learner's last checkpoint held trajectories 1..3
        learner.checkpointed(checkpoint)
        rollout.wait(lambda: rollout.durable == 3, "durable mark", 5)
        rollout.held = (learner.learner_id, 5)  # acting with the dead learner's newest weights
        time.sleep(2.5)
        endpoints = learner.trajectory_endpoint, learner.weights_endpoint
        learner.close(tell_rollouts=False)  # the learner dies without a word

        restarted = LearnerLink(*endpoints, EXPECTED, delivered=checkpoint, policy_version=3, **FAST)
        try:
            assert restarted.wait_hello(10) is not None
            restarted.publish(3, tensors_to_wire({"w": torch.zeros(1)}))
            rollout.send_trajectory({"step": 6})
            assert receive_all(restarted, 3) == [4, 5, 6]
            assert restarted.next_trajectory(0.5) is None
            rollout.wait(lambda: rollout.learner_id == restarted.learner_id, "the new learner", 5)
            # version 3 of the new learner replaces version 5 of the old one, though older
            rollout.wait(lambda: rollout.current_weights() is not None, "the new learner's weights", 10)
            assert rollout.current_weights().policy_version == 3
        finally:
            restarted.close(tell_rollouts=False)
    finally:
        rollout.close()


def test_trajectories_that_died_with_an_earlier_rollout_are_skipped_not_awaited(learner):
    first = rollout_link(learner)
    for step in (1, 2, 3, 4, 5):
        first.send_trajectory({"step": step})
    assert receive_all(learner, 5) == [1, 2, 3, 4, 5]
    first.close()  # the rollout process dies; trajectories 4 and 5 are not durable
    second = rollout_link(learner)
    try:
        second.wait(lambda: second.connected, "welcome", 10)
        for step in (6, 7):  # a new rollout continues the learner's numbering
            second.send_trajectory({"step": step})
        assert receive_all(learner, 2) == [6, 7]
        endpoints = learner.trajectory_endpoint, learner.weights_endpoint
        learner.close(tell_rollouts=False)
        # A learner resumed from a checkpoint holding 1..3 can never get 4 and 5 back.
        restarted = LearnerLink(*endpoints, EXPECTED, delivered={"rollout-0": 3}, policy_version=3, **FAST)
        try:
            assert receive_all(restarted, 2) == [6, 7]
        finally:
            restarted.close(tell_rollouts=False)
    finally:
        second.close()


def test_weights_subscriber_keeps_only_the_newest(learner):
    rollout = rollout_link(learner)
    try:
        assert learner.wait_hello(10) is not None
        for version in range(1, 20):
            learner.publish(version, tensors_to_wire({"w": torch.full((1000,), float(version))}))
        rollout.wait(
            lambda: (rollout.current_weights() or None) is not None and rollout.current_weights().policy_version == 19,
            "the newest weights",
            10,
        )
        tensors = tensors_from_wire(rollout.current_weights().tensors)
        assert torch.equal(tensors["w"], torch.full((1000,), 19.0))
    finally:
        rollout.close()


def test_weights_keep_bfloat16_and_frozen_parameters_stay_home():
    from embodied.runtime.wire import published_weights

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4)).to(torch.bfloat16)
    model[0].requires_grad_(False)  # a frozen backbone
    weights = published_weights(model)
    assert set(weights) == {"1.weight", "1.bias"}
    back = tensors_from_wire(tensors_to_wire(weights))
    assert back["1.weight"].dtype == torch.bfloat16 and torch.equal(back["1.weight"], weights["1.weight"])


def test_weights_limits_follow_the_policy_size_beyond_the_wire_defaults():
    from embodied.core.codec import DEFAULT_LIMITS
    from embodied.runtime.wire import weights_limits

    assert weights_limits(torch.nn.Linear(3, 4)) == DEFAULT_LIMITS  # a small policy: no looser than any peer
    # pi0 at its published size is 13 GB in float32; a meta module has the size without the memory
    large = torch.nn.Sequential(torch.nn.Linear(65536, 65536, device="meta"), torch.nn.Linear(65536, 8, device="meta"))
    limits = weights_limits(large)
    assert limits.max_frame_bytes >= 65536 * 65536 * 4 > DEFAULT_LIMITS.max_frame_bytes
    assert limits.max_total_bytes >= (65536 * 65536 + 65536 * 9 + 8) * 4 > DEFAULT_LIMITS.max_total_bytes


def test_rollout_takes_weights_up_to_its_limits_and_drops_larger_ones_loudly(learner, caplog):
    from embodied.core.codec import Limits

    weights = tensors_to_wire({"w": torch.ones(4096)})  # 16 kB
    for limits, arrives in ((Limits(max_total_bytes=8 << 10), False), (Limits(max_total_bytes=64 << 10), True)):
        rollout = rollout_link(learner, weights_limits=limits)
        try:
            assert learner.wait_hello(10) is not None
            learner.publish(1, weights)
            if arrives:
                rollout.wait(lambda r=rollout: r.current_weights() is not None, "the weights", 10)
            else:
                wait_until(lambda: "dropped malformed weights" in caplog.text, "the oversized weights to be dropped")
                assert rollout.current_weights() is None
        finally:
            rollout.close()


def test_handshake_mismatch_fails_loudly_on_both_ends():
    learner = LearnerLink("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", {**EXPECTED, "chunk_size": 4}, **FAST)
    rollout = rollout_link(learner)
    try:
        with pytest.raises(LinkError, match="chunk_size"):
            rollout.wait(lambda: rollout.connected, "welcome", 10)
        with pytest.raises(LinkError, match="chunk_size: this side 4, peer 1"):
            learner.wait_hello(1)
    finally:
        rollout.close()
        learner.close(tell_rollouts=False)


def test_rollout_gives_up_with_an_error_when_no_learner_answers():
    rollout = RolloutLink(
        "tcp://127.0.0.1:9",
        "tcp://127.0.0.1:9",
        {"sender": "rollout-0", **HELLO},
        heartbeat_s=0.1,
        timeout_s=0.5,
        reconnect_timeout_s=1.0,
    )
    try:
        with pytest.raises(LinkError, match="no learner answered"):
            rollout.wait(lambda: False, "a learner", 10)
    finally:
        rollout.close()


def test_curve_link_refuses_a_rollout_without_keys(tmp_path):
    keys = tmp_path / "keys"
    generate_keys(keys)
    with pytest.raises(EndpointError):  # refused before any socket binds
        LearnerLink("tcp://0.0.0.0:*", "tcp://127.0.0.1:*", EXPECTED)
    learner = LearnerLink("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", EXPECTED, keys_dir=str(keys), **FAST)
    port = learner.trajectory_endpoint.rsplit(":", 1)[1]
    weights_port = learner.weights_endpoint.rsplit(":", 1)[1]
    hello = {"sender": "rollout-0", **HELLO}
    try:
        stranger = RolloutLink(
            f"tcp://127.0.0.1:{port}",
            f"tcp://127.0.0.1:{weights_port}",
            hello,
            heartbeat_s=0.1,
            timeout_s=0.5,
            reconnect_timeout_s=30,
        )
        try:
            assert learner.wait_hello(1.5) is None
        finally:
            stranger.close()
        member = RolloutLink(
            f"tcp://127.0.0.1:{port}",
            f"tcp://127.0.0.1:{weights_port}",
            hello,
            keys_dir=str(keys),
            heartbeat_s=0.1,
            timeout_s=0.5,
        )
        try:
            assert learner.wait_hello(10) is not None
            learner.publish(1, tensors_to_wire({"w": torch.ones(2)}))
            member.wait(lambda: member.current_weights() is not None, "weights over CURVE", 10)
        finally:
            member.close()
    finally:
        learner.close(tell_rollouts=False)


def test_learner_answers_malformed_frames_with_typed_errors_and_keeps_serving(learner):
    import zmq

    from embodied.core.protocol import decode_message

    context = zmq.Context()
    peer = context.socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.connect(learner.trajectory_endpoint)
    try:
        for frames in ([b"\xc1garbage"], [b"\x93\x01\x02"], [b"\x84\xa1v\x63\xa4kind\xa5hello\xa3seq\x00\xa4body\x80"]):
            peer.send_multipart(frames)
            assert peer.poll(60_000), "no reply to a malformed message"  # as soon as it comes
            reply = decode_message(peer.recv_multipart())
            assert reply.kind == "error" and reply.body["code"] in ("malformed", "version")
    finally:
        context.destroy(linger=0)  # closes the peer too, even after a failed check
    rollout = rollout_link(learner)
    try:
        rollout.send_trajectory({"step": 1})
        assert receive_all(learner, 1) == [1]
    finally:
        rollout.close()
