"""Search-space YAML files shipped with autotune (installed as the package ``autotune.spaces``)."""
