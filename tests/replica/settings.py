"""The suite's settings with a read replica: ``DATABASES["replica"]`` is the streaming
replica ``scripts/with-replica`` started (``REPLICA_URL``) of the server at
``DATABASE_URL``, and ``DISPATCH["READ_DATABASE"]`` names it.

``TEST: {"MIRROR": "default"}``: Django creates no test database on the replica
(it could not: a standby is read-only) and points its connection at the default
one's test database, which the replica receives from the primary like any other
change, so what the tests write on the primary is read back through replication.
"""

import os
from urllib.parse import urlparse

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, DISPATCH

_url = os.environ.get("REPLICA_URL")
if not _url:
    raise RuntimeError(
        "REPLICA_URL is not set. Run the replica tier with `make test-replica` "
        "(scripts/with-postgres scripts/with-replica start a primary and its replica)."
    )
_parts = urlparse(_url)
DATABASES["replica"] = {
    **DATABASES["default"],
    "HOST": _parts.hostname or "",
    "PORT": str(_parts.port or ""),
    "TEST": {"MIRROR": "default"},
}
DISPATCH["READ_DATABASE"] = "replica"

#: The primary again under another name: a READ_DATABASE that is not a standby
#: (as a promoted old replica would be), which must serve nothing.
DATABASES["not_a_standby"] = {**DATABASES["default"], "TEST": {"MIRROR": "default"}}
