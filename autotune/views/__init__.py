"""What a user sees of a study: each module reads trials through :mod:`autotune.storage` and
:mod:`autotune.result`, never through the study package.

``ranking`` (feasible trials fastest first, the speedup over the HF default), ``export`` (the winner
as TrainingArguments JSON, flags, Python or an accelerate config), ``report`` (one self-contained
HTML page), ``dashboard`` (optuna-dashboard, told the truth about feasibility), ``search_display``
(the live view of a running search and its tables), ``plan_display`` and ``devices_display`` (what the
commands that train nothing print: ``estimate``, ``devices``).
"""
