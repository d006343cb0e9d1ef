"""The read side: what operators see, computed by bounded queries that never write.

``console`` gathers the admin overview page, ``status`` the
``dispatch_status`` snapshot, ``queues`` the queues' backlogs, pauses and
limits, ``usage`` what jobs cost. They sit above the store and read its
tables directly, so a page opened during an incident costs a fixed number of
indexed queries, whatever the size of the job history.
"""
