"""Pretrained backbones saved as a user has them, and a policy's checkpoint without its frozen
pretrained weights, saved and loaded back, for the policies whose `pretrained_frozen` names
some."""

from pathlib import Path
from typing import Callable

import torch

from embodied.core.policy import Policy
from embodied.runs.checkpoint import load_checkpoint, load_policy_weights, save_checkpoint, without_pretrained_frozen


def save_word_tokenizer(path: Path, words: list[str]) -> None:
    """A word-level tokenizer over `words` (ids in that order; "[PAD]" and "[UNK]" among them)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]").save_pretrained(path)


def saves_whole(policy: Policy) -> bool:
    """Whether a checkpoint of `policy` keeps every weight (leaves nothing out as pretrained)."""
    everything = policy.state_dict()
    kept, left_out = without_pretrained_frozen(policy, everything)
    return left_out is None and kept is everything


def save_and_restore(
    make_policy: Callable[[], Policy], directory: Path
) -> tuple[dict[str, torch.Tensor], dict, dict[str, torch.Tensor], Path]:
    """A policy whose trainable weights all moved (as training moves them), checkpointed under
    `directory` without its frozen pretrained weights and loaded into a fresh policy, which must
    then hold the first one's whole state. Returns what the checkpoint kept, its record of what
    it left out, that whole state and the checkpoint."""
    torch.manual_seed(1)
    trained = make_policy()
    with torch.no_grad():
        for parameter in trained.parameters():
            if parameter.requires_grad:
                parameter.add_(0.1)
    whole = {name: value.detach().clone() for name, value in trained.state_dict().items()}
    kept, record = without_pretrained_frozen(trained, whole)
    assert record is not None and record["count"] == len(whole) - len(kept) > 0
    checkpoint = save_checkpoint(directory, "iter_000001", kept, {"pretrained_frozen": record}, "")

    saved, state = load_checkpoint(checkpoint)
    torch.manual_seed(2)  # other heads until the load
    restored = make_policy()
    load_policy_weights(restored, saved, state)
    assert restored.state_dict().keys() == whole.keys()
    for name, value in restored.state_dict().items():
        assert torch.equal(value, whole[name]), name
    return kept, record, whole, checkpoint


def size(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())
