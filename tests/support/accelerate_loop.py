"""A user's own training loop, run by ``accelerate launch``: ``Accelerator()`` told nothing, a tiny GPT-2
built from its config, two steps; prints what accelerate trained with as one ``RESULT {json}`` line."""

from __future__ import annotations

import json


def main() -> None:
    import torch
    from accelerate import Accelerator
    from transformers import AutoConfig, AutoModelForCausalLM

    accelerator = Accelerator()
    config = AutoConfig.for_model(
        "gpt2", n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    model = AutoModelForCausalLM.from_config(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = torch.utils.data.DataLoader(torch.randint(0, 64, (8, 16)), batch_size=4)
    model, optimizer, batches = accelerator.prepare(model, optimizer, batches)
    for batch in batches:
        accelerator.backward(model(input_ids=batch, labels=batch).loss)
        optimizer.step()
        optimizer.zero_grad()
    engine = {"engine": type(model).__name__}
    if hasattr(model, "zero_optimization_stage"):  # a DeepSpeedEngine
        engine.update(zero_stage=model.zero_optimization_stage(), bf16=model.bfloat16_enabled())
    print("RESULT", json.dumps({"distributed_type": accelerator.distributed_type.value, **engine}), flush=True)


if __name__ == "__main__":
    main()
