"""Where ``--model``'s config lies on this machine, found without transformers or torch.

``autotune.spec.models.resolve_model`` looks in the order transformers' loads would: a local directory with
``config.json``, the Hugging Face cache (the file ``huggingface_hub.try_to_load_from_cache`` finds, the one
``AutoConfig.from_pretrained(..., local_files_only=True)`` reads), the catalog autotune ships. Knowing the file
first lets a search start answer a typo, and read a model it has described before from the derived cache,
without importing transformers and torch: 2.5 s of CPU at every ``autotune search`` start on a 2-core machine
(docs/benchmarks.md, "The test suite"), 5-8 s for a typo. Where only the hub may have it,
:func:`hub_reachable` says at once whether asking it is worth a try.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from autotune.spec.model_catalog import catalog_entry, catalog_index


@dataclasses.dataclass(frozen=True)
class ConfigOnDisk:
    """A model's config as found on disk, read as JSON.

    Attributes:
        source: ``local``, ``hf-cache`` or ``catalog``: where :func:`autotune.spec.models.resolve_model` finds it.
        values: The file's JSON object as stored (a catalog entry with its ``_autotune_*`` keys).
        local_dir: The local directory, resolved; ``None`` for the cache and the catalog.
    """

    source: str
    values: dict[str, Any]
    local_dir: str | None


def config_on_disk(name: str) -> ConfigOnDisk | None:
    """The config ``--model name`` resolves to without the network; ``None`` where it lies only on the hub, or
    where its file is not a readable JSON object (transformers' load then says what is wrong with it)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return _read(path / "config.json", "local", str(path.resolve()))
    cached = _hf_cached_config(name)
    if cached is not None:
        return _read(Path(cached), "hf-cache", None)
    catalog_name = catalog_index().get(name.lower())
    if catalog_name is not None:
        return ConfigOnDisk("catalog", catalog_entry(catalog_name), None)
    return None


def found_nowhere_offline(name: str) -> bool:
    """Whether ``name`` is no path, no catalog entry and no model in the Hugging Face cache, with the hub off
    (``HF_HUB_OFFLINE=1``): nowhere :func:`config_on_disk` or transformers' offline load would look."""
    if os.environ.get("HF_HUB_OFFLINE") != "1" or Path(name).expanduser().exists() or name.lower() in catalog_index():
        return False
    return _hf_cached_config(name) is None


def _hf_cached_config(name: str) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except ValueError:  # not a repository id (huggingface_hub's HFValidationError): nothing cached under it
        return None
    return cached if isinstance(cached, str) else None


def _read(path: Path, source: str, local_dir: str | None) -> ConfigOnDisk | None:
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return ConfigOnDisk(source, values, local_dir) if isinstance(values, dict) else None


def hub_reachable(timeout_s: float = 2.0) -> bool:
    """One quick TCP connect: without it, an offline machine spends ~25 s in the hub client's retries."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    endpoint = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout_s).close()
    except OSError:
        return False
    return True
