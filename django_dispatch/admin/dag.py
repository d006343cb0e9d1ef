"""A workflow run's steps drawn as a graph: server-side SVG, coloured by state.

Reading ``depends_on`` lists in a table does not show where a run is stuck
or what a failure holds back; a picture does. Steps are laid out in layers
(a step one layer right of its deepest dependency), edges follow ``after``,
a step that started a child run links to it, a ``ctx.map`` step shows how
many of its children are done and links to their list, and a waiting step
says what it waits for (the child run, or the event it expects). Colours
come from the admin's CSS variables (``styles.html``), so both themes read
well. One query
for the steps; the layout is computed here, no JavaScript.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.urls import reverse
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from ..models import WorkflowRun
from .aliases import on_selected_alias
from .common import change_url
from .workflow_steps import map_progress

#: A ``ctx.map`` step's set and its counters (see ``WorkflowTask``).
MAP_FIELDS = ["map_batch", "map_total", "map_done", "map_started", "map_max_parallel"]

NODE_W, NODE_H = 150, 44
GAP_X, GAP_Y = 50, 16
PAD = 8
#: Step states and the node class their colour comes from.
NODE_CLASS = {
    "succeeded": "ok",
    "failed": "failed",
    "running": "running",
    "waiting": "waiting",
    "skipped": "skipped",
    "cancelled": "cancelled",
}


def layers(steps: list[dict[str, Any]]) -> dict[str, int]:
    """Each step's column: 0 without dependencies, else one more than its deepest one."""
    depth: dict[str, int] = {}
    names = {s["name"] for s in steps}
    by_name = {s["name"]: s for s in steps}

    def visit(name: str, seen: frozenset[str]) -> int:
        if name in depth:
            return depth[name]
        parents = [p for p in by_name[name]["depends_on"] or [] if p in names and p not in seen]
        depth[name] = 1 + max((visit(p, seen | {name}) for p in parents), default=-1)
        return depth[name]

    for step in steps:
        visit(step["name"], frozenset())
    return depth


def waits_for(step: dict[str, Any]) -> str:
    if step["state"] != "waiting":
        return ""
    if step.get("map_batch"):
        return f"map: {step['map_done']}/{step['map_total']} done"
    if step.get("child_run_id"):
        return f"child run #{step['child_run_id']}"
    if step.get("wait_event_name"):
        key = f" ({step['wait_event_key']})" if step.get("wait_event_key") else ""
        return f"event {step['wait_event_name']}{key}"
    if step.get("wait_until"):
        return f"until {step['wait_until']:%Y-%m-%d %H:%M:%S}"
    return "waiting"


def map_summary(step: dict[str, Any]) -> str:
    """A finished ``ctx.map`` step's count of children ("" for other steps)."""
    if not step.get("map_batch"):
        return ""
    return f"{step['state']} · map {step['map_done']}/{step['map_total']}"


def dag_svg(run: WorkflowRun) -> SafeString:
    """The run's steps as an SVG graph (empty run: a line saying so)."""
    fields = ["name", "state", "depends_on", "child_run_id", "attempts", "sequence"]
    optional = ["wait_event_name", "wait_event_key", "wait_until", *MAP_FIELDS]
    model_fields = {f.name for f in run.steps.model._meta.get_fields()}
    fields += [f for f in optional if f in model_fields]
    steps = list(run.steps.order_by("sequence").values(*fields))
    if not steps:
        return mark_safe("<p>No steps.</p>")
    depth = layers(steps)
    rows: dict[int, int] = {}
    pos: dict[str, tuple[int, int]] = {}
    for step in steps:
        col = depth[step["name"]]
        row = rows.get(col, 0)
        rows[col] = row + 1
        pos[step["name"]] = (PAD + col * (NODE_W + GAP_X), PAD + row * (NODE_H + GAP_Y))
    width = PAD * 2 + (max(depth.values()) + 1) * (NODE_W + GAP_X) - GAP_X
    height = PAD * 2 + max(rows.values()) * (NODE_H + GAP_Y) - GAP_Y
    edges = []
    for step in steps:
        x2, y2 = pos[step["name"]]
        for parent in step["depends_on"] or []:
            if parent not in pos:
                continue
            x1, y1 = pos[parent]
            sx, sy, ex, ey = x1 + NODE_W, y1 + NODE_H / 2, x2 - 6, y2 + NODE_H / 2
            mid = (sx + ex) / 2
            edges.append(
                f'<path class="edge" d="M{sx},{sy} C{mid},{sy} {mid},{ey} {ex},{ey}"/>'
                f'<polygon class="arrow" points="{ex},{ey - 4} {ex + 6},{ey} {ex},{ey + 4}"/>'
            )
    nodes = [node_svg(step, *pos[step["name"]]) for step in steps]
    # Every piece above is numbers or escaped text.
    return mark_safe(
        f'<div class="dispatch-dag"><svg viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="Steps of run #{run.pk}">'
        f"{''.join(edges)}{''.join(nodes)}</svg></div>"
    )


def node_svg(step: dict[str, Any], x: int, y: int) -> str:
    """One step's node at (x, y): its name, what it is at, a link to its child run(s)."""
    kind = NODE_CLASS.get(step["state"], "pending")
    detail = (
        waits_for(step) or map_summary(step) or f"{step['state']} · {step['attempts']} attempt(s)"
    )
    title = f"{step['name']}: {step['state']}" + (
        f", waits for {waits_for(step)}" if waits_for(step) else ""
    )
    if step.get("map_batch"):
        kind += " map"
        title += f"; {map_progress(step)}: click for the list of its child runs"
    label = step["name"] if len(step["name"]) <= 20 else step["name"][:19] + "…"
    node = (
        f'<g class="node {kind}" data-step="{escape(step["name"])}">'
        f"<title>{escape(title)}</title>"
        f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="5"/>'
        f'<text x="{x + 8}" y="{y + 18}" font-weight="600">{escape(label)}</text>'
        f'<text x="{x + 8}" y="{y + 34}">{escape(detail[:26])}</text></g>'
    )
    url = ""
    if step.get("map_batch"):  # a ctx.map set: the list of its child runs
        runs = reverse("admin:django_dispatch_workflowrun_changelist")
        url = on_selected_alias(f"{runs}?{urlencode({'map_batch': step['map_batch']})}")
    elif step["child_run_id"]:
        url = change_url(WorkflowRun, step["child_run_id"])
    return f'<a href="{escape(url)}">{node}</a>' if url else node


def dag_field(model_admin: Any, run: WorkflowRun) -> SafeString:
    """For ``readonly_fields``: ``dag_display = dag_field``."""
    return dag_svg(run)


dag_field.short_description = "Graph"  # type: ignore[attr-defined]
