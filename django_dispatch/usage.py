"""What jobs cost, per attempt: ``records`` and ``summary`` (the public face).

The reads are ``queries.usage``; ``auto_needs`` (``resources="auto"``) is
``tasks.placement``'s.
"""

from .queries.usage import SUMMARY_MAX_RECORDS, records, summary
from .tasks.placement import auto_needs

__all__ = ["SUMMARY_MAX_RECORDS", "auto_needs", "records", "summary"]
