"""One worker process for the fencing test: ``python ns_worker.py JOB_ID WORKER_NAME`` runs
:func:`worker.runner.run_job` on the job with :class:`service.settings.Settings` from the
environment (``LIBREYOLO_*``) and prints ``result: <status>``. The test starts two of them
in PID namespaces of their own (``unshare --pid --fork --mount-proc``), so neither can see,
let alone kill, the other's engine: only the fence keeps an attempt given up from writing.
"""

from __future__ import annotations

import logging
import sys

from service.db.session import make_engine, make_session_factory
from service.settings import Settings
from worker.runner import run_job

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = Settings()
    sessions = make_session_factory(make_engine(settings.database_url))
    status = run_job(sys.argv[1], settings=settings, sessions=sessions, worker_id=sys.argv[2])
    print(f"result: {status}", flush=True)
