"""Pure logic: no database, no settings, no I/O.

States and their transitions, retry and backoff, cron arithmetic, rates,
resource needs, strict JSON and size limits. Everything above computes with
these; nothing here imports anything of the package but ``core``,
``compat`` and ``exceptions``, so each module is tested without Django's
database and can be read on its own.
"""
