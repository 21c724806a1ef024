"""Whether a model keeps the samples of a flattened row apart, as the installed transformers runs it.

A flattened micro-batch (the ``padding`` lever's ``padding_free``, the ``packing`` lever's
``padding_free`` and ``bfd``) puts several samples in one row with ``position_ids`` restarting at each
and no attention mask. Whether they stay apart is a property of the architecture, the attention kernel
and the trial's arguments together, not of the batching alone (issue 38):

* the mask: transformers/masking_utils.py makes the causal mask block-diagonal from the position ids
  (``_preprocess_mask_arguments`` -> ``find_packed_sequence_indices``) only for a model that builds its
  mask through ``create_causal_mask`` with them, and only without a cache (``cache is None``): a model
  given ``use_cache=True`` in training builds a ``DynamicCache`` and one causal mask over the row
  (gradient checkpointing turns the cache off in training: utils/generic.py
  ``merge_with_config_defaults``). BLOOM and MPT (ALiBi) build their own masks and never read them;
  an encoder's bidirectional mask ignores them;
* the flash kernels: ``_flash_attention_forward`` (modeling_flash_attention_utils.py) runs varlen from
  the ``cu_seq_lens`` TRL's collator passes, or from packed ``position_ids``, only where the model passes
  them on to its attention function.

So autotune asks transformers: a copy of the model's own config, shrunk to two layers and a small
width (the mask and the kernels' inputs do not depend on the width), is built with the trial's kernel
and run on a flattened row of two samples built by the trial's own collator, in training mode as the
trainer runs it (the Trainer: ``model.config.use_cache`` from the arguments, trainer.py "Finalize";
TRL's ``SFTTrainer``: ``use_cache=False`` on every forward, sft_trainer.py ``compute_loss``), and each
sample's logits are compared with the same sample run alone. The answer is kept on disk
(``autotune.spec.derived_cache``: per config, kernel, trainer, cache and checkpointing, and the installed
torch, transformers and TRL).

The flash kernels need CUDA and their package. On a machine without them the row runs through a
stand-in of FlashAttention's entry point (:func:`_flash_stand_in`, a fake of a CUDA kernel that cannot
run here): it takes exactly the decisions ``_flash_attention_forward`` takes (the padding mask, else
the ``cu_seq_lens`` given, else packed position ids by transformers' own ``_is_packed_sequence``), and
computes each block with SDPA. Flex attention compiles a kernel for a GPU; its mask is the same
``create_causal_mask`` result as SDPA's (masking_utils.py ``flex_attention_mask`` builds a BlockMask
from the same mask function), so it is answered by SDPA's run (eager's where the model has no SDPA).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.spec.derived_cache import cached
from autotune.spec.positions import first_position
from autotune.trainers import get as trainer_named

if TYPE_CHECKING:
    import torch

    from autotune.spec.models import ModelSpec

# The two samples of the probe row: different lengths, so a leak cannot cancel by symmetry.
PROBE_LENGTHS = (13, 9)
# Largest |logit difference| of a sample in the row against the same sample alone that still counts as
# apart: fp32 on a CPU, a correct row measured 2e-6 to 5e-6 (llama, qwen2, mistral, gemma, gpt2),
# a leak 4.9 to 8.7 (bloom, mpt; any decoder with a cache).
APART_TOLERANCE = 1e-3
# The probe's width: the mask and what reaches the kernel do not depend on it.
_HEADS, _LAYERS, _VOCAB = 4, 2, 512
_FLASH_STAND_IN = "autotune_varlen_stand_in"  # a name without "flash": transformers reads one as a Hub kernel
_TOKEN_ID_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id")


def flattened_rows_leak(
    model: ModelSpec, attention: str | None, trainer: str, use_cache: bool = False, checkpointing: bool = False
) -> str:
    """Why ``model`` under ``attention`` would let the samples of a flattened row attend to each other;
    ``""`` where each keeps exactly its own logits.

    Args:
        model: The workload's model (its config is shrunk, not its architecture).
        attention: The ``attn_implementation`` lever's value; ``None``: the model's default.
        trainer: ``trainer`` (transformers' ``DataCollatorWithFlattening``, the arguments' ``use_cache``)
            or ``sft`` (TRL's padding-free collator, ``use_cache=False`` on every forward).
        use_cache: The arguments' ``use_cache`` (the Trainer only).
        checkpointing: Gradient checkpointing on (it turns a cache off in training).
    """
    use_cache = use_cache and trainer_named(trainer).honours_use_cache  # SFTTrainer passes use_cache=False
    key = {
        "config": model.hf_config,
        "task": model.task,
        "attention": attention,
        "trainer": trainer,
        "use_cache": use_cache,
        "checkpointing": checkpointing and use_cache,  # it only matters by turning the cache off
    }
    difference = cached(
        "samples-apart", key, __file__, lambda: _largest_difference(model, attention, trainer, use_cache, checkpointing)
    )
    if isinstance(difference, str):
        return f"autotune could not check that {model.name} keeps flattened samples apart ({difference})"
    if difference <= APART_TOLERANCE:
        return ""
    kernel = attention or "its default"
    cache = " with use_cache true" if use_cache else ""
    return (
        f"{model.name} ({model.model_type}) under {kernel} attention{cache} lets the samples of a flattened row attend "
        f"to each other (a sample's logits moved by {difference:.3g} against the sample alone, measured with the "
        "installed transformers)"
    )


def _largest_difference(
    model: ModelSpec, attention: str | None, trainer: str, use_cache: bool, checkpointing: bool
) -> float | str:
    """The largest |logit| difference of a sample in a flattened row against itself alone, or why the
    probe could not run (a config the shrinking does not fit)."""
    import torch

    try:
        built = _build(model, attention)
        if checkpointing:
            built.activation_checkpointing_enable()  # as Trainer.train does (trainer.py, "Activate activation checkpointing")
        built.train()  # as the trainer runs it: the cache rules depend on training mode
        built.config.use_cache = use_cache  # transformers/trainer.py: model.config.use_cache = args.use_cache
        generator = torch.Generator().manual_seed(1)
        samples = [torch.randint(5, _VOCAB - 1, (n,), generator=generator).tolist() for n in PROBE_LENGTHS]
        batch = _flattened_batch(samples, trainer, getattr(built.config, "pad_token_id", None) or 0, model.model_type)
        extra = {} if trainer_named(trainer).honours_use_cache else {"use_cache": False}
        with torch.random.fork_rng():
            row = built(**{k: v for k, v in batch.items() if k != "labels"}, **extra).logits[0]
            worst, start = 0.0, 0
            for sample in samples:
                alone = built(input_ids=torch.tensor([sample]), use_cache=False).logits[0]
                worst = max(worst, float((row[start : start + len(sample)] - alone).abs().max().detach()))
                start += len(sample)
    except Exception as exc:  # noqa: BLE001 - any failure leaves the question open: refused, with the reason
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}"
    return worst


def _flattened_batch(samples: list[list[int]], trainer: str, pad_token_id: int, model_type: str) -> dict[str, Any]:
    """The row the trial's collator makes of ``samples``: the ``padding`` lever's (the Trainer,
    :func:`flattening_collator`), or the one SFTTrainer builds for ``padding_free`` and ``bfd`` (trl/trainer/
    sft_trainer.py: ``DataCollatorForLanguageModeling(padding_free=True)``)."""
    collator = trainer_named(trainer).padding_free_collator(pad_token_id)
    if collator is not None:
        return collator([{"input_ids": s} for s in samples])
    return dict(flattening_collator(pad_token_id, model_type)([{"input_ids": s} for s in samples]))


def flattening_collator(pad_token_id: int, model_type: str) -> Any:
    """transformers' ``DataCollatorWithFlattening`` as the ``padding`` lever's ``Flattened`` batches use
    it (and this probe): position ids restarting at each sample, the first label of each -100.
    RoBERTa-like models number positions from ``pad_token_id + 1`` (that class's docstring)."""
    from transformers import DataCollatorWithFlattening

    start = first_position(model_type, pad_token_id)  # autotune.spec.positions: read from transformers' source
    return DataCollatorWithFlattening(return_position_ids=True, separator_id=-100, position_ids_start=start)


def _build(model: ModelSpec, attention: str | None) -> Any:
    """The model's architecture at the probe's size, dropout off, with ``attention``'s kernel (or the
    stand-in of it that runs here)."""
    import torch
    from transformers import AutoConfig

    from autotune.spec.models import build_model

    values = dict(model.hf_config)
    text_values = dict(model.text_config)
    if text_values.get("per_layer_config"):
        # A heterogeneous config (Gemma 4's full-attention layers' own head size): the probe's layers take the
        # global values. What it checks, the masks and positions, goes by layer type, not by head size; and a
        # per-layer attribute read off the config object raises (``layer_mean``'s docstring).
        text_values["per_layer_config"] = {}
    values = {**values, model.text_config_key: text_values} if model.text_config_key else text_values
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    text = config.get_text_config(decoder=True)
    _shrink(text)
    for tower in vars(config).values():  # a multimodal model's vision or audio tower: built, never run by text
        if tower is not text and hasattr(tower, "to_dict") and getattr(tower, "num_hidden_layers", None):
            tower.num_hidden_layers = 1
    kernel = _runnable_kernel(attention, config, model)
    torch.manual_seed(0)
    built = build_model(config, model.task, **({"attn_implementation": kernel} if kernel else {}))
    for module in built.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return built


def _runnable_kernel(attention: str | None, config: Any, model: ModelSpec) -> str | None:
    """The kernel the probe runs for ``attention``: itself, the flash stand-in, or SDPA for flex."""
    if attention is not None and attention.startswith("flash_attention"):
        _register_flash_stand_in()
        return _FLASH_STAND_IN
    if attention == "flex_attention":
        from autotune.levers.attention import ATTN_IMPLEMENTATION

        rule = ATTN_IMPLEMENTATION.unavailable_for_model
        assert rule is not None
        return "sdpa" if not rule("sdpa", model, {}, {}) else "eager"
    return attention


def _shrink(config: Any) -> None:
    """Two layers (one of each kind a hybrid model has), four heads of the model's own head size
    (rotary tables and ALiBi slopes are sized by it), a 512-token vocabulary, no dropout."""
    heads = getattr(config, "num_attention_heads", _HEADS) or _HEADS
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None)
    small = min(heads, _HEADS)
    if kv_heads is not None:
        config.num_key_value_heads = small if kv_heads == heads else max(1, min(kv_heads, small // 2))
    if getattr(config, "head_dim", None):
        config.head_dim = head_dim
    config.num_attention_heads = small
    config.hidden_size = head_dim * small
    for name in ("intermediate_size", "n_inner", "ffn_dim"):
        if getattr(config, name, None):
            setattr(config, name, 2 * config.hidden_size)
    layer_types = getattr(config, "layer_types", None)
    if layer_types:
        config.layer_types = list(dict.fromkeys(layer_types))
    config.num_hidden_layers = len(config.layer_types) if layer_types else _LAYERS
    config.vocab_size = _VOCAB
    for name in _TOKEN_ID_FIELDS:
        if isinstance(getattr(config, name, None), int) and getattr(config, name) >= _VOCAB:
            setattr(config, name, _VOCAB - 1)
    for name, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in name or "pdrop" in name):
            setattr(config, name, 0.0)
    if hasattr(config, "initializer_range"):
        config.initializer_range = 0.2  # logits far apart where samples leak (tests/levers/test_samples_stay_apart.py)


def _register_flash_stand_in() -> None:
    """Register :func:`_flash_stand_in` as an attention kernel, with FlashAttention's mask function."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    AttentionInterface.register(_FLASH_STAND_IN, _flash_stand_in)
    ALL_MASK_ATTENTION_FUNCTIONS.register(_FLASH_STAND_IN, flash_attention_mask)


def _flash_stand_in(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A stand-in of transformers' FlashAttention entry point for a machine without CUDA (a fake of the
    kernel, not of its inputs): the blocks ``_flash_attention_forward`` would give the varlen kernel
    (modeling_flash_attention_utils.py: the padding mask first, then ``cu_seq_lens_q`` given, then packed
    ``position_ids``), each attended by SDPA; one block where it would call the plain kernel."""
    import torch
    from transformers.modeling_flash_attention_utils import _is_packed_sequence, prepare_fa_kwargs_from_position_ids

    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    length = query.shape[2]
    blocks = torch.zeros(length, dtype=torch.long)
    if attention_mask is not None:
        pass  # padding: the probe's rows have none, and a padded batch keeps one sample a row
    elif kwargs.get("cu_seq_lens_q") is not None:
        blocks = _block_ids(kwargs["cu_seq_lens_q"], length)
    elif _is_packed_sequence(kwargs.get("position_ids"), query.shape[0]):
        (cu_seq_lens, _), _ = prepare_fa_kwargs_from_position_ids(kwargs["position_ids"])
        blocks = _block_ids(cu_seq_lens, length)
    allowed = blocks[:, None] == blocks[None, :]
    if causal:
        allowed = allowed & torch.ones(length, length, dtype=torch.bool).tril()
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=allowed, scale=scaling, enable_gqa=key.shape[1] != query.shape[1]
    )
    return out.transpose(1, 2).contiguous(), None


def _block_ids(cu_seq_lens: torch.Tensor, length: int) -> torch.Tensor:
    import torch

    starts = torch.zeros(length, dtype=torch.long)
    starts[cu_seq_lens[1:-1].long()] = 1
    return starts.cumsum(0)
