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


class OutOfOrderStorage(FileSystemStorage):
    """``FileSystemStorage`` that reads its content out of order (tail first), as
    a multipart uploader may: the saver cannot trust the running hash then."""

    def _save(self, name, content):
        content.seek(4)
        tail = content.read()
        content.seek(4, 0)  # any seek but to the start
        content.file.seek(0)
        head = content.file.read(4)
        from django.core.files.base import ContentFile

        return super()._save(name, ContentFile(head + tail))
