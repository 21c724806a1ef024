"""Makes rank 1 of a multi-rank trial late: Python imports ``sitecustomize`` at start-up from its path
(the ``site`` module), so a test that puts this directory on the path of the ranks (the
orchestrator's ``sys.path`` travels to them as ``PYTHONPATH``) holds rank 1 back before it can join
the rendezvous; the other rank waits at the rendezvous until the trial timeout kills the trial."""

import os
import time

if os.environ.get("RANK") == "1":
    time.sleep(600)
