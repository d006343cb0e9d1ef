from .job import Job
from .worker import Worker

__all__ = ["Job", "Worker"]
