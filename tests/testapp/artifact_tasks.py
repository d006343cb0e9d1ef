"""Tasks and a workflow that save artifacts, for tests/test_artifacts*.py."""

from django_dispatch import task
from django_dispatch.workflows import Workflow


@task(takes_context=True, max_attempts=3)
def save_report(context, key, fail_until=0):
    """Saves ``report.txt`` in every attempt; fails the first ``fail_until`` attempts."""
    attempt = context.task_result.attempts
    context.save_artifact("report.txt", f"{key} attempt {attempt}".encode())
    if attempt <= fail_until:
        raise RuntimeError(f"attempt {attempt} fails on purpose")
    return attempt


@task(takes_context=True)
def save_file(context, path, durable=False):
    """Streams the file at ``path`` into an artifact."""
    with open(path, "rb") as f:
        artifact = context.save_artifact("data.bin", f, durable=durable)
    return artifact.pk


exports = Workflow("tests.artifact_exports")


@exports.step()
def export(ctx):
    artifact = ctx.save_artifact("export.csv", b"id,name\n1,ada\n", content_type="text/csv")
    return {"artifact": artifact.pk}


@exports.step(after=["export"])
def consume(ctx):
    from django_dispatch import artifacts

    with artifacts.open(ctx.outputs["export"]["artifact"]) as f:
        return {"lines": f.read().decode().count("\n")}


@task(takes_context=True)
async def save_async(context, text):
    """An ``async def`` task saving through ``asave_artifact``."""
    artifact = await context.asave_artifact("async.txt", text.encode())
    return artifact.pk
