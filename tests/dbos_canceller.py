"""Another process cancelling a DBOS run (tests/test_dbos_cancel.py).

``python -m tests.dbos_canceller URL SCHEMA DBOS_SCHEMA RUN_ID REASON`` opens the journal
store and DBOS's system database (an executor of its own, driving no run) and prints what
``cancel_run`` answered: ``True`` or ``False``.
"""

from __future__ import annotations

import asyncio
import sys

from dbos import DBOS

from agent_fsm.dbos.cancelling import cancel_run
from agent_fsm.durable.postgres import PostgresStore
from tests.dbos_worker import dbos_config


def main(url: str, schema: str, dbos_schema: str, run_id: str, reason: str) -> int:
    DBOS(config=dbos_config(url, dbos_schema, "canceller", "agent_fsm_cancel"))
    DBOS.launch()
    try:
        with PostgresStore(url, schema=schema) as store:
            print(asyncio.run(cancel_run(store, run_id, reason)), flush=True)
    finally:
        DBOS.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:6]))
