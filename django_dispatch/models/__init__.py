from .cron import CronEntry
from .dead_letter import DeadLetter
from .job import Job
from .leadership import Leadership
from .worker import Worker
from .workflow import WorkflowRun, WorkflowTask

__all__ = ["CronEntry", "DeadLetter", "Job", "Leadership", "Worker", "WorkflowRun", "WorkflowTask"]
