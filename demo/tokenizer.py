"""A character-level tokenizer, built locally with the ``tokenizers`` library.

Every character of the task is one token; three special tokens (padding, beginning and end of
sequence) complete the vocabulary. Wrapped in ``PreTrainedTokenizerFast`` it saves with the
checkpoint and reloads with ``AutoTokenizer`` like any Hugging Face tokenizer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

ALPHABET = "0123456789+="
PAD, BOS, EOS = "<pad>", "<s>", "</s>"


def build_tokenizer(alphabet: str = ALPHABET) -> PreTrainedTokenizerFast:
    """One token per character of ``alphabet``; an unknown character is an error, not <unk>."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"alphabet has repeated characters: {alphabet!r}")
    vocab = {token: i for i, token in enumerate([PAD, BOS, EOS, *alphabet])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()  # characters join with no separator
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        padding_side="left",
    )
