"""Build a user's local model directory in a test: a small config and a real tokenizer trained here.

The tokenizer is a WordLevel model trained with the ``tokenizers`` library on the test corpus and
saved as a ``PreTrainedTokenizerFast``, exactly what ``AutoTokenizer.from_pretrained(dir)`` loads.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = (
    "the quick brown fox jumps over a lazy dog while seven tired engineers measure how fast small "
    "models train on busy machines and write down every number they see"
).split()


def corpus(n_documents: int, seed: int = 0) -> list[str]:
    """Documents of 3 to 60 words (some longer than a short --seq-len, so truncation happens)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 60))) for _ in range(n_documents)]


def write_jsonl(path: Path, texts: list[str], column: str = "text") -> Path:
    path.write_text("".join(json.dumps({column: text, "id": i}) + "\n" for i, text in enumerate(texts)))
    return path


def make_local_model(directory: Path, texts: list[str], family: str = "bert") -> Path:
    """Write ``config.json`` and a tokenizer trained on ``texts`` into ``directory``.

    Args:
        directory: The model directory to create.
        texts: Training text for the tokenizer.
        family: ``bert`` (encoder, [PAD]/[CLS]/[SEP]) or ``gpt2`` (decoder, no pad token).
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import BertConfig, GPT2Config, PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] if family == "bert" else ["<|endoftext|>", "[UNK]"]
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=specials))
    if family == "bert":
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            special_tokens=[("[CLS]", tokenizer.token_to_id("[CLS]")), ("[SEP]", tokenizer.token_to_id("[SEP]"))],
        )
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tokenizer,
            unk_token="[UNK]",
            pad_token="[PAD]",
            cls_token="[CLS]",
            sep_token="[SEP]",
            mask_token="[MASK]",
        )
        config = BertConfig(
            vocab_size=len(fast),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=128,
            pad_token_id=fast.pad_token_id,
        )
    else:
        fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", eos_token="<|endoftext|>")
        config = GPT2Config(vocab_size=len(fast), n_embd=32, n_layer=2, n_head=2, n_positions=128)
        config.architectures = ["GPT2LMHeadModel"]
    fast.save_pretrained(directory)
    config.save_pretrained(directory)
    return directory
