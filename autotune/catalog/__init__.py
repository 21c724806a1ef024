"""Configs (numbers only, no weights) of well-known architectures, for offline model resolution."""
