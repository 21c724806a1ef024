"""Resolve ``--model`` to a Hugging Face config, offline, and describe the model's shape.

Resolution order: a local directory with ``config.json``; the Hugging Face cache (no network);
the catalog of configs shipped in ``autotune/catalog`` (by file name or by the Hub id stored in the
entry, either in any case); the Hub, unless ``HF_HUB_OFFLINE=1``.
Only the config is needed: models are built with ``from_config`` (random weights), because
throughput and memory do not depend on the weights' values.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from autotune.errors import AutotuneError, first_line
from autotune.spec import config_reading as config_rules
from autotune.spec import meta_build as meta_rules
from autotune.spec.block_layout import BlockLayout
from autotune.spec.building import build_model, text_generation_class
from autotune.spec.config_reading import NO_MODEL_CODE, layer_mean, load_config, unknown_model
from autotune.spec.derived_cache import cached
from autotune.spec.experts import RoutedExperts
from autotune.spec.meta_build import count_on_meta
from autotune.spec.model_files import config_on_disk, found_nowhere_offline

__all__ = ["NO_MODEL_CODE", "TASKS", "ModelSpec", "PeftSpec", "build_model", "resolve_model", "spec_from_config"]

# Task heads. Encoders get sequence classification (as the HF single-GPU performance guide does);
# decoders get causal LM. ``--task`` overrides.
TASKS = ("sequence-classification", "causal-lm", "masked-lm")


@dataclasses.dataclass(frozen=True)
class PeftSpec:
    """The adapters of a study and what they change (``--peft``: :mod:`autotune.spec.peft` reads, counts and applies them).

    Attributes:
        adapter_config: ``LoraConfig`` keyword arguments (JSON values): what the export writes.
        quantize: ``4bit``: the base is loaded 4-bit (NF4, bitsandbytes); ``None``: in its dtype.
        adapter_params: Trainable parameters with the adapters on (LoRA matrices, and a
            classification head peft keeps trainable), counted by ``peft`` on the meta device.
        quantized_params: Base parameters stored 4-bit: the linear layers' weights but the output head.
        adapted_input_width: The input features of a block's adapted modules, summed: what each adapter's
            input keeps per token (its dropout mask and its 16-bit copy) scales with it.
        expert_adapter_params: The adapters' parameters on routed experts' weights (peft's ``ParamWrapper``, which
            ``"all-linear"`` targets on a mixture of experts; 0: none): such experts compute their weights'
            gradient and keep their inputs as trainable ones do.
        expert_fold_flops: One fold of those adapters into the experts' weights, ``W + s B A``: ``2 r`` FLOPs per
            element of each adapted weight, summed (``estimate._experts.expert_adapter_fold_flops`` counts how many
            folds a micro-batch runs).
    """

    adapter_config: dict[str, Any]
    quantize: str | None
    adapter_params: int
    quantized_params: int = 0
    adapted_input_width: int = 0
    expert_adapter_params: int = 0
    expert_fold_flops: float = 0.0

    @property
    def adapts_experts(self) -> bool:
        return self.expert_adapter_params > 0

    def describe(self) -> str:
        """The adapters in a few words, for a title: ``QLoRA r=16 (4-bit base, 41.9 M trained params)``."""
        kind, base = ("QLoRA", f"{self.quantize.replace('bit', '-bit')} base, ") if self.quantize else ("LoRA", "")
        return f"{kind} r={self.adapter_config.get('r')} ({base}{self.adapter_params / 1e6:,.1f} M trained params)"

    def identity(self) -> dict[str, Any]:
        """What a resumed study must match, stored with it: the adapters and the quantization (the
        export reads them back from there)."""
        return {"adapter_config": self.adapter_config, "quantize": self.quantize}


def keeps_reference_copy(holds_reference: bool, under_peft: bool, reference_precomputed: bool) -> bool:
    """Whether a run holds a second copy of the weights as its reference: a trainer with one
    (``ModelSpec.holds_reference``), but not under PEFT (the base with the adapters disabled is the
    reference) nor once the reference's log-probabilities are precomputed (the policy computes them before
    training): trl/trainer/dpo_trainer.py:908-929. The one rule the memory estimate and the trial's build read."""
    return holds_reference and not under_peft and not reference_precomputed


