"""The console in a real browser: an incident, walked through as an operator would.

Chromium through Playwright against the live server, with a real worker process
serving the "default" queue only: a queue backs up ("emails", which nobody
serves), a task starts failing, the operator finds it from the overview, reads
the failed job, replays its dead letters in bulk once the cause is fixed,
pauses and resumes a queue, and watches the counts move without reloading.
Also checks the lists fit 1280 and 1440 px with the sidebar open. With
``DISPATCH_SCREENSHOTS=1`` it writes docs/images/console-*.png (1280 and 1920
wide, light and dark).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import django.contrib.admin
import pytest
from django.conf import settings
from django.db import connections
from django.test import override_settings

import django_dispatch
from django_dispatch.models import DeadLetter, Job
from django_dispatch.states import JobState
from django_dispatch.workflows.testing import drain_workflows
from tests.conftest import wait_until
from tests.testapp import console_tasks, tasks
from tests.testapp import workflows as wfs
from tests.testapp.models import SideEffect

try:
    from playwright.sync_api import Page, expect, sync_playwright
except ImportError:  # pragma: no cover - depends on the environment
    sync_playwright = None

from tests.admin.test_admin_browser import CHROMIUM, CHROMIUM_ARGS, PASSWORD

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
STATIC_DIRS = {
    "admin": Path(django.contrib.admin.__file__).resolve().parent / "static" / "admin",
    "django_dispatch": Path(django_dispatch.__file__).resolve().parent
    / "static"
    / "django_dispatch",
}

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(sync_playwright is None, reason="the playwright package is not installed"),
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing: run scripts/ensure-chromium"
    ),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture(scope="session", autouse=True)
def console_static_files(django_db_setup: None) -> Iterator[None]:
    """Serve the admin's static files and ours (console.js) at /static/.

    tests/settings.py has no staticfiles app; the live server serves
    STATIC_ROOT, so it points at a folder linking both apps' static folders.
    """
    if "django.contrib.staticfiles" in settings.INSTALLED_APPS:
        yield
        return
    with tempfile.TemporaryDirectory() as root:
        for name, source in STATIC_DIRS.items():
            (Path(root) / name).symlink_to(source)
        with override_settings(STATIC_URL="/static/", STATIC_ROOT=root):
            yield


@pytest.fixture
def browser_context(monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    assert sync_playwright is not None
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )

        def new_page(width: int = 1280, dark: bool = False, sidebar: bool = True) -> Page:
            context = browser.new_context(
                viewport={"width": width, "height": 900},
                color_scheme="dark" if dark else "light",
            )
            context.add_init_script(
                f"window.localStorage.setItem('django.admin.navSidebarIsOpen', "
                f"'{'true' if sidebar else 'false'}');"
                # Refresh every second: the test waits for counts to move.
                "window.DISPATCH_CONSOLE_INTERVAL = 1000;"
            )
            context.set_default_timeout(20_000)
            return context.new_page()

        try:
            yield new_page
        finally:
            browser.close()
            connections.close_all()


def shot(page: Page, name: str) -> None:
    if os.environ.get("DISPATCH_SCREENSHOTS") == "1":
        IMAGES.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(IMAGES / f"{name}.png"), full_page=True)


def login(page: Page, base: str) -> None:
    page.goto(f"{base}/admin/login/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click('input[type="submit"]')
    expect(page.locator("#site-name")).to_be_visible()


def queue_cell(page: Page, queue: str, column: str):
    return page.locator(f'#dispatch-queues tr[data-queue="{queue}"] [data-count="{column}"]')


def test_an_incident_from_the_overview_to_the_bulk_replay(
    browser_context, live_server, django_user_model, start_worker
):
    django_user_model.objects.create_superuser("operator", "op@example.com", PASSWORD)
    base = live_server.url
    # Work on "default" (served by the worker), a backlog on "emails" (not served).
    start_worker("--queues", "default", "--concurrency", "2")
    for i in range(6):
        tasks.add.enqueue(i, 1)
    failing = [console_tasks.deliver.enqueue(n) for n in (17, 23, 42)]
    for n in range(12):
        console_tasks.send_email.enqueue(f"user{n}@example.com")
    wait_until(
        lambda: (
            DeadLetter.objects.count() == 3
            and not Job.objects.filter(
                queue_name="default", state__in=["pending", "running"]
            ).exists()
        ),
        what="the worker to run the default queue",
    )

    page = browser_context(1280)
    login(page, base)
    # 1. The overview: "emails" backs up with no worker, failures on "default".
    page.goto(f"{base}/admin/django_dispatch/")
    page.click("text=Overview")
    emails = page.locator('#dispatch-queues tr[data-queue="emails"]')
    expect(emails).to_have_class("dispatch-unserved")
    expect(emails).to_contain_text("no worker")
    expect(queue_cell(page, "emails", "waiting")).to_have_text("12")
    expect(page.locator('[data-count="dead-letters"]')).to_have_text("3")
    expect(page.locator("#dispatch-workers")).to_contain_text("leader")
    shot(page, "console-overview-1280-light")

    # 2. Counts move without a reload.
    page.evaluate("window.__notReloaded = true")
    for n in range(3):
        console_tasks.send_email.enqueue(f"late{n}@example.com")
    expect(queue_cell(page, "emails", "waiting")).to_have_text("15")
    assert page.evaluate("window.__notReloaded") is True

    # A hidden tab fetches nothing; shown again, it refreshes at once.
    page.evaluate(
        """() => {
            window.__fetches = 0;
            const fetch = window.fetch;
            window.fetch = (...args) => { window.__fetches += 1; return fetch(...args); };
            Object.defineProperty(document, "hidden", {value: true, configurable: true});
            document.dispatchEvent(new Event("visibilitychange"));
            window.__fetches = 0;
        }"""
    )
    page.wait_for_timeout(3000)  # three refresh intervals
    assert page.evaluate("window.__fetches") == 0
    page.evaluate(
        """() => {
            Object.defineProperty(document, "hidden", {value: false, configurable: true});
            document.dispatchEvent(new Event("visibilitychange"));
        }"""
    )
    assert page.evaluate("window.__fetches") >= 1

    # ... and the jobs list's rows too.
    page.goto(f"{base}/admin/django_dispatch/job/?queue_name__exact=emails")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(15)
    page.evaluate("window.__notReloaded = true")
    newest = console_tasks.send_email.enqueue("latest@example.com")
    expect(rows).to_have_count(16)
    expect(rows.first).to_contain_text("waiting for a worker")
    assert page.evaluate("window.__notReloaded") is True
    # The refreshed rows still work with the action menu.
    page.check(f'input[name="_selected_action"][value="{newest.id}"]')
    expect(page.locator(".action-counter")).to_contain_text("1 of 16 selected")
    page.goto(f"{base}/admin/django_dispatch/job/overview/")

    # 3. Find the failing task: failed jobs of "default", last error in the list.
    page.locator('#dispatch-queues tr[data-queue="default"] a.dispatch-bad').click()
    expect(page.locator("#result_list")).to_contain_text("LookupError: customer")
    expect(page.locator("#result_list .dispatch-badge-failed").first).to_be_visible()
    shot(page, "console-jobs-1280-light")
    # 4. Open a failed job: the traceback.
    page.locator(f'#result_list a[href*="/job/{failing[0].id}/change/"]').first.click()
    expect(page.locator(".dispatch-traceback").first).to_contain_text(
        "LookupError: customer 17 has no address"
    )

    # 5. The cause is fixed; replay every dead letter not replayed yet, in bulk.
    SideEffect.objects.create(key=console_tasks.FIXED)
    page.goto(f"{base}/admin/django_dispatch/deadletter/?replayed=no")
    page.click("text=Replay all matching…")
    expect(page.locator("#dispatch-bulk-count")).to_have_text("3")
    shot(page, "console-bulk-replay-1280-light")
    page.click('input[type="submit"]')
    expect(page.locator(".messagelist .success")).to_have_text("3 replayed.")
    wait_until(
        lambda: SideEffect.objects.filter(key__startswith="delivered-").count() == 3,
        what="the replays to run",
    )

    # 6. Pause and resume a queue from the overview.
    page.goto(f"{base}/admin/django_dispatch/job/overview/")
    expect(page.locator('[data-count="dead-letters"]')).to_have_text("0")
    control = page.locator('button[data-queue-control="default"]')
    if control.count():  # the overview shows pause controls
        control.click()
        expect(page.locator(".messagelist .success")).to_contain_text("paused")
        expect(page.locator('#dispatch-queues tr[data-queue="default"]')).to_contain_text("paused")
        before = Job.objects.filter(state=JobState.SUCCEEDED).count()
        tasks.add.enqueue(100, 1)
        expect(queue_cell(page, "default", "waiting")).to_have_text("1")  # live, not run
        assert Job.objects.filter(state=JobState.SUCCEEDED).count() == before
        page.locator('button[data-queue-control="default"]').click()
        expect(page.locator(".messagelist .success")).to_contain_text("resumed")
        expect(queue_cell(page, "default", "waiting")).to_have_text("0")  # ran, live

    # Screenshots of the overview at both widths, both themes.
    for width in (1280, 1920):
        for dark in (False, True):
            if os.environ.get("DISPATCH_SCREENSHOTS") != "1" or (width, dark) == (1280, False):
                continue
            other = browser_context(width, dark=dark)
            login(other, base)
            other.goto(f"{base}/admin/django_dispatch/job/overview/")
            expect(other.locator("#dispatch-queues")).to_be_visible()
            shot(other, f"console-overview-{width}-{'dark' if dark else 'light'}")
            if width == 1280 and dark:
                other.goto(f"{base}/admin/django_dispatch/job/?state__exact=failed")
                shot(other, "console-jobs-1280-dark")


@pytest.mark.parametrize("width", [1280, 1440])
def test_lists_fit_with_the_sidebar_open(browser_context, live_server, django_user_model, width):
    """No column of the jobs or dead-letter lists, or the overview's queues, is cut off."""
    django_user_model.objects.create_superuser("operator", "op@example.com", PASSWORD)
    tasks.echo.using(partition_key="customer:1234567890").enqueue("x" * 200)
    job = tasks.fail_always.enqueue("a rather long error message " * 6)
    from django_dispatch.testing import drain

    drain(queues=["default"])
    assert DeadLetter.objects.filter(job_id=int(job.id)).exists()
    page = browser_context(width, sidebar=True)
    login(page, live_server.url)
    for path in ("job", "deadletter"):
        page.goto(f"{live_server.url}/admin/django_dispatch/{path}/")
        expect(page.locator("#nav-sidebar")).to_be_visible()
        last = page.locator("#result_list thead th").last
        right = last.evaluate("el => el.getBoundingClientRect().right")
        assert right <= width, f"{path}: last column ends at {right}px, viewport {width}px"
        overflow = page.evaluate("document.documentElement.scrollWidth")
        assert overflow <= width, f"{path}: the page scrolls sideways ({overflow}px)"
    # The overview's queue table too.
    tasks.echo.enqueue("backlog")
    page.goto(f"{live_server.url}/admin/django_dispatch/job/overview/")
    last = page.locator("#dispatch-queues thead th").last
    right = last.evaluate("el => el.getBoundingClientRect().right")
    assert right <= width, f"overview: last column ends at {right}px, viewport {width}px"


def test_workflow_run_graph_screenshot(browser_context, live_server, django_user_model):
    django_user_model.objects.create_superuser("operator", "op@example.com", PASSWORD)
    run = wfs.gated.start({"key": "shot"})
    drain_workflows()
    page = browser_context(1280)
    login(page, live_server.url)
    page.goto(f"{live_server.url}/admin/django_dispatch/workflowrun/{run.pk}/change/")
    expect(page.locator(".dispatch-dag .node.failed")).to_have_count(1)
    shot(page, "console-workflow-run-1280-light")
