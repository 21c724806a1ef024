"""autotune: find the fastest way to train a Hugging Face Transformers model without running out of memory.

The data flows one way: spec -> space -> study -> runner -> result -> ranking -> export.
"""

from __future__ import annotations

__version__ = "0.1.0"
