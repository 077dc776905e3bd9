"""Data-parallel learning over torch.distributed (gloo on CPU, nccl on GPU).

Every rank holds the same policy and the same batch. Each computes the loss on its own
contiguous shard of every minibatch, and the gradients are averaged across ranks before the
optimizer step: DDP's arithmetic. With equal shards the average of the shard means is the
mean over the whole minibatch, so N ranks take the step one process would take on the whole
minibatch. The average is taken explicitly (one flat all-reduce) because policies are driven
through `evaluate()`, not `forward()`, and some of their parameters get no gradient in some
steps (critic warm-up, frozen backbones), which DDP's forward hooks do not allow for."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from embodied.errors import ConfigError

# Ranks 1..N-1 wait inside a collective for rank 0's next batch, through evaluations and
# rollout restarts; rank 0 kills them when it fails, so a long wait never outlives it.
IDLE_TIMEOUT = timedelta(hours=24)


class DataParallel:
    def __init__(self, rank: int, world_size: int, device: torch.device | str = "cpu"):
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device(device)  # where the collectives' own tensors live (nccl: the GPU)

    @classmethod
    def join(cls, rank: int, world_size: int, address: str, device: torch.device | str = "cpu") -> "DataParallel":
        """Join the process group at `address` (host:port, served by rank 0): nccl for a CUDA
        `device` (this rank's GPU), gloo otherwise. Ranks wait for each other's next batch
        inside a collective, so the timeout is long; a rank that dies still fails the others
        at once (the connection closes)."""
        device = torch.device(device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://{address}",
                                rank=rank, world_size=world_size, timeout=IDLE_TIMEOUT)
        return cls(rank, world_size, device)

    def shard(self, size: int) -> slice:
        """This rank's part of a minibatch of `size` rows."""
        if size % self.world_size:
            raise ConfigError(f"a minibatch of {size} samples does not split evenly over {self.world_size} learner "
                              f"ranks; choose algo.num_minibatches so that it does")
        part = size // self.world_size
        return slice(self.rank * part, (self.rank + 1) * part)

    def part(self, size: int) -> slice:
        """This rank's contiguous part of `size` rows when they need not split evenly: sizes
        differ by at most one, and a rank may get none."""
        return slice(self.rank * size // self.world_size, (self.rank + 1) * size // self.world_size)

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0's `tensor` on every rank (e.g. the minibatch order), in place."""
        if tensor.device == self.device:
            dist.broadcast(tensor, src=0)
            return tensor
        moved = tensor.to(self.device)  # nccl moves only GPU tensors
        dist.broadcast(moved, src=0)
        tensor.copy_(moved.to(tensor.device))
        return tensor

    def average_gradients(self, parameters: list[torch.nn.Parameter]) -> None:
        """Replace every gradient by its mean over the ranks; a missing gradient counts as zero
        and stays missing where it is missing on every rank. Frozen parameters are skipped."""
        trainable = [p for p in parameters if p.requires_grad]
        present = torch.tensor([p.grad is not None for p in trainable], dtype=torch.int32, device=self.device)
        dist.all_reduce(present)
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in trainable])
        dist.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for parameter, count in zip(trainable, present.tolist()):
            size = parameter.numel()
            parameter.grad = flat[offset:offset + size].view_as(parameter) if count else None
            offset += size

    def mean(self, value: float) -> float:
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return float(tensor) / self.world_size

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
