"""The only writer of job, lease and worker state.

Every function here is one state transition: one statement, or one short
transaction that commits before it returns. None of them holds a lock or a
transaction while task code runs.

Writes made on behalf of a worker take its ``Lease`` and are *fenced*: they
match only ``state = 'running' AND worker_id = … AND lease_epoch = …``. Each
claim bumps the epoch, so a worker that was paused, partitioned or too slow
(and whose job was reclaimed, cancelled or timed out meanwhile) updates zero
rows and must discard its result. Functions return whether they won.

All times come from the database clock (``Now()``), never from a worker's.

Modules: ``types`` (the values passed in and out), ``enqueue`` (inserts),
``claim`` (the claim: ``sources`` read candidates, ``gates`` keep or set
aside, ``leasing`` writes the lease), ``flow`` (paused queues), ``leases``
(the worker's fenced writes), ``finish`` (the finish of a wave of
successes), ``partitions`` (per-key FIFO heads),
``maintenance`` (rescue, cancel, retry now), ``dead_letters`` (failures
kept for replay, retention), ``schedules`` (cron entries), ``leadership``
(the maintenance lease), ``workers`` (Worker rows), ``handover`` (a
recycled worker's leases read back by the process that replaced it),
``interruptions`` (an attempt cut short by the database, run again),
``workflows`` (workflow runs and steps: a package of its own).
"""

from .base import (
    NOTIFY_CHANNEL,
    caller_database,
    carrying_database,
    database_for,
    db_alias,
    db_now,
    error_entry,
    notify,
    notify_channel,
    read_database_for,
    routed_database,
    serve_database,
    using_backend,
    using_database,
)
from .claim import jobs_claim, jobs_due_exist
from .dead_letters import (
    dead_letter_claim_replay,
    dead_letter_insert,
    dead_letter_set_replay_job,
    dead_letters_delete,
    dead_letters_purge,
    jobs_delete_finished,
    jobs_purge,
)
from .enqueue import job_insert_idempotent, jobs_insert
from .finish import jobs_finish_many_if_leased
from .handover import job_claimed_if_leased
from .interruptions import job_interrupt_if_leased
from .leadership import leadership_acquire, leadership_holder, leadership_release
from .leases import (
    job_ack_cancelled,
    job_fail_if_leased,
    job_final_checkpoint_if_cancelled,
    job_finish_if_leased,
    job_progress_if_leased,
    job_release_if_leased,
    jobs_renew_leases,
)
from .maintenance import WORKER_LOST_PATH, job_cancel, jobs_rescue_expired, jobs_retry_now
from .partitions import partitions_promote_stalled
from .schedules import (
    cron_entries_claim_due,
    cron_entries_delete,
    cron_entries_due_exist,
    cron_entries_set_enabled,
    cron_entry_advance,
    cron_sync_from_settings,
)
from .sources.orm import claim_candidates, runnable_candidates
from .types import CLAIM_FIELDS, ClaimedJob, FlowState, Lease, Placement
from .workers import worker_deregister, worker_register, worker_touch, workers_delete_stale

__all__ = [
    "CLAIM_FIELDS",
    "NOTIFY_CHANNEL",
    "WORKER_LOST_PATH",
    "ClaimedJob",
    "FlowState",
    "Lease",
    "Placement",
    "caller_database",
    "carrying_database",
    "claim_candidates",
    "cron_entries_claim_due",
    "cron_entries_delete",
    "cron_entries_due_exist",
    "cron_entries_set_enabled",
    "cron_entry_advance",
    "cron_sync_from_settings",
    "database_for",
    "db_alias",
    "db_now",
    "dead_letter_claim_replay",
    "dead_letter_insert",
    "dead_letter_set_replay_job",
    "dead_letters_delete",
    "dead_letters_purge",
    "error_entry",
    "job_ack_cancelled",
    "job_cancel",
    "job_claimed_if_leased",
    "job_fail_if_leased",
    "job_final_checkpoint_if_cancelled",
    "job_finish_if_leased",
    "job_insert_idempotent",
    "job_interrupt_if_leased",
    "job_progress_if_leased",
    "job_release_if_leased",
    "jobs_claim",
    "jobs_delete_finished",
    "jobs_due_exist",
    "jobs_finish_many_if_leased",
    "jobs_insert",
    "jobs_purge",
    "jobs_renew_leases",
    "jobs_rescue_expired",
    "jobs_retry_now",
    "leadership_acquire",
    "leadership_holder",
    "leadership_release",
    "notify",
    "notify_channel",
    "partitions_promote_stalled",
    "read_database_for",
    "routed_database",
    "runnable_candidates",
    "serve_database",
    "using_backend",
    "using_database",
    "worker_deregister",
    "worker_register",
    "worker_touch",
    "workers_delete_stale",
]
