"""A synthetic tokenizer for the chat corpus, for models that have no tokenizer on disk.

The catalog's decoders are configs only (``autotune/catalog``): no weights, no tokenizer, and the
Hub is not reached for one. Reading ``--dataset`` text needs a tokenizer (``autotune.data``:
``_tokenizer_dir`` finds one in the model's local directory or Hugging Face cache, else the text is
refused). This one is built offline with the ``tokenizers`` library:

* a word-level model over the corpus's lexicon (``autotune.spec.chat_corpus.lexicon``) with a
  whitespace pre-tokenizer, so **one corpus word is one token** and a conversation's length in
  tokens is exactly what the corpus generator drew;
* special tokens: ``<|endoftext|>`` (padding), ``<|startoftext|>`` (beginning of sequence, not added
  by itself), ``<|im_start|>`` and ``<|im_end|>`` (ChatML; ``<|im_end|>`` is the end-of-sequence
  token, as in Qwen's instruct tokenizers, so the end of an assistant turn is what TRL trains the
  model to stop on), ``<|unk|>`` (any word outside the vocabulary: still one token);
* the corpus's ChatML chat template with ``{% generation %}`` markers, so TRL's
  ``assistant_only_loss=True`` works (``chat_corpus.CHATML_TEMPLATE``).

It is **synthetic**: its ids mean nothing a pretrained model learned. That is enough to measure
training speed and memory, which depend on how many tokens a batch holds (and the vocabulary's
size, the model's own), not on which tokens they are. Its vocabulary is cut to fit the model's
``vocab_size``, so every id it gives is inside the embedding table.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError
from autotune.spec.chat_corpus import CHATML_TEMPLATE, IM_END, IM_START, ROLES, lexicon

PAD_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|startoftext|>"
UNK_TOKEN = "<|unk|>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, IM_START, IM_END, UNK_TOKEN)
# The fewest corpus words worth a tokenizer: below this, most of the corpus would map to <|unk|>.
MIN_WORDS = 64


def vocabulary(vocab_size: int) -> dict[str, int]:
    """Token -> id: the special tokens, the role names, then as many lexicon words (most frequent
    first) as fit in ``vocab_size`` ids.

    Raises:
        AutotuneError: ``vocab_size`` too small to hold the special tokens, the roles and
            :data:`MIN_WORDS` words.
    """
    fixed = [*SPECIAL_TOKENS, *ROLES]
    if vocab_size < len(fixed) + MIN_WORDS:
        raise AutotuneError(
            f"the model's vocab_size {vocab_size} is too small for the synthetic tokenizer "
            f"(it needs at least {len(fixed) + MIN_WORDS} ids); use a model with a larger vocabulary"
        )
    words = lexicon()[: vocab_size - len(fixed)]
    return {token: index for index, token in enumerate([*fixed, *words])}


def build_tokenizer(vocab_size: int) -> Any:
    """The synthetic tokenizer (a ``transformers.PreTrainedTokenizerFast``) for a model of ``vocab_size`` ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocab=vocabulary(vocab_size), unk_token=UNK_TOKEN))
    # Split on whitespace only: a word is one token, and the special tokens are matched before the
    # split, so "<|im_start|>user" is two tokens.
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=IM_END,
        unk_token=UNK_TOKEN,
        additional_special_tokens=[IM_START],
        model_max_length=1 << 30,  # no length of its own: --seq-len / max_length truncate
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def tokenizer_dir(cache_root: str, vocab_size: int) -> str:
    """A directory holding the synthetic tokenizer for ``vocab_size`` (``save_pretrained``), written
    once under ``cache_root`` and reused, for what loads a tokenizer by path (``AutoTokenizer``)."""
    target = Path(cache_root) / f"synthetic-tokenizer-v{vocab_size}"
    if (target / "tokenizer.json").is_file():
        return str(target)
    scratch = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    build_tokenizer(vocab_size).save_pretrained(str(scratch))
    try:
        os.replace(scratch, target)
    except OSError:  # another process wrote it first
        shutil.rmtree(scratch, ignore_errors=True)
    return str(target)
