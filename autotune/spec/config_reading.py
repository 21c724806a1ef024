"""Reading ``--model``'s config with transformers, offline first, and refusing what autotune does not run.

``autotune.spec.models`` resolves and describes the model; this is how its config is read: a local directory, the
Hugging Face cache, the catalog shipped in ``autotune/catalog``, the Hub unless ``HF_HUB_OFFLINE=1``, never code a
model directory ships.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from huggingface_hub.errors import StrictDataclassError

from autotune.errors import AutotuneError, first_line
from autotune.spec.model_catalog import catalog_config, catalog_index, catalog_names
from autotune.spec.model_files import hub_reachable

# autotune builds transformers' own architectures from a config and never runs code a model
# directory or repository ships (``auto_map`` in its config.json). Every load of a config, a
# tokenizer or a model says so: told nothing, transformers asks "Do you wish to run the custom
# code? [y/N]" on a terminal and runs the code on "y", and without a terminal puts the question in
# its error (transformers/dynamic_module_utils.py, ``resolve_trust_remote_code``).
NO_MODEL_CODE: dict[str, bool] = {"trust_remote_code": False}


def load_config(name: str) -> tuple[Any, str, str | None]:
    from transformers import AutoConfig

    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise AutotuneError(f"--model {name}: the directory has no config.json; point at a saved model")
        try:
            return AutoConfig.from_pretrained(str(path), **NO_MODEL_CODE), "local", str(path.resolve())
        except (
            OSError,
            ValueError,
            TypeError,
            KeyError,
            AttributeError,
            UnicodeDecodeError,
            StrictDataclassError,
        ) as exc:
            refuse_its_own_code(name, str(path))
            # Invalid JSON, a list, no or an unknown model_type, sizes its class refuses (a width that is not a
            # multiple of the heads: huggingface_hub's strict dataclass validation, its cause the message):
            # transformers' own message says which.
            cause = exc.__cause__ if isinstance(exc, StrictDataclassError) and exc.__cause__ else exc
            raise AutotuneError(
                f"--model {name}: transformers cannot read its config.json ({first_line(cause)})"
            ) from None
    try:
        return AutoConfig.from_pretrained(name, local_files_only=True, **NO_MODEL_CODE), "hf-cache", None
    except (OSError, ValueError, StrictDataclassError):
        refuse_its_own_code(name, name, local_files_only=True)
    catalog_name = catalog_index().get(name.lower())
    if catalog_name is not None:
        return catalog_config(catalog_name), "catalog", None
    if os.environ.get("HF_HUB_OFFLINE") != "1" and hub_reachable():
        try:
            return AutoConfig.from_pretrained(name, **NO_MODEL_CODE), "hub", None
        except Exception:  # noqa: BLE001 - any hub failure means "not found" to the user
            refuse_its_own_code(name, name)
    raise unknown_model(name)


def layer_mean(config: dict[str, Any], name: str) -> Any:
    """``name``'s value for the whole model where the config sets it per layer: its mean over the layers (an int
    where every layer's is one and the mean is whole; rounded by callers that need a count); else the value itself.

    transformers 5's heterogeneous configs (``HeterogeneousConfigMixin``, integrations/heterogeneity) keep a global
    value and ``per_layer_config`` overrides by layer index; reading a per-layer attribute off the config object
    raises ``AmbiguousGlobalPerLayerAttributeError``. Gemma 4's full-attention layers (one in six) have
    ``head_dim`` 512 against 256 and, in its 26B and 31B models, fewer key/value heads (configuration_gemma4.py,
    ``global_head_dim``, ``num_global_key_value_heads``). Other configs give a size as a list, one a layer (Gemma
    3n's ``intermediate_size``). A per-layer count summed over the layers (FLOPs, saved bytes) is its mean times the
    layers, so the mean describes it exactly where the count is linear in it.
    """
    value = config.get(name)
    overrides = config.get("per_layer_config") or {}
    layers = config.get("num_hidden_layers")
    if not isinstance(overrides, dict) or not isinstance(layers, int) or layers <= 0:
        return value
    if isinstance(value, (list, tuple)) and len(value) == layers:
        by_layer = [{name: v} for v in value]
    else:
        by_layer = [overrides.get(str(i), overrides.get(i)) or {} for i in range(layers)]
    if not any(name in layer for layer in by_layer):
        return value
    values: list[float] = []
    for layer in by_layer:
        v = layer.get(name, value)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
            return value
        values.append(v)
    mean = sum(values) / layers
    return int(mean) if mean == int(mean) and all(isinstance(v, int) for v in values) else mean


def unknown_model(name: str) -> AutotuneError:
    return AutotuneError(
        f"unknown model {name!r}: give a local directory with config.json, a model in the Hugging Face "
        f"cache, or a catalog name ({', '.join(catalog_names())})"
    )


def refuse_its_own_code(name: str, location: str, **load_kwargs: Any) -> None:
    """One line for a config transformers refused because its model type needs code of its own.

    Read as transformers reads it (``PretrainedConfig.get_config_dict``, which runs nothing): a model
    type transformers does not know, with an ``auto_map`` naming the classes the directory ships.

    Raises:
        AutotuneError: That is why the config was refused.
    """
    from transformers import CONFIG_MAPPING, PretrainedConfig

    try:
        values, _ = PretrainedConfig.get_config_dict(location, **load_kwargs)
    except Exception:  # noqa: BLE001 - unreadable: the caller says why in its own words
        return
    if not isinstance(values, dict):  # a JSON list: the caller says so
        return
    model_type = values.get("model_type")
    if values.get("auto_map") and model_type not in CONFIG_MAPPING:
        raise AutotuneError(
            f"--model {name}: model type {model_type!r} is not one of transformers' own architectures (its config's "
            f"auto_map names code of its own, which autotune never runs); autotune trains only those: use a model whose "
            f"model_type transformers knows (transformers.CONFIG_MAPPING)"
        )
