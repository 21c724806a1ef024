"""What is trained, where, and within what: the search's specification, decided before any trial.

Each module is public and imported by name: ``models`` (``--model`` resolved offline into a
:class:`~autotune.spec.models.ModelSpec`, the model built from its config), ``devices`` (what the parent knows
of a device), ``measured_peaks`` (achievable matmul peaks stored by ``devices --calibrate``), ``ceiling`` (the
memory ceiling and the one rule of what fits), ``dataset`` (``--dataset`` prepared once in the parent),
``dataset_files`` (``--dataset``'s files read), ``peft`` (``--peft``), ``flops`` (model and hardware FLOPs per
sample), ``measure`` (how long a trial measures), ``files`` (the one reader of the files a user names, and
whole-or-nothing writes), ``chat_corpus`` (a generated multi-turn chat corpus, ``autotune chat-corpus``),
``synthetic_tokenizer`` (an offline word-level tokenizer with a chat template, for models that have none on
disk).
"""
