"""Samples stay apart in every flattened batch the plan accepts, for every model family (issue 38, 1).

For each family autotune's catalog covers (llama, qwen2, mistral, gemma, phi3, gpt2, bloom, mpt, and a
BERT for the Trainer's padding), each attention kernel the model has on this machine and the user's
``--base-args``, the plan (``load_space``, as ``autotune search`` narrows a space) either keeps the
flattened batching or refuses it. Then the trial's own path measures whether it keeps samples apart:

* the Trainer (``padding: padding_free``): the model built as the child builds it
  (``build_model`` with the config's ``model_build_kwargs``), the batches of its ``Batching``'s collator,
  and the real ``Trainer`` built with ``training_arguments_kwargs`` (the user's ``use_cache`` included,
  which the Trainer writes into ``model.config``) computing the loss in training mode;
* TRL (``packing: padding_free`` / ``bfd``): the same model, the collator SFTTrainer builds for both
  (``DataCollatorForLanguageModeling(padding_free=True)``, sft_trainer.py) and its forward's
  ``use_cache=False`` (``SFTTrainer.compute_loss``).

Each sample's logits in the flattened row are compared with the same sample batched alone through the
same path. Accepted means apart (within fp32 noise); refused means the row would leak. Before issue
38 the plan accepted BLOOM and MPT (a sample's logits moved by 4.9-5.3) and a Llama under
``use_cache: true`` (8.7).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from autotune.levers import TrialConfig, model_build_kwargs, training_arguments_kwargs, trial_batching  # noqa: E402
from autotune.levers.attention import ATTN_IMPLEMENTATION  # noqa: E402
from autotune.space import load_space  # noqa: E402
from autotune.spec.devices import cpu_device  # noqa: E402
from autotune.spec.models import ModelSpec, build_model, spec_from_config  # noqa: E402

# Largest |logit difference| of an apart sample: fp32 noise is 2e-6 to 5e-6 here, a leak 1 to 9.
APART = 1e-3
SAMPLES = (13, 9, 6)
DECODERS = ("llama", "qwen2", "mistral", "gemma", "phi3", "gpt2", "bloom", "mpt")
# The flattened choices of each trainer's batching lever, and the lever.
FLATTENED = {"trainer": ("padding", ["padding_free"]), "sft": ("packing", ["padding_free", "bfd"])}


def tiny_model(model_type: str) -> ModelSpec:
    """A two-layer config of the family, built ``from_config`` like the catalog's tiny entries."""
    from transformers import AutoConfig

    small: dict[str, Any] = dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=256
    )
    config = AutoConfig.for_model(model_type, **small)
    if hasattr(config, "num_key_value_heads"):
        config.num_key_value_heads = 2
    if getattr(config, "head_dim", None):
        config.head_dim = 16
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(getattr(config, name, None), int) and getattr(config, name) >= 256:
            setattr(config, name, 0)
    for name, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in name or "pdrop" in name):
            setattr(config, name, 0.0)  # the comparison runs in training mode, as the trainer does
    config.initializer_range = 0.2
    task = "masked-lm" if model_type == "bert" else "causal-lm"
    if task == "causal-lm":
        # A decoder by its head (autotune.spec.models._has_causal_head): MPT is not among the known types.
        config.architectures = [f"{type(config).__name__.removesuffix('Config')}ForCausalLM"]
    return spec_from_config(f"{model_type}-tiny", config, "test", task, None)


def kernels(model: ModelSpec) -> list[str | None]:
    """The model's default and each CPU kernel it has (flash and flex need CUDA: not offered here)."""
    rule = ATTN_IMPLEMENTATION.unavailable_for_model
    assert rule is not None
    return [None] + [a for a in ("eager", "sdpa") if not rule(a, model, {}, {})]


def plan_accepts(
    model: ModelSpec, trainer: str, value: str, attn: str | None, base_args: dict[str, Any], tmp: Path
) -> bool:
    lever, _ = FLATTENED[trainer]
    default = "max_length" if trainer == "trainer" else '"off"'
    lines = [f"{lever}: [{default}, {value}]", "checkpointing: [false]", "micro_batch: [2]"]
    if attn is not None:
        lines.append(f"attn_implementation: [{attn}]")
    space_file = tmp / "space.yaml"
    space_file.write_text("\n".join(lines) + "\n")
    space = load_space(str(space_file), cpu_device(), model=model, base_args=base_args, real_data=True, trainer=trainer)
    return value in space.choices[lever]


