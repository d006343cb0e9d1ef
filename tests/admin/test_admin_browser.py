"""The admin in a real browser: Chromium driven by Playwright against the live server.

What the test client cannot show: that the pages work as a person uses them
(checkboxes, the action menu, CSRF tokens in real forms, redirects and
messages). Uses Debian's /usr/bin/chromium (``scripts/ensure-chromium``), not
a browser downloaded by ``playwright install``. With ``DISPATCH_SCREENSHOTS=1``
it also refreshes the screenshots in docs/images/.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import django.contrib.admin
import pytest
from django.conf import settings
from django.db import connections
from django.test import override_settings
from django.utils import timezone

from django_dispatch.models import CronEntry, DeadLetter, Job
from django_dispatch.states import JobState
from django_dispatch.testing import drain
from tests.testapp import tasks

try:
    from playwright.sync_api import Page, expect, sync_playwright
except ImportError:  # pragma: no cover - depends on the environment
    sync_playwright = None

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ADMIN_STATIC = Path(django.contrib.admin.__file__).resolve().parent / "static"
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
PASSWORD = "correct horse battery staple"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        sync_playwright is None,
        reason="the playwright package is not installed (pip install playwright; "
        "no `playwright install` needed)",
    ),
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing: run scripts/ensure-chromium"
    ),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture(scope="session", autouse=True)
def admin_static_files(django_db_setup: None) -> Iterator[None]:
    """Let the live server serve the admin's CSS and JavaScript.

    tests/settings.py has no STATIC_URL and no staticfiles app; the live
    server's static handler then fails on every request. Serving the admin
    app's own static folder at /static/ is enough for these pages. Session
    scoped and autouse, so that it (and the test database it depends on) is
    set up before the session-scoped live_server, and torn down after it:
    otherwise the test database is dropped while the server still holds a
    connection to it.
    """
    if "django.contrib.staticfiles" in settings.INSTALLED_APPS or settings.STATIC_URL:
        yield
        return
    with override_settings(STATIC_URL="/static/", STATIC_ROOT=str(ADMIN_STATIC)):
        yield


@pytest.fixture
def page(monkeypatch) -> Iterator[Page]:
    # Playwright's sync API runs an event loop in this thread; the ORM calls
    # the test makes between browser steps are still plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    assert sync_playwright is not None
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        context = browser.new_context(viewport={"width": 1680, "height": 900})
        # Start with the admin's navigation sidebar folded: more room for the lists.
        context.add_init_script(
            "window.localStorage.setItem('django.admin.navSidebarIsOpen', 'false')"
        )
        context.set_default_timeout(15_000)
        try:
            yield context.new_page()
        finally:
            context.close()
            browser.close()
            # Inside sync_playwright() Django hands out other connections
            # (its connection handler is context-local, and Playwright runs
            # us in its own context): close them, or the test database
            # cannot be dropped at the end of the session.
            connections.close_all()


def screenshot(page: Page, name: str, **options: Any) -> None:
    """Refresh docs/images/<name>.png, only when asked (DISPATCH_SCREENSHOTS=1)."""
    if os.environ.get("DISPATCH_SCREENSHOTS") == "1":
        IMAGES.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(IMAGES / f"{name}.png"), **options)


def run_action(page: Page, action: str, *ids: int) -> None:
    for pk in ids:
        page.check(f'input[name="_selected_action"][value="{pk}"]')
    page.select_option('select[name="action"]', action)
    page.click('button[name="index"]')


def make_history() -> dict[str, Any]:
    """Jobs in every state an operator meets, two dead letters and a cron entry."""
    for i in range(3):
        tasks.add.enqueue(i, 40)
    failed = [tasks.fail_always.enqueue(f"customer {n} has no address") for n in (17, 23)]
    drain()
    tasks.echo.using(partition_key="user:17").enqueue("welcome")
    tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
    pending = tasks.record.enqueue("order-9931")
    entry = CronEntry.objects.create(
        name="nightly-report",
        schedule="30 2 * * *",
        timezone="Europe/Paris",
        task_path="tests.testapp.tasks.fail_always",
        kwargs={"message": "nightly"},
        misfire_policy=CronEntry.Misfire.LATEST,
    )
    letters = [DeadLetter.objects.get(job_id=int(r.id)) for r in failed]
    return {"failed": failed, "letters": letters, "pending": pending, "entry": entry}


def test_operator_replays_a_dead_letter_and_cancels_a_job(page, live_server, django_user_model):
    django_user_model.objects.create_superuser("operator", "op@example.com", PASSWORD)
    data = make_history()
    first, second = data["letters"]
    admin = f"{live_server.url}/admin/"

    page.goto(f"{admin}login/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click('input[type="submit"]')
    expect(page.locator("#site-name")).to_be_visible()

    # Dead letters: select one, run "Replay".
    page.goto(f"{admin}django_dispatch/deadletter/")
    expect(page.locator("#result_list")).to_contain_text("builtins.ValueError")
    run_action(page, "replay_entries", first.pk)
    expect(page.locator(".messagelist .success")).to_have_text("1 replayed.")
    screenshot(page, "admin-dead-letters", full_page=True)
    first.refresh_from_db()
    assert first.replayed_by == "operator" and first.replay_job_id is not None

    # The other one, with corrected arguments.
    page.goto(f"{admin}django_dispatch/deadletter/{second.pk}/change/")
    page.click("text=Replay with corrected arguments")
    expect(page.locator("h1")).to_contain_text(f"Replay dead letter #{second.pk}")
    page.fill('textarea[name="kwargs"]', "{}")
    page.fill('textarea[name="args"]', '["customer 23 (address fixed)"]')
    screenshot(page, "admin-replay-with-arguments", full_page=True)
    page.click('input[type="submit"][value="Replay"]')
    expect(page.locator(".messagelist .success")).to_contain_text(
        f"Dead letter #{second.pk} replayed as job #"
    )
    second.refresh_from_db()
    assert Job.objects.get(pk=second.replay_job_id).args == ["customer 23 (address fixed)"]

    # Jobs: cancel a pending one.
    pending = int(data["pending"].id)
    page.goto(f"{admin}django_dispatch/job/")
    run_action(page, "cancel_jobs", pending)
    expect(page.locator(".messagelist .success")).to_have_text(
        "1 cancelled, 0 skipped (already finished)."
    )
    row = page.locator("#result_list tr", has=page.locator(f'input[value="{pending}"]'))
    expect(row).to_contain_text("Cancelled")
    assert Job.objects.get(pk=pending).state == JobState.CANCELLED
    screenshot(page, "admin-jobs", full_page=True)

    # A failed job's detail page: arguments and the traceback, readable.
    page.goto(f"{admin}django_dispatch/job/{data['failed'][0].id}/change/")
    expect(page.locator(".dispatch-traceback").first).to_contain_text(
        "ValueError: customer 17 has no address"
    )
    screenshot(page, "admin-job-detail", full_page=True)

    # A cron entry: its definition and the next fire times, in its time zone.
    page.goto(f"{admin}django_dispatch/cronentry/{data['entry'].pk}/change/")
    expect(page.locator(".dispatch-fire-times li")).to_have_count(5)
    screenshot(page, "admin-cron-entry", full_page=True)
