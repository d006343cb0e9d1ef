"""Collapsed stacks (py-spy ``--format raw``): self-time tables and a flame graph SVG.

A collapsed stack is one line, ``root;caller;...;leaf COUNT``, each frame
``function (file:line)``. Frames are merged by function (``function (file)``,
the file named from its package root and the line left out), so that a
function's samples are not split over the lines it was on: the tables and
the graph answer "which function", and the raw file keeps the lines for
whoever wants them. Standard library only.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable
from html import escape

#: ``name (file:line)``: the line number, dropped to merge a function's samples.
_LINE = re.compile(r":\d+\)$")
#: Where a full file name (py-spy ``--full-filenames``) starts to name a module: after
#: a site-packages or standard library directory, the benchmark project, or, in a
#: source tree, before ``django_dispatch/``. (py-spy's own shortening named some
#: modules by their file alone.)
_PREFIX = re.compile(
    r"\((?:[^()]*/(?:site-packages|python3\.\d+|dispatch_project)/|[^()]*?/(?=django_dispatch/))"
)


def frame_key(frame: str) -> str:
    """``noop (/x/dispatch_project/bench/tasks.py:12)`` -> ``noop (bench/tasks.py)``."""
    return _PREFIX.sub("(", _LINE.sub(")", frame), count=1)


def frame_file(key: str) -> str:
    """The file of a merged frame, ``?`` when it names none."""
    return key[key.rfind(" (") + 2 : -1] if key.endswith(")") and " (" in key else "?"


def parse(lines: Iterable[str]) -> Counter[tuple[str, ...]]:
    """Merged stacks (root first) and their sample counts."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if stack and count.isdigit():
            stacks[tuple(frame_key(f) for f in stack.split(";"))] += int(count)
    return stacks


def self_by_function(stacks: Counter[tuple[str, ...]]) -> Counter[str]:
    """Samples whose leaf (the frame on CPU) is each function."""
    out: Counter[str] = Counter()
    for stack, count in stacks.items():
        out[stack[-1]] += count
    return out


def total_by_function(stacks: Counter[tuple[str, ...]]) -> Counter[str]:
    """Samples with each function anywhere on the stack, once per sample (recursion too)."""
    out: Counter[str] = Counter()
    for stack, count in stacks.items():
        for key in set(stack):
            out[key] += count
    return out


def self_by_area(stacks: Counter[tuple[str, ...]]) -> Counter[str]:
    """Self samples by the leaf's package area: its file's first two path parts."""
    out: Counter[str] = Counter()
    for stack, count in stacks.items():
        parts = frame_file(stack[-1]).split("/")
        out["/".join(parts[:2])] += count
    return out


def table(counts: Counter[str], total: int, top: int, ms_per_sample: float | None) -> str:
    """The ``top`` largest, with their share of all samples and, given how many ms per
    job one sample stands for, their ms per job."""
    head = f"{'samples':>8} {'share':>6} {'ms/job':>7}  function (file)"
    lines = [head, "-" * len(head)]
    for key, count in counts.most_common(top):
        share = count / total if total else 0.0
        per_job = f"{count * ms_per_sample:7.4f}" if ms_per_sample else f"{'—':>7}"
        lines.append(f"{count:8d} {share:6.1%} {per_job}  {key}")
    return "\n".join(lines)


# --- the flame graph -------------------------------------------------------------

WIDTH, ROW, FONT, CHAR = 1200, 16, 11, 6.6  # px; CHAR: one character at FONT, roughly
MIN_WIDTH = 0.3  # px: narrower frames (and their children) are not drawn


class _Node:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[str, _Node] = {}


def _tree(stacks: Counter[tuple[str, ...]]) -> _Node:
    root = _Node()
    for stack, count in stacks.items():
        node = root
        node.count += count
        for key in stack:
            node = node.children.setdefault(key, _Node())
            node.count += count
    return root


def _color(key: str, ours: str) -> str:
    """flamegraph.pl's warm palette, stable per function; ``ours`` (a path prefix) in blue."""
    h = hashlib.md5(key.encode()).digest()
    if frame_file(key).startswith(ours):
        return f"rgb({h[0] % 60 + 60},{h[1] % 60 + 140},{h[2] % 40 + 210})"
    return f"rgb({h[0] % 50 + 205},{h[1] % 230},{h[2] % 55})"


def _fit(key: str, width: float) -> str:
    """The frame's label cut to ``width`` px ("name.."), or "" when not even that fits."""
    room = int((width - 4) / CHAR)
    if len(key) <= room:
        return key
    return key[: room - 2] + ".." if room > 3 else ""


def svg(stacks: Counter[tuple[str, ...]], title: str, ours: str = "django_dispatch/") -> str:
    """A flame graph (root at the bottom, callers below callees, siblings in
    alphabetical order, widths proportional to samples), hover for the numbers."""
    root = _tree(stacks)
    total = root.count or 1
    rects: list[str] = []
    depth_max = 0

    def draw(node: _Node, key: str, x: float, depth: int) -> None:
        nonlocal depth_max
        width = WIDTH * node.count / total
        if width < MIN_WIDTH:
            return
        depth_max = max(depth_max, depth)
        if depth:  # the root is "all samples", drawn as the title
            y = -depth * ROW
            label = _fit(key, width)
            text = label and f'<text x="{x + 3:.1f}" y="{y + ROW - 4}">{escape(label)}</text>'
            rects.append(
                f"<g><title>{escape(key)}: {node.count} samples, {node.count / total:.2%}</title>"
                f'<rect x="{x:.2f}" y="{y}" width="{width:.2f}" height="{ROW - 1}" '
                f'fill="{_color(key, ours)}" rx="2"/>{text}</g>'
            )
        for child_key in sorted(node.children):
            child = node.children[child_key]
            draw(child, child_key, x, depth + 1)
            x += WIDTH * child.count / total

    draw(root, "all", 0.0, 0)
    height = (depth_max + 3) * ROW
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 {-height + ROW} {WIDTH} {height}" font-family="monospace" '
        f'font-size="{FONT}">',
        f'<text x="0" y="{-(depth_max + 1) * ROW - 2}" font-size="{FONT + 2}">'
        f'{escape(title)} ({root.count} samples; hover a frame for its share)</text>',
        *rects,
        "</svg>",
    ])  # fmt: skip
