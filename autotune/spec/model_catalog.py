"""The configs autotune ships (``autotune/catalog``): their names, their entries as stored, and the names each answers
to (its file name and the Hub id it was published under, in any case). Read without transformers but for
:func:`catalog_config`; ``autotune.spec.models`` resolves ``--model`` through them after a local directory and the
Hugging Face cache."""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path
from typing import Any


def catalog_names() -> list[str]:
    """Names of the configs shipped in the catalog."""
    files = resources.files("autotune.catalog").iterdir()
    return sorted(f.name[: -len(".json")] for f in files if f.name.endswith(".json"))


def catalog_entry(catalog_name: str) -> dict[str, Any]:
    """A catalog file as stored: the published config plus its ``_autotune_*`` keys (hub id, source, published size)."""
    text = resources.files("autotune.catalog").joinpath(f"{catalog_name}.json").read_text()
    return dict(json.loads(text))


@functools.cache
def catalog_index() -> dict[str, str]:
    """Every name a catalog entry answers to, lower-cased: its file name and the Hub id stored in it.

    Lower-cased so that a short name typed as on the model card (``Qwen2.5-7B``) and a Hub id typed
    in lower case (``meta-llama/llama-3.1-8b``) reach the same entry.
    """
    index: dict[str, str] = {}
    for catalog_name in catalog_names():
        index[catalog_name.lower()] = catalog_name
        hub_id = catalog_entry(catalog_name).get("_autotune_hub_id")
        if hub_id:
            index[str(hub_id).lower()] = catalog_name
    return index


def catalog_name_of(name: str) -> str | None:
    """The catalog entry ``--model name`` resolves to (by file name or Hub id, any case); ``None`` for a
    local directory (resolved before the catalog, as :func:`resolve_model` does) or a name the catalog
    does not hold. Read without transformers: the export asks it of a study's model."""
    if Path(name).expanduser().is_dir():
        return None
    return catalog_index().get(name.lower())


def catalog_hub_id(catalog_name: str) -> str | None:
    """The Hub repository a catalog entry's config was published in, which a tool loads the model from by
    name (``from_pretrained``); ``None`` for autotune's made-up test configs, which have no checkpoint."""
    hub_id = catalog_entry(catalog_name)["_autotune_hub_id"]
    return None if hub_id is None else str(hub_id)


def catalog_config(catalog_name: str) -> Any:
    """The catalog entry as transformers' config object (the ``_autotune_*`` keys left out)."""
    from transformers import AutoConfig

    values = {k: v for k, v in catalog_entry(catalog_name).items() if not k.startswith("_autotune")}
    return AutoConfig.for_model(**values)