def trial_logits(
    model: Any, trainer: str, config: TrialConfig, base_args: dict[str, Any], rows: list[list[int]], scratch: Path
) -> list[Any]:
    """Each sample's logits where the trial's path puts it: in one flattened row of ``rows``."""
    if trainer == "trainer":
        from transformers import Trainer, TrainingArguments

        collator = trial_batching(config).collator(model.config.pad_token_id or 0, model.config.model_type)
        kwargs = training_arguments_kwargs(config, "cpu", base_args)
        args = TrainingArguments(output_dir=str(scratch), report_to=[], **kwargs)
        trained = Trainer(model=model, args=args, data_collator=collator)
        batch = collator([{"input_ids": r} for r in rows])
        if args.activation_checkpointing and not model.is_activation_checkpointing:
            model.activation_checkpointing_enable()  # what Trainer.train does before its first step (trainer.py)
        model.train()
        _, outputs = trained.compute_loss(model, dict(batch), return_outputs=True)
    else:
        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

        collator = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
        batch = collator([{"input_ids": r} for r in rows])
        model.train()
        outputs = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False)
    logits, start, found = outputs.logits[0], 0, []
    for row in rows:
        found.append(logits[start : start + len(row)].detach())
        start += len(row)
    return found


def largest_difference(
    spec: ModelSpec, trainer: str, value: str, attn: str | None, base_args: dict[str, Any], scratch: Path
) -> float:
    lever, _ = FLATTENED[trainer]
    config = dataclasses.replace(TrialConfig(), **{lever: value, "attn_implementation": attn})
    torch.manual_seed(0)
    model = build_model(spec.hf_config, spec.task, **model_build_kwargs(config))
    generator = torch.Generator().manual_seed(1)
    rows = [torch.randint(5, 250, (n,), generator=generator).tolist() for n in SAMPLES]
    together = trial_logits(model, trainer, config, base_args, rows, scratch)
    alone = [trial_logits(model, trainer, config, base_args, [row], scratch)[0] for row in rows]
    return max(float((a - b).abs().max()) for a, b in zip(together, alone))


CASES = [
    (family, trainer, use_cache)
    for family in (*DECODERS, "bert")
    for trainer in ("trainer", "sft")
    for use_cache in (False, True)
    if not (family == "bert" and trainer == "sft")
]


@pytest.mark.slow  # about 100 small models built and run in this process (2-3 minutes on 2 cores)
@pytest.mark.parametrize(("family", "trainer", "use_cache"), CASES)
def test_the_plan_accepts_a_flattened_batch_exactly_where_samples_stay_apart(
    family: str, trainer: str, use_cache: bool, tmp_path: Path
) -> None:
    spec = tiny_model(family)
    base_args = {"use_cache": True} if use_cache else {}
    _, values = FLATTENED[trainer]
    wrong = []
    for attn in kernels(spec):
        for value in values:
            accepted = plan_accepts(spec, trainer, value, attn, base_args, tmp_path)
            difference = largest_difference(spec, trainer, value, attn, base_args, tmp_path)
            if accepted != (difference <= APART):
                wrong.append(
                    f"{value} attn={attn}: {'accepted' if accepted else 'refused'}, logits moved by {difference:.3g}"
                )
    assert not wrong, f"{family} under {trainer} with {base_args}: " + "; ".join(wrong)


@pytest.mark.slow  # builds and runs small models in this process
def test_checkpointing_fixed_on_keeps_a_cached_row_apart_and_is_accepted(tmp_path: Path) -> None:
    """``use_cache: true`` with ``gradient_checkpointing: true`` in ``--base-args``: checkpointing turns the
    cache off in training (utils/generic.py ``merge_with_config_defaults``), so the plan keeps
    padding_free, and the Trainer's own path keeps the samples apart."""
    spec = tiny_model("llama")
    base_args = {"use_cache": True, "gradient_checkpointing": True}
    assert plan_accepts(spec, "trainer", "padding_free", "sdpa", base_args, tmp_path)
    config = dataclasses.replace(TrialConfig(), padding="padding_free", attn_implementation="sdpa", checkpointing=True)
    torch.manual_seed(0)
    model = build_model(spec.hf_config, spec.task, **model_build_kwargs(config))
    rows = [list(range(5, 5 + n)) for n in SAMPLES]
    together = trial_logits(model, "trainer", config, base_args, rows, tmp_path)
    alone = [trial_logits(model, "trainer", config, base_args, [row], tmp_path)[0] for row in rows]
    assert max(float((a - b).abs().max()) for a, b in zip(together, alone)) <= APART


def test_base_args_that_ask_for_packing_a_model_cannot_keep_apart_are_refused_in_one_line(tmp_path: Path) -> None:
    """TRL's packing fixed by ``--base-args`` (after the model's filter ran on the space) meets the same
    rule: BLOOM's packed row is one causal mask."""
    from autotune.errors import AutotuneError

    space_file = tmp_path / "space.yaml"
    space_file.write_text('packing: ["off", bfd]\n')
    with pytest.raises(
        AutotuneError,
        match=r"--base-args packing, packing_strategy asks for packing 'bfd', which bloom-tiny cannot run: .*attend",
    ):
        load_space(
            str(space_file),
            cpu_device(),
            model=tiny_model("bloom"),
            base_args={"packing": True, "packing_strategy": "bfd"},
            real_data=True,
            trainer="sft",
        )
