"""The job states (documented path ``django_dispatch.states.JobState``); see ``core.states``."""

from .core.states import LIVE, TERMINAL, TRANSITIONS, JobState, can_transition, to_status

__all__ = ["LIVE", "TERMINAL", "TRANSITIONS", "JobState", "can_transition", "to_status"]