# The source files whose rules describe a model (the derived cache's entries change with any of them).
_RULES = (__file__, config_rules.__file__, *meta_rules.COUNT_RULES)

# The fields of a ModelSpec that its config alone gives (spec_from_config): what the derived cache keeps.
_CONFIG_FIELDS = (
    "source",
    "hf_config",
    "family",
    "task",
    "num_layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "intermediate_size",
    "vocab_size",
    "max_positions",
    "num_params",
    "num_embedding_params",
    "num_block_params",
    "block_layout",
    "experts",
    "text_config_key",
    "other_modality_params",
)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What the tuner needs to know about a model: its config and its shape.

    Attributes:
        name: The name or path the user gave.
        source: Where the config came from: ``local``, ``hf-cache``, ``catalog`` or ``hub``.
        hf_config: The Hugging Face config as a plain dict (``PretrainedConfig.to_dict()``).
        family: ``encoder`` (bidirectional attention) or ``decoder`` (causal attention).
        task: The training head: one of :data:`TASKS`.
        num_layers: Transformer blocks.
        hidden_size: Model width h.
        num_heads: Attention heads a.
        num_kv_heads: Key/value heads (fewer than ``num_heads`` under grouped-query attention).
        intermediate_size: FFN width f: under routed experts, the width a token passes through (``experts``).
        vocab_size: Vocabulary V.
        max_positions: Longest sequence the position embeddings allow (0 if unbounded, e.g. RoPE).
        num_params: All trainable parameters of the model with its task head.
        num_embedding_params: Parameters used only as lookup tables (token, position, type
            embeddings). A language-model head tied to the token embedding multiplies every token
            by that matrix, so it counts as compute, not as embedding.
        num_block_params: Parameters inside the transformer blocks (what checkpointing recomputes).
        block_layout: How a block is built, as the meta device shows it (:class:`BlockLayout`): what sets
            the tensors autograd keeps beyond Korthikanti's count.
        experts: A mixture-of-experts model's routed experts (:class:`RoutedExperts`): a token multiplies ``k / E``
            of them; ``None``: dense.
        text_config_key: Where a multimodal config keeps its language model's (Gemma 3's ``text_config``: the
            sizes above are that model's); ``""``: the config is the language model's.
        other_modality_params: Parameters of the towers a text batch never runs (a vision or audio encoder and its
            projector, which the trainer builds all the same): weights, but no FLOPs, gradients or optimizer states.
        local_dir: The local directory the config came from, if any (tokenizer lives there too).
        peft: The adapters every trial trains instead of the whole model (``--peft``), with their
            counts; ``None``: full fine-tuning. Set by :func:`autotune.spec.peft.with_peft`.
        fused_lm_head: The loss is taken through a fused, chunked language-model head that never
            makes the ``b x s x V`` logits: TRL's SFTTrainer patches every model so
            (trl/trainer/sft_trainer.py:1142-1147). Set by :func:`autotune.trainers.with_model`.
        rows_per_sample: Rows a sample puts in a micro-batch: 2 under DPO (the chosen and the rejected
            answer, one forward). Set by :func:`autotune.trainers.with_model`.
        holds_reference: The trainer keeps a frozen copy of the weights as its reference (DPO), but under
            PEFT or a precomputed reference pass. Set by :func:`autotune.trainers.with_model`.
        pads_to_longest: The trainer's own collator pads each micro-batch to its longest row where no
            batching lever shapes it (TRL's). Set by :func:`autotune.trainers.with_model`.
        dropout_modules_off: The trainer sets every ``nn.Dropout`` module's ``p`` to 0 before training (TRL's
            DPOTrainer under ``disable_dropout``, its default). Set by :func:`autotune.trainers.with_model`.
    """

    name: str
    source: str
    hf_config: dict[str, Any]
    family: str
    task: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_positions: int
    num_params: int
    num_embedding_params: int
    num_block_params: int
    block_layout: BlockLayout = dataclasses.field(default_factory=lambda: BlockLayout())
    experts: RoutedExperts | None = None
    text_config_key: str = ""
    other_modality_params: int = 0
    local_dir: str | None = None
    peft: PeftSpec | None = None
    fused_lm_head: bool = False
    rows_per_sample: int = 1
    holds_reference: bool = False
    pads_to_longest: bool = False
    dropout_modules_off: bool = False

    def fields_of_its_config(self) -> dict[str, Any]:
        """What :func:`spec_from_config` read from the config (all but the user's name and directory, and what the
        trainer and the adapters set later), as JSON gives it back: the form the derived cache keeps, so that a
        described model and one read back are the same."""
        fields = {field: getattr(self, field) for field in _CONFIG_FIELDS}
        fields["block_layout"] = dataclasses.asdict(self.block_layout)
        fields["experts"] = dataclasses.asdict(self.experts) if self.experts else None
        try:
            return dict(json.loads(json.dumps(fields)))
        except (TypeError, ValueError):  # a value JSON cannot hold: not kept, used as read
            return fields

    def keeps_reference_copy(self, reference_precomputed: bool) -> bool:
        """:func:`keeps_reference_copy` for this model's trainer and adapters."""
        return keeps_reference_copy(self.holds_reference, self.peft is not None, reference_precomputed)

    @property
    def model_type(self) -> str:
        return str(self.hf_config["model_type"])

    @property
    def text_config(self) -> dict[str, Any]:
        """The language model's config values: a multimodal config's ``text_config`` (``text_config_key``), else
        the config itself."""
        return self.hf_config[self.text_config_key] if self.text_config_key else self.hf_config

    def config_value(self, key: str) -> Any:
        """``key`` of the language model's config, else of the whole config (a multimodal config's pad token may
        be either's); ``None`` where neither gives it."""
        value = self.text_config.get(key)
        return self.hf_config.get(key) if value is None else value

    @property
    def optimized_params(self) -> int:
        """Parameters the trainer hands its optimizer: the adapters under PEFT, else all (DeepSpeed's ZeRO keeps
        states for each whether or not a batch reaches it)."""
        return self.peft.adapter_params if self.peft is not None else self.num_params

    @property
    def trainable_params(self) -> int:
        """Parameters with gradients and optimizer states: the adapters under PEFT, else all a text batch runs (a
        tower of another modality gets no gradient, and torch's optimizers keep no state for a parameter without
        one)."""
        return self.peft.adapter_params if self.peft is not None else self.num_params - self.other_modality_params

    @property
    def num_non_embedding_params(self) -> int:
        return self.num_params - self.num_embedding_params

    @property
    def active_non_embedding_params(self) -> int:
        """The non-embedding parameters one token multiplies (its FLOPs): all but the routed experts it skips and
        the towers of other modalities."""
        idle_experts = self.experts.idle_params if self.experts else 0
        return self.num_non_embedding_params - idle_experts - self.other_modality_params

    @property
    def active_params(self) -> int:
        """Every parameter one token passes through, embeddings included (a mixture of experts' active size)."""
        return self.active_non_embedding_params + self.num_embedding_params

    @property
    def experts_get_weight_gradients(self) -> bool:
        """The routed experts' weights get a gradient: trained, or folded with adapters (``PeftSpec.adapts_experts``);
        not frozen under adapters elsewhere. False for a dense model."""
        return self.experts is not None and (self.peft is None or self.peft.adapts_experts)

    @property
    def active_block_params(self) -> int:
        """The block parameters one token multiplies (what checkpointing recomputes for it)."""
        return self.num_block_params - (self.experts.idle_params if self.experts else 0)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def resolve_model(name: str, task: str | None = None) -> ModelSpec:
    """Resolve a model name or path to a :class:`ModelSpec`, without downloading weights.

    A config found on disk (:func:`autotune.spec.model_files.config_on_disk`) that was described before is read
    from the derived cache (:mod:`autotune.spec.derived_cache`: per file content, source, task and installed
    versions) without importing transformers or torch; otherwise transformers reads and sizes it.

    Args:
        name: A local directory holding ``config.json``, a Hugging Face id, or a catalog name.
        task: One of :data:`TASKS`; ``None`` picks the family's default head.

    Raises:
        AutotuneError: The name resolves nowhere, or the task is unknown.
    """
    if task is not None and task not in TASKS:
        raise AutotuneError(f"unknown --task {task!r}: choose one of {', '.join(TASKS)}")
    if found_nowhere_offline(name):  # said before transformers and torch are imported: 5-8 s of a typo's answer
        raise unknown_model(name)
    found = config_on_disk(name)
    if found is None:  # only the hub has it: nothing on disk to key a kept description by
        return _described(name, task)
    key = {"config": found.values, "source": found.source, "task": task}
    fields = cached("model-spec", key, _RULES, lambda: _described(name, task).fields_of_its_config())
    if fields["source"] != found.source:  # transformers read it elsewhere (a cached file it refused): ask it again
        return _described(name, task)
    layout, experts = BlockLayout(**fields.pop("block_layout")), fields.pop("experts", None)
    experts = RoutedExperts(**experts) if experts else None
    return ModelSpec(name=name, local_dir=found.local_dir, block_layout=layout, experts=experts, **fields)


