from .artifact import *  # noqa: F403  (each module lists its models in __all__)
from .artifact import __all__ as _artifact_models
from .cron import CronEntry
from .dead_letter import DeadLetter
from .event import *  # noqa: F403
from .event import __all__ as _event_models
from .flow import *  # noqa: F403
from .flow import __all__ as _flow_models
from .job import Job
from .leadership import Leadership
from .usage import *  # noqa: F403
from .usage import __all__ as _usage_models
from .worker import Worker
from .workflow import WorkflowRun, WorkflowTask

__all__ = [
    "CronEntry",
    "DeadLetter",
    "Job",
    "Leadership",
    "Worker",
    "WorkflowRun",
    "WorkflowTask",
    *_artifact_models,
    *_event_models,
    *_flow_models,
    *_usage_models,
]
