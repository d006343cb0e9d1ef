"""A real Storage whose deletes fail on demand, for the purge's error path."""

from django.core.files.storage import FileSystemStorage


class FailingDeleteStorage(FileSystemStorage):
    """``FileSystemStorage`` that raises ``OSError`` on the next ``failures`` deletes."""

    failures = 0
    attempts = 0

    def delete(self, name: str) -> None:
        type(self).attempts += 1
        if type(self).failures > 0:
            type(self).failures -= 1
            raise OSError(f"storage unavailable: cannot delete {name}")
        super().delete(name)
