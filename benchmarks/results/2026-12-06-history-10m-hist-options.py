"""In-process: the semantic options (not committed) against the branch as is, at empty and 10M,
alternating per call. Median of RUNS (ms)."""
import os, sys, time, statistics, json
WT = os.environ.get("WT", "/work/wt-hist")
sys.path.insert(0, WT + "/benchmarks"); sys.path.insert(0, WT)
import history as H
from drivers import django_setup
django_setup.configure(f"postgres://postgres@127.0.0.1:{os.environ['PORT']}/history", H.SETTINGS)
from django.conf import settings
from django_dispatch.admin import paging
RUNS = int(os.environ.get("RUNS", "15"))
base_dispatch = dict(settings.DISPATCH or {})
def variant(name):
    settings.DISPATCH = dict(base_dispatch)
    paging.CappedPaginator.cap = paging.COUNT_CAP
    paging.FILTER_SAMPLE = 5000
    if name == "COUNT_EXACT_MAX=5000":
        settings.DISPATCH["COUNT_EXACT_MAX"] = 5000
    elif name == "admin COUNT_CAP=1000":
        paging.CappedPaginator.cap = 1000
    elif name == "FILTER_SAMPLE=1000":
        paging.FILTER_SAMPLE = 1000
    elif name == "CAP=1000+SAMPLE=1000":
        paging.CappedPaginator.cap = 1000
        paging.FILTER_SAMPLE = 1000
VARIANTS = os.environ.get("VARIANTS", "as is|COUNT_EXACT_MAX=5000").split("|")
ONLY = os.environ.get("ONLY", "").split("|")
states = ["empty", "history"]
by = {}
for s in states:
    H.use_database(s); by[s] = H.reads()
names = [n for n in by["empty"] if any(o in n for o in ONLY)]
out = {}
for n in names:
    took = {(v, s): [] for v in VARIANTS for s in states}
    for r in range(RUNS):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        for s in states:
            H.use_database(s)
            for v in order:
                variant(v); by[s][n]()
                t = time.perf_counter(); by[s][n](); took[v, s].append((time.perf_counter() - t) * 1000)
    variant("as is")
    med = {k: statistics.median(x) for k, x in took.items()}
    out[n] = {f"{v}|{s}": med[v, s] for v, s in med}
    print(f"{n:36s} " + "  ".join(f"{v}: {med[v,'empty']:.1f}/{med[v,'history']:.1f} = {med[v,'history']/med[v,'empty']:.2f}" for v in VARIANTS), flush=True)
json.dump({"load": os.getloadavg(), "runs": RUNS, "variants": VARIANTS, "medians": out}, open(os.environ.get("OUT", "/tmp/hist/options.json"), "w"), indent=1)
