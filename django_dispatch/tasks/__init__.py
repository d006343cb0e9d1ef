"""Tasks: the Task class and its options, the registry of aliases, enqueueing, results.

What a task *is* and how a call becomes a row: above the store (which
inserts and reads rows) and below the adapters (the backend Django calls,
the admin, the runtime), which all go through here for a task's options,
its enqueue plan and its results.
"""
