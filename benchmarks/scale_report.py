"""Reading the records of ``scale.py`` for notebook 08: one table and one figure per
device, and the verdict table the notebook leads with.

A record is ``results/scale_<date>_<device>.json``; several records of one device (the
GPU's first, timed cold, and its warm one) are read as one table, a row (model and
structure) taken from the newest record that holds it (``read``). Ratios are ours over
laplace-torch's best backend that finished the same row and computes our approximation
(the fastest; the smallest peak). Each measurement is timed once, so the verdict counts
a row as slower only where that ratio exceeds ``SLOWER`` (1.1) and ours took at least
``TIME_FLOOR_S`` (0.05 s) (:func:`slower`), and peaks within ``MEMORY_BAND`` (1.1×) of
each other, or both below ``MEMORY_FLOOR_MIB`` (10 MiB), as equal (:func:`memory`).

    import scale_report as report
    cpu = report.read([path])      # the records of one device, oldest first
    report.show(cpu); report.ratio_figure(cpu)
    report.verdict({"CPU": cpu, "H100": gpu})
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import matplotlib.ticker
import pandas as pd
from matplotlib.lines import Line2D

import scale

SLOWER = 1.1  # ours counts as slower above this ratio to laplace-torch's best,
TIME_FLOOR_S = 0.05  # and only where ours took at least this long: a single timing of
# a few milliseconds varies by more than 1.1× from run to run
MEMORY_BAND = 1.1  # peaks within this factor of each other count as equal,
MEMORY_FLOOR_MIB = 10  # and so do peaks both below this: resident-set growth sampled
# every 0.5 ms does not resolve a few MiB
RULE = (  # the two rules above, as notebook 08 prints them under its table
    f"Counted as slower: ours over {SLOWER:g}× laplace-torch's best backend computing "
    f"our approximation, and at "
    f"least {TIME_FLOOR_S:g} s. Counted as the same peak memory: within "
    f"{MEMORY_BAND:g}× of each other, or both below {MEMORY_FLOOR_MIB:g} MiB."
)
# From this date on, our diagonal and KFAC predictive works layer by layer, without
# per-example Jacobians (results/bench_predict_*.json times it): older records time the
# Jacobian route, marked † in the table
LAYERWISE = "2026-11-24"
BACKEND_NAMES = {"curvlinops": "curvlinops", "backpack": "BackPACK", "asdl": "ASDL"}


def say(text: str) -> None:
    print(textwrap.fill(text, 88, subsequent_indent="  "))


def same_approximation(r: dict) -> bool:
    """False for BackPACK's KFAC of a CNN: it differs from curvlinops' and ASDL's, which
    ours reproduces (the digits-cnn rows of notebook 08's parity matrix)."""
    return not (
        r["impl"] == "backpack"
        and r["structure"] == "kron"
        and r["model"].startswith("cnn")
    )


def failure(r: dict) -> str:
    """An error, short: its kind and stage, and how much memory it asked for."""
    e = r["error"]
    kind = "device mismatch at fit" if "same device" in e else e.split(":")[0]
    asked = re.search(r"allocate (\d+) bytes", e)
    return kind + (f", asked {int(asked[1]) / 2**30:.1f} GiB" if asked else "")


def best_row(cell: list[dict], key: str) -> dict | None:
    """laplace-torch's row with the smallest ``key`` over its backends that finished and
    compute our approximation (:func:`same_approximation`): a faster answer to another
    question is no yardstick."""
    done = [
        r
        for r in cell
        if r["impl"] != "ours"
        and "error" not in r
        and r.get(key)
        and same_approximation(r)
    ]
    return min(done, key=lambda r: r[key], default=None)


def best(cell: list[dict], key: str) -> float | None:
    """laplace-torch's smallest ``key`` (:func:`best_row`)."""
    r = best_row(cell, key)
    return None if r is None else r[key]


def plain(model: str, structure: str, data: str = "mnist") -> str:
    """A row as a reader names it: "MLP 784-12-10, last-layer full"."""
    return f"{scale.model_label(model, data)}, {scale.STRUCTURE_NAMES[structure]}"


def label(m: dict) -> str:
    """Where and with what a record was made."""
    threads = f", {m['threads']} threads" if m["device"] == "cpu" else ""
    dtype = f", {m['dtype']}" if "dtype" in m else ""
    return (
        f"recorded on {m['device_name']}{threads}, {m['date']}, torch {m['torch']}, "
        f"laplace-torch {m['laplace_torch']}{dtype}"
    )


def warm(m: dict) -> bool:
    """Whether a record timed everything after a warm-up on both sides
    (``scale.warm_up``); older records timed δ tuning cold."""
    return m["date"] >= "2026-11-27"


def planned(m: dict) -> int | None:
    """How many measurements a sweep recorded in parts planned (None: a whole run)."""
    preset = scale.PRESETS.get(m["args"].get("preset"))
    if preset is None:
        return None
    impls = ["ours", *scale.BACKENDS]
    return len(scale.cells(preset["models"], scale.STRUCTURES, impls))


# a device table's columns, in this order (those no row has are left out)
COLUMNS = ("model", "structure", "P", "record", "fit s", "predict s", "δ tuning s")
COLUMNS += ("MiB", "Δ evid.", "|Δp|")


def read(paths: list[Path]) -> dict:
    """The records of one device (oldest first) as one table: a row per model and
    structure, from the newest record holding it; what the verdict counts."""
    recs = [json.loads(p.read_text()) | {"path": p} for p in paths]
    cells: dict[tuple, tuple[dict, list]] = {}
    for rec in recs:  # a newer record's row replaces an older one's
        mine: dict[tuple, list] = {}
        for r in rec["rows"]:
            mine.setdefault((r["model"], r["structure"]), []).append(r)
        for k, v in mine.items():  # times and sizes all from one record; an older
            have = {r["impl"] for r in v}  # failure of a backend it did not run stays
            old = cells[k][1] if k in cells else []
            v += [r for r in old if r["impl"] not in have and "error" in r]
            cells[k] = (rec, v)
    t = lambda x: "–" if x is None else f"{x:.0f}" if x >= 10 else f"{x:.2g}"  # noqa: E731
    e = lambda x: f"{x:.0e}" if x else "0"  # noqa: E731
    table, agree, failed_default, failed_ours, other = [], [], [], [], []
    # per quantity and row: (ours, laplace-torch's best); the ratios follow from them
    pairs = {"fit_s": {}, "predict_s": {}, "tune_s": {}, "peak_bytes": {}}
    for (model, s), (rec, cell) in cells.items():
        m = rec["meta"]
        ours = next(r for r in cell if r["impl"] == "ours")
        P = scale.posterior_P(ours)
        line = {
            "model": model,
            "structure": s,
            "P": f"{P / 1e6:.3g}M" if P > 1e5 else P,
        }
        if len(recs) > 1:  # the record's name without the year: 11-28b
            line["record"] = record_name(rec)
        if "error" in ours:  # "skipped" (P over the cap) or "timeout"
            line["fit s"] = ours["error"].split(":")[0].split()[0]
            if not ours["error"].startswith("skip"):
                failed_ours.append(ours | {"where": where(m)})
        else:
            stale = "†" if m["date"] < LAYERWISE and s in ("diag", "kron") else ""
            mib = lambda b: None if b is None else b / 2**20  # noqa: E731
            line["fit s"] = f"{t(ours['fit_s'])} / {t(best(cell, 'fit_s'))}"
            line["predict s"] = (
                f"{t(ours['predict_s'])}{stale} / {t(best(cell, 'predict_s'))}"
            )
            line["MiB"] = (
                f"{t(mib(ours.get('peak_bytes')))} / {t(mib(best(cell, 'peak_bytes')))}"
            )
            if ours.get("tune_s"):  # δ by the evidence; a first call's tuning is cold
                cold = "" if warm(m) else " cold"
                line["δ tuning s"] = (
                    f"{t(ours['tune_s'])} / {t(best(cell, 'tune_s'))}{cold}"
                )
            for key in pairs:
                cold_tune = key == "tune_s" and not warm(m)  # a one-time cost inside
                theirs = best(cell, key)
                if theirs is not None and ours.get(key) and not cold_tune:
                    pairs[key][(model, s)] = (ours[key], theirs)
        vs = [
            r
            for r in cell
            if "evidence_rel" in r and r["impl"] != "ours" and same_approximation(r)
        ]
        agree += vs
        other += [r for r in cell if "evidence_rel" in r and not same_approximation(r)]
        if "evidence_z" in ours:  # matrix-free vs our full, in SLQ's standard errors
            line["Δ evid."] = f"{ours['evidence_z']:.1f} SE"
            line["|Δp|"] = e(ours["probs_maxabs"])
        elif vs:
            line["Δ evid."] = e(max(r["evidence_rel"] for r in vs))
            line["|Δp|"] = e(max(r["probs_maxabs"] for r in vs))
        for r in cell:  # laplace-torch's default backend failed: who finished?
            if r["impl"] == "curvlinops" and "error" in r:
                if not r["error"].startswith("skipped"):
                    done = [o for o in cell if o["impl"] != "ours" and "error" not in o]
                    names = [BACKEND_NAMES[o["impl"]] for o in done]
                    failed_default.append(r | {"finished_by": names})
        table.append(line)
    return {
        "recs": recs,
        "device": recs[-1]["meta"]["device"],
        "table": pd.DataFrame(table)
        .reindex(columns=[c for c in COLUMNS if any(c in line for line in table)])
        .fillna("")
        .set_index(["model", "structure"]),
        "rows": [r for rec, cell in cells.values() for r in cell],
        "cells": {k: cell for k, (rec, cell) in cells.items()},
        "ratio": {k: {r: a / b for r, (a, b) in v.items()} for k, v in pairs.items()},
        "pairs": pairs,
        "agree": agree,
        "other": other,
        "failed_default": failed_default,
        "failed_ours": failed_ours,
    }


def record_name(rec: dict) -> str:
    """A record's name without the year: ``scale_2026-11-28b_cuda-….json`` → 11-28b."""
    return rec["path"].name.split("_")[1][5:]


def timing(m: dict) -> str:
    """How a record timed: warm or not, and the median of how many runs."""
    text = "everything warm" if warm(m) else "δ tuning cold"
    repeats = max(run.get("repeats", 1) for run in m.get("runs", [m["args"]]))
    return text + (
        f"; fit and predict: median of {repeats} runs" if repeats > 1 else ""
    )


def provenance(rec: dict) -> str:
    """A record in one line: its file, training-set size, timing and, for a sweep
    recorded in parts, how much of it ran."""
    m = rec["meta"]
    n = planned(m)
    part = f"; {len(rec['rows'])} of {n} planned measurements" if n else ""
    return (
        f"results/{rec['path'].name} (N = {m['args']['n_train']:,}; {timing(m)}{part})"
    )


def where(m: dict) -> str:
    return f"{m['threads']} CPU threads" if m["device"] == "cpu" else m["device_name"]


def show(dev: dict) -> None:
    """A device's table, and what a reader needs to read it."""
    for rec in dev["recs"]:
        m, a = rec["meta"], rec["meta"]["args"]
        n = planned(m)
        part = f"; partial: {len(rec['rows'])} of {n} planned measurements" if n else ""
        say(f"results/{rec['path'].name}, {label(m)}; {timing(m)}{part}")
        cap = f", {a['cpu_mem_gb']:.0f} GB" if m["device"] == "cpu" else ""
        timeout = max(run.get("timeout", a["timeout"]) for run in m.get("runs", [a]))
        guarded = sum("shell guard" in r.get("error", "") for r in rec["rows"])
        guard = f" ({guarded} stopped sooner by a shell guard)" if guarded else ""
        say(
            f"  MNIST, N = {a['n_train']:,}, {a['n_query']} test queries, "
            f"δ = {a['delta0']:g}; per measurement ≤ {timeout} s{guard}{cap}; full "
            f"Laplace only up to P = {a['full_max_p']:,}; matrix-free predicts on "
            f"{a['matfree_query']} queries"
        )
    models = {k: v for rec in dev["recs"] for k, v in rec["meta"]["models"].items()}
    say(
        "Models: "
        + "; ".join(
            f"{k} = {scale.model_label(k, 'mnist')} (P = {v['P']:,})"
            for k, v in models.items()
        )
    )
    record = "record: the results file a row comes from. "
    print()
    say(
        "How to read the table: each cell is ours / laplace-torch's best backend that "
        "finished and computes our approximation (fastest; smallest peak). "
        + (record if "record" in dev["table"].columns else "")
        + "Δ: the largest difference over the backends that compute our approximation "
        "(matrix-free: to our full, in standard errors of its SLQ estimate). δ tuning: "
        "100 Adam steps on the evidence (blank: full or last-layer full in a network "
        "over --tune-max-p parameters, not tuned; cold: the record's tuning was not "
        "warmed up)."
        + (" †: our replaced Jacobian route." if "†" in str(dev["table"]) else "")
    )
    print("\n" + dev["table"].to_string() + "\n")
    for r in dev["failed_default"]:
        say(
            f"laplace-torch's default backend (curvlinops) failed: "
            f"{plain(r['model'], r['structure'])} ({failure(r)}; finished by "
            f"{' and '.join(r['finished_by']) or 'none'})."
        )
    for r in dev["failed_ours"]:
        say(
            f"Ours did not finish: {plain(r['model'], r['structure'])} "
            f"({r['error']}, on {r['where']})."
        )
    for r in dev["other"]:
        say(
            f"Left out of Δ, another approximation: {BACKEND_NAMES[r['impl']]}'s "
            f"{scale.STRUCTURE_NAMES[r['structure']]} of the "
            f"{scale.model_label(r['model'], 'mnist')} (relative Δ evid. "
            f"{r['evidence_rel']:.1f}, tuned δ {r['delta_rel']:.2f})."
        )


RATIO_NAMES = {
    "fit_s": "fit",
    "predict_s": "predict",
    "tune_s": "δ tuning (warm)",
    "peak_bytes": "peak memory",
}


def mib_text(n_bytes: float) -> str:
    """A peak in MiB as the figure labels it: whole MiB from 10 on, two digits below."""
    mib = n_bytes / 2**20
    return f"{mib:,.0f} MiB" if mib >= 10 else f"{mib:.2g} MiB"


def ratio_figure(dev: dict) -> None:
    """Ours ÷ laplace-torch's fastest backend (:func:`ratio_table`), one dot per row
    (network and structure, labelled with the number of weights its posterior covers
    and, where ``dev`` joins several records, the record it comes from):
    one panel each for fit, predict, warm δ tuning and peak memory; left of the line at
    1 ours is faster or lighter. Red: a row the verdict counts as slower or heavier.
    Hollow: a row it does not count, in the time panels ours under ``TIME_FLOOR_S`` (the
    dashed line is ``SLOWER``), in the memory panel a peak counted as the same
    (:func:`memory`; dashed: the band ``MEMORY_BAND``). Beside each dot, in grey, ours'
    own time (s) or peak (MiB), so that a ratio can be read against what it costs."""
    P = {
        (r["model"], r["structure"]): scale.posterior_P(r)
        for r in dev["rows"]
        if r["impl"] == "ours"
    }
    keys = ("fit_s", "predict_s", "tune_s", "peak_bytes")
    shown = {k for key in keys for k in dev["ratio"][key]}  # rows with both sides
    models = list(dict.fromkeys(m for m, _ in sorted(shown, key=lambda k: P[k])))
    rows = sorted(shown, key=lambda k: (models.index(k[0]), P[k], k[1]))
    mem = memory(dev)
    fig, axes = plt.subplots(
        1,
        4,
        figsize=(13, 1.9 + 0.3 * len(rows)),
        sharex=True,
        sharey=True,
        layout="constrained",
    )
    values = [v for key in keys for v in dev["ratio"][key].values()]
    for ax, key in zip(axes, keys, strict=True):
        # hollow: not counted. Time: over the 1.1× band, but ours under the floor;
        # memory: peaks counted as the same (within the band, or both small)
        if key == "peak_bytes":
            hollow, red = set(mem["equal"]), set(mem["higher"])
        else:
            counted, excused, _ = slower(dev, key)
            hollow, red = set(excused), set(counted)
        for i, k in enumerate(rows):
            if k not in dev["ratio"][key]:
                continue
            color = "C3" if k in red else "k"
            ax.scatter(
                dev["ratio"][key][k],
                i,
                edgecolors=color,
                facecolors="none" if k in hollow else color,
                s=30,
                zorder=3,
            )
            ours = dev["pairs"][key][k][0]  # ours' own value, beside its dot
            ax.annotate(
                mib_text(ours) if key == "peak_bytes" else f"{ours:.2g} s",
                (dev["ratio"][key][k], i),
                xytext=(5, 0),
                textcoords="offset points",
                fontsize=7.5,
                color="0.3",
                va="center",
                bbox={"fc": "white", "ec": "none", "pad": 0.2, "alpha": 0.85},
                zorder=4,
            )
        ax.axvline(1, color="k", lw=0.8)
        band = (MEMORY_BAND, 1 / MEMORY_BAND) if key == "peak_bytes" else (SLOWER,)
        for level in band:
            ax.axvline(level, color="k", lw=0.8, ls="--")
        for i in range(1, len(rows)):  # a rule between two networks
            if rows[i][0] != rows[i - 1][0]:
                ax.axhline(i - 0.5, color="0.8", lw=0.8)
        ax.grid(axis="y", color="0.93")
        ax.set(
            xscale="log", title=RATIO_NAMES[key], xlabel="ours ÷ laplace-torch (log)"
        )
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes[0].set_xlim(min(values) / 1.6, max(values) * 6)  # room for the labels
    # with several records, each row names the one it comes from (record_name)
    record = dev["table"]["record"] if "record" in dev["table"] else {}
    labels = [
        f"{plain(*k)} (P = {P[k]:,}" + (f"; {record[k]})" if k in record else ")")
        for k in rows
    ]
    axes[0].set_yticks(range(len(rows)), labels, fontsize=9)
    axes[0].set_ylim(len(rows) - 0.5, -0.5)
    m = dev["recs"][-1]["meta"]
    fig.suptitle(
        f"{m['device_name']}: left of the solid line, ours is faster or lighter "
        "(grey: ours' own time or peak)",
        fontsize=10,
    )
    dot = {"marker": "o", "ls": "none", "ms": 6}
    key_handles = [
        Line2D([], [], color="k", **dot, label="within the rules"),
        Line2D([], [], color="C3", **dot, label="counted slower or heavier"),
        Line2D(
            [],
            [],
            color="k",
            mfc="none",
            **dot,
            label=f"not counted (time: over {SLOWER:g}× but under {TIME_FLOOR_S:g} s; "
            "memory: the same peak)",
        ),
        Line2D([], [], color="k", lw=0.8, ls="--", label="the rules' bounds"),
    ]
    fig.legend(handles=key_handles, loc="outside lower center", ncols=4, fontsize=8)
    plt.show()


def share(values, test) -> str:
    """ "a of b": how many of the values pass ``test``; "–" for none."""
    values = list(values)
    return f"{sum(map(test, values))} of {len(values)}" if values else "–"


def slower(dev: dict, key: str, rows=None) -> tuple[list, list, int]:
    """Where ours is slower in ``key`` ("fit_s", "predict_s", "tune_s"), over the rows
    with both sides timed (only those in ``rows``, if given): the rows counted (ours
    over ``SLOWER``× laplace-torch's best backend and at least ``TIME_FLOOR_S``), the
    rows left out as noise (over ``SLOWER``× but under ``TIME_FLOOR_S``: each time is
    one measurement), and how many rows there are."""
    pairs = {k: v for k, v in dev["pairs"][key].items() if rows is None or k in rows}
    over = [k for k, (ours, lt) in pairs.items() if ours > SLOWER * lt]
    counted = [k for k in over if pairs[k][0] >= TIME_FLOOR_S]
    return counted, [k for k in over if k not in counted], len(pairs)


def memory(dev: dict) -> dict[str, list]:
    """The rows by ours' peak memory against laplace-torch's smallest: "equal" where
    both peaks are below ``MEMORY_FLOOR_MIB`` or within ``MEMORY_BAND``× of each other,
    else "lower" or "higher"."""
    out: dict[str, list] = {"lower": [], "equal": [], "higher": []}
    for k, (ours, lt) in dev["pairs"]["peak_bytes"].items():
        low, high = sorted((ours, lt))
        if high < MEMORY_FLOOR_MIB * 2**20 or high <= MEMORY_BAND * low:
            out["equal"].append(k)
        else:
            out["lower" if ours < lt else "higher"].append(k)
    return out


def counted(dev: dict, key: str, rows=None) -> str:
    """ "a of b": the rows :func:`slower` counts in ``key``, of those timed on both
    sides; "–" for none."""
    hits, _, n = slower(dev, key, rows)
    return f"{len(hits)} of {n}" if n else "–"


def verdict(devices: dict[str, dict]) -> pd.DataFrame:
    """One column per device: in how many rows ours is slower (:func:`slower`) and its
    peak lower or higher (:func:`memory`), the largest differences where both compute
    the same approximation, and the failures."""
    col = {}
    for name, dev in devices.items():
        agree = dev["agree"]
        mem = memory(dev)
        n_mem = sum(map(len, mem.values()))

        def gap(kind: str, agree: list = agree) -> str:
            rows = [r for r in agree if r["model"].startswith(kind)]
            return f"{max(r['probs_maxabs'] for r in rows):.1e}" if rows else "–"

        col[name] = {
            "fits slower": counted(dev, "fit_s"),
            "predictions slower": counted(dev, "predict_s"),
            "δ tunings slower (warm)": counted(dev, "tune_s"),
            "lower peak memory": f"{len(mem['lower'])} of {n_mem}",
            "higher peak memory": f"{len(mem['higher'])} of {n_mem}",
            "largest relative Δ evidence": (
                f"{max(r['evidence_rel'] for r in agree):.1e}"
            ),
            "largest relative Δ tuned δ": (
                f"{max(r['delta_rel'] for r in agree if 'delta_rel' in r):.1e}"
            ),
            "largest |Δp|, MLP": gap("mlp"),
            "largest |Δp|, CNN": gap("cnn"),
            "laplace-torch's default backend failed": str(len(dev["failed_default"])),
            "ours stopped by a time limit": str(len(dev["failed_ours"])),
        }
    return pd.DataFrame(col)


def ratio_table(dev: dict) -> pd.DataFrame:
    """Ours ÷ laplace-torch's fastest backend, per (model, structure) row: fit, predict,
    warm δ tuning and peak memory ("–": one side has no figure). Above 1: ours slower
    or larger; :func:`slower` and :func:`memory` say which rows :func:`verdict`
    counts."""
    cols = {
        RATIO_NAMES[k]: pd.Series({plain(*key): x for key, x in v.items()}, dtype=float)
        for k, v in dev["ratio"].items()
    }
    table = pd.DataFrame(cols)
    return table.apply(lambda c: c.map(lambda x: "–" if x != x else f"{x:.3g}"))


def predict_bench(paths: list[Path]) -> tuple[float, float, int]:
    """``bench_predict.py``'s records of our layer-wise diag/KFAC predictive: prints and
    returns ours' time over laplace-torch's (smallest, largest) and the smallest P."""
    recs = [json.loads(p.read_text()) for p in paths]
    timed = [r for rec in recs for r in rec["rows"] if "time_ratio" in r]
    times = [r["time_ratio"] for r in timed]
    backends = sorted({BACKEND_NAMES[r["impl"]] for r in timed})
    say(
        "Our layer-wise diagonal and KFAC predictive (no per-example Jacobians), "
        "timed by "
        + " and ".join(f"results/{p.name}" for p in paths)
        + f" ({label(recs[0]['meta'])}) at P = "
        + " and ".join(f"{P:,}" for P in sorted({r["P"] for r in timed}))
        + f": {min(times):.2g} to {max(times):.2g} of the time of laplace-torch's "
        + " and ".join(backends)
    )
    return min(times), max(times), min(r["P"] for r in timed)


def float64_check(path: Path) -> list[dict]:
    """``cnn_float64_check.py``'s record: a network (the CNN unless the record names
    another) measured again on new weights in float32 and float64; prints its
    differences and returns its rows."""
    check = json.loads(path.read_text())
    rows = check["rows"]
    cells = list(dict.fromkeys((r["structure"], r["backend"]) for r in rows))
    one_each = len({s for s, _ in cells}) == len(cells)  # a column per structure
    col = {c: c[0] if one_each else f"{c[0]}/{BACKEND_NAMES[c[1]]}" for c in cells}
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    say(
        f"The {scale.model_label(check['meta']['settings']['model'], 'mnist')} again, "
        f"on newly trained weights, in {' and '.join(dtypes)}: "
        f"results/{path.name}, {label(check['meta'])}; laplace-torch's backend: "
        + ", ".join(f"{s} {BACKEND_NAMES[b]}" for s, b in cells)
    )
    width = max(9, *(len(c) + 1 for c in col.values()))
    print(f"{'':>16}" + "".join(f"{col[c]:>{width}}" for c in cells))
    for dtype in dtypes:  # –: a cell the run did not finish in this dtype
        got = {(r["structure"], r["backend"]): r for r in rows if r["dtype"] == dtype}
        for q, name in (("evidence_rel", "Δ evid."), ("probs_maxabs", "|Δp|")):
            print(
                f"{dtype:>8} {name:>7}"
                + "".join(
                    f"{got[c][q]:>{width}.0e}" if c in got else f"{'–':>{width}}"
                    for c in cells
                )
            )
    if "note" in check["meta"]:
        say(check["meta"]["note"])
    return rows


def profiles(path: Path) -> list[dict]:
    """``profile_fit.py``'s record (one warm fit per side under ``torch.profiler``) and
    its tables (the ``.txt`` beside it): each profiled fit's row with its GPU kernel
    time ``gpu_s``, its waits for the device per batch ``syncs_per_batch`` and its
    ``eigh`` calls added; prints one line per fit."""
    rec = json.loads(path.read_text())
    tables = path.with_suffix(".txt").read_text().split("\n## ")
    settings = rec["meta"]["settings"]
    batches = settings["n_train"] // settings["batch_size"]
    print(
        f"profiled: {scale.model_label(settings['model'], settings['data'])}, "
        f"N = {settings['n_train']:,} in {batches} batches"
    )
    rows = []
    for r, table in zip(rec["rows"], tables, strict=True):
        gpu_ms = float(re.search(r"Self CUDA time total: ([\d.]+)ms", table)[1])
        eigh = re.search(r"aten::_linalg_eigh .* (\d+) *$", table, re.M)
        rows.append(
            r
            | {
                "gpu_s": gpu_ms / 1e3,
                "syncs_per_batch": r["syncs"] / batches,
                "eigh": int(eigh[1]) if eigh else 0,
            }
        )
        print(
            f"profile {r['structure']:8} {r['impl']:10} fit {r['fit_s']:.3f} s "
            f"(GPU kernels {gpu_ms / 1e3:.3f} s): {r['launches']:5} kernel launches, "
            f"{r['syncs'] / batches:.2f} waits for the device per batch, "
            f"{rows[-1]['eigh']} eigh calls"
        )
    return rows