def _described(name: str, task: str | None) -> ModelSpec:
    """The spec of ``name`` as transformers reads its config and the meta device sizes it."""
    from transformers.utils import logging as hf_logging

    # A config autotune refuses below would first draw transformers' own warnings about it (a
    # pad_token_id outside a vocabulary of 0, ...): the user gets autotune's one line instead.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        hf_config, source, local_dir = load_config(name)
    finally:
        hf_logging.set_verbosity(verbosity)
    try:
        return spec_from_config(name, hf_config, source, task, local_dir)
    except AutotuneError:
        raise
    except (
        ValueError,
        TypeError,
        IndexError,
        KeyError,
        AttributeError,
        ZeroDivisionError,
        RuntimeError,
        AssertionError,  # torch's own checks: nn.Embedding's "Padding_idx must be within num_embeddings"
        ImportError,  # an architecture whose modeling code needs a package this machine lacks
    ) as exc:
        # Building the model on the meta device runs the architecture's own shape checks (BERT's
        # "hidden size is not a multiple of the number of attention heads", ...): what they reject
        # would fail every trial, so it is the user's config to fix, said in one line.
        raise AutotuneError(
            f"--model {name}: transformers cannot build a model from its config ({first_line(exc)})"
        ) from None


def spec_from_config(name: str, hf_config: Any, source: str, task: str | None, local_dir: str | None) -> ModelSpec:
    """Describe a config's shape and count its parameters on the meta device (no memory used)."""
    model_type = hf_config.model_type
    family = "decoder" if _has_causal_head(hf_config) or _is_decoder(hf_config) else "encoder"
    task = task or ("causal-lm" if family == "decoder" else "sequence-classification")
    if getattr(hf_config, "is_encoder_decoder", False) and task != "causal-lm":
        # T5, BART, Whisper classify or fill masks through both stacks, which the FLOPs (6N over one stack's tokens),
        # the activations and the throughput prior do not count (T5's training FLOPs 3.8x what one stack's formula
        # says: torch's FlopCounterMode): refused rather than predicted and ranked wrong. As a causal LM
        # (BartForCausalLM, WhisperForCausalLM) transformers builds the decoder alone, which is counted as it runs.
        raise AutotuneError(
            f"--model {name} is an encoder-decoder ({model_type}): trained for {task} it runs two stacks, which "
            "autotune does not size; pick a decoder-only model or an encoder"
        )
    if task == "causal-lm" and family == "encoder":
        raise AutotuneError(
            f"--task causal-lm: {name} is an encoder ({model_type}); use sequence-classification or masked-lm"
        )

    # A multimodal config (Gemma 3 and 4, Llama 4, Qwen3.5) keeps its language model's in a sub-config: the sizes
    # are that model's, the count the whole model's the trainer builds (transformers' own get_text_config).
    text, text_key = _text_config(hf_config)
    hidden = _first_attr(text, "hidden_size", "n_embd", "dim", "d_model")
    heads = _first_attr(text, "num_attention_heads", "n_head", "n_heads")
    layers = _first_attr(text, "num_hidden_layers", "n_layer", "n_layers")
    ffn = _first_attr(text, "intermediate_size", "n_inner", "hidden_dim", "ffn_dim", default=4 * hidden)
    kv_heads = _first_attr(text, "num_key_value_heads", default=heads)
    declared_positions = _first_attr(text, "max_position_embeddings", "n_positions", default=0)
    vocab: Any = getattr(text, "vocab_size", None)
    _check_positive(
        name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_size=ffn,
        vocab_size=vocab,
    )
    if "max_position_embeddings" in text.to_dict() or "n_positions" in text.to_dict():
        _check_positive(name, max_position_embeddings=declared_positions)
    counts = count_on_meta(hf_config, task, declared_positions)
    # Only a learned position table (BERT's, GPT-2's) bounds the length; rotary or ALiBi positions do not.
    max_positions = declared_positions if counts.learned_positions else 0
    return ModelSpec(
        name=name,
        source=source,
        hf_config=hf_config.to_dict(),
        family=family,
        task=task,
        num_layers=int(layers),
        hidden_size=int(hidden),
        num_heads=int(heads),
        num_kv_heads=int(kv_heads),
        intermediate_size=counts.experts.mlp_width if counts.experts else int(ffn),
        vocab_size=int(vocab),
        max_positions=int(max_positions),
        num_params=counts.num_params,
        num_embedding_params=counts.num_embedding_params,
        num_block_params=counts.num_block_params,
        block_layout=counts.layout,
        experts=counts.experts,
        text_config_key=text_key,
        other_modality_params=counts.other_modality_params,
        local_dir=local_dir,
    )


