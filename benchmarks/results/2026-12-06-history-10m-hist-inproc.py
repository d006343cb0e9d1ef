"""In-process A/B on the kept 10M server: main's versions of the functions this branch changed
(*old*, their source taken from git and compiled into the same modules) against the branch's
(*new*), switched per call; each read at *empty* and *history*, a warm call then a timed one,
old and new alternating first. Median of RUNS (ms)."""
import ast, json, os, statistics, subprocess, sys, time
WT = os.environ.get("WT", "/work/wt-hist")
BASE = os.environ.get("BASE", "8f2a74c")
sys.path.insert(0, WT + "/benchmarks"); sys.path.insert(0, WT)
import history as H
from drivers import django_setup
django_setup.configure(f"postgres://postgres@127.0.0.1:{os.environ['PORT']}/history", H.SETTINGS)
from django.utils import timezone
from django_dispatch.admin import display, job_columns, rows, dead_letters, workers, paging, job_parts, jobs as ajobs
from django_dispatch.queries import lists

def old_defs(path, module, names, cls=None):
    src = subprocess.run(["git", "-C", WT, "show", f"{BASE}:{path}"], capture_output=True, text=True, check=True).stdout
    tree = ast.parse(src)
    body = tree.body
    if cls:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    found = {}
    for node in body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            scope = dict(vars(module))
            exec(compile(ast.Module([node], []), f"{BASE}:{path}", "exec"), scope)
            found[node.name] = scope[node.name]
    assert set(found) == set(names), (path, names, found)
    return found

job_columns.timezone = timezone  # main's job_columns read the clock through it
od = old_defs("django_dispatch/admin/display.py", display, ["html", "age_html"])
oj = old_defs("django_dispatch/admin/job_columns.py", job_columns, ["job_badge"])
om = old_defs("django_dispatch/admin/job_columns.py", job_columns, ["wait_display", "run_display"], cls="JobColumns")
ol = old_defs("django_dispatch/queries/lists.py", lists, ["newest_of"])
op = old_defs("django_dispatch/admin/job_parts.py", job_parts, ["job_list_parts"])
SWAPS = [  # (owner, attribute, old)
    (display, "html", od["html"]), (rows, "html", od["html"]),
    (display, "age_html", od["age_html"]), (job_columns, "age_html", od["age_html"]),
    (dead_letters, "age_html", od["age_html"]), (workers, "age_html", od["age_html"]),
    (job_columns, "job_badge", oj["job_badge"]),
    (job_columns.JobColumns, "wait_display", om["wait_display"]),
    (job_columns.JobColumns, "run_display", om["run_display"]),
    (lists, "newest_of", ol["newest_of"]), (paging, "newest_of", ol["newest_of"]),
    (job_parts, "job_list_parts", op["job_list_parts"]), (ajobs, "job_list_parts", op["job_list_parts"]),
]
NEW = [(o, a, o.__dict__[a] if isinstance(o, type) else getattr(o, a)) for o, a, _ in SWAPS]
def use(side):
    for o, a, f in (SWAPS if side == "old" else NEW):
        setattr(o, a, f)

RUNS = int(os.environ.get("RUNS", "15"))
ONLY = [o for o in os.environ.get("ONLY", "").split("|") if o]
states = ["empty", "history"]
by = {}
for s in states:
    H.use_database(s); by[s] = H.reads()
names = [n for n in by["empty"] if not ONLY or any(o in n for o in ONLY)]
# the same page both ways (markup, with the moving times blanked)
import re
def steady(t): return re.sub(r'csrfmiddlewaretoken" value="[^"]*"|data-age="[^"]*"|(<time[^>]*>)[^<]*(</time>)|<em>[^<]*</em>', "", t)
H.use_database("history")
for url in ["admin: job list", "admin: dead letter list"]:
    use("old"); a = steady(by["history"][url]().content.decode())
    use("new"); b = steady(by["history"][url]().content.decode())
    print(url, "same markup old/new:", a == b, flush=True)
out = {}
started = time.time()
for n in names:
    took = {(v, s): [] for v in ("old", "new") for s in states}
    for r in range(RUNS):
        for s in states:
            H.use_database(s)
            for v in (("old", "new") if r % 2 == 0 else ("new", "old")):
                use(v); by[s][n]()
                t = time.perf_counter(); by[s][n](); took[v, s].append((time.perf_counter() - t) * 1000)
    use("new")
    med = {f"{v}|{s}": statistics.median(x) for (v, s), x in took.items()}
    out[n] = med
    print(f"{n:36s} old {med['old|empty']:.1f}/{med['old|history']:.1f} = {med['old|history']/med['old|empty']:.2f}   "
          f"new {med['new|empty']:.1f}/{med['new|history']:.1f} = {med['new|history']/med['new|empty']:.2f}", flush=True)
json.dump({"load_end": os.getloadavg(), "runs": RUNS, "took_s": time.time() - started, "medians": out},
          open(os.environ.get("OUT", "/tmp/hist/inproc.json"), "w"), indent=1)