def _text_config(hf_config: Any) -> tuple[Any, str]:
    """The language model's config (transformers' ``get_text_config(decoder=True)``) and the name the config
    keeps it under (``""``: the config itself)."""
    try:
        text = hf_config.get_text_config(decoder=True)
    except ValueError:  # several text configs (transformers: "ambiguous"): the config's own sizes
        return hf_config, ""
    if text is hf_config:
        return hf_config, ""
    key = next((k for k, v in vars(hf_config).items() if v is text), "")
    return (text, key) if key else (hf_config, "")


def _check_positive(name: str, **sizes: Any) -> None:
    """Every size of the model's shape is a positive integer (0 positions would also skip the --seq-len check)."""
    for field, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise AutotuneError(
                f"--model {name}: its config gives {field} {value!r}; every size must be a positive integer"
            )


def _has_causal_head(hf_config: Any) -> bool:
    architectures = getattr(hf_config, "architectures", None) or []
    return any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures)


def _is_decoder(hf_config: Any) -> bool:
    """Whether transformers generates text with the config's type (a causal-LM or an image-text-to-text class:
    ``building.text_generation_class``), not as an encoder-decoder, and has no masked-LM head for it: a decoder,
    read from the installed transformers' own auto mappings (a config without ``architectures`` still says what it
    is; BERT-like encoders have both a causal and a masked head, decoders only the first; Florence-2 and Pix2Struct
    generate text from images through an encoder-decoder)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    model_type = hf_config.model_type
    generates = text_generation_class(model_type)
    if generates is None or model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return False
    return generates == "AutoModelForCausalLM" or not getattr(hf_config, "is_encoder_decoder", False)


def _first_attr(hf_config: Any, *names: str, default: Any = None) -> Any:
    per_layer = getattr(hf_config, "per_layer_attributes", None) or ()  # a heterogeneous config's (Gemma 4)
    for attr in names:
        # A per-layer attribute raises when read off the config; a list gives one value a layer (Gemma 3n's).
        value: Any = None if attr in per_layer else getattr(hf_config, attr, None)
        if attr in per_layer or isinstance(value, (list, tuple)):
            value = layer_mean(hf_config.to_dict(), attr)
            value = round(value) if isinstance(value, float) else value
        if value is not None:
            return value
    if default is None:
        raise AutotuneError(f"config of type {hf_config.model_type!r} has none of {names}; autotune cannot size it")
    return default
