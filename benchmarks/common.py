"""Helpers the benchmark scripts share."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "results"

# Pieces of a sweep for a borrowed GPU (``scale.py --plan``): commands run at most 10
# minutes, so a piece is planned to take at most PIECE_S seconds, and inside a piece
# every measurement is stopped after CELL_TIMEOUT_S: a piece stopped by the 10-minute
# limit and run again starts with the measurement that was cut off (the record keeps
# every one before it) and finishes it within one command.
PIECE_S = 480
CELL_TIMEOUT_S = 410  # + OVERHEAD_S and a training: within PIECE_S
# How a piece's time on an H100 is estimated (``scale.py --plan``,
# ``bench_full_memory.estimate``): each measurement takes OVERHEAD_S (a fresh process:
# interpreter, imports, data, the CUDA context and ``scale.warm_up``'s first calls;
# measured on an H100 on 2026-11-27, results/scale_2026-11-27_cuda-*.log: 19 cells of
# cnn:8:16 in 470 s and 6 of mlp:1000:2 in 146 s, each with a model's training and
# under 5 s of timed work a cell, so ~20 s a cell) plus SAFETY times its work, at most
# its timeout. The
# work is a recorded CPU time of the same measurement at a smaller size, scaled to the
# size of the cell and divided by the CPU -> H100 speed ratio: DENSE for dense float32
# linear algebra (full Laplace: a Cholesky of P = 19,090 ran at 112 GFLOP/s on 2 CPU
# threads in results/bench_full_memory_2026-11-23_cpu.json, one of P = 135,000 at 48
# TFLOP/s on an H100 (DESIGN.md), 430, taken as 400), OTHER for the rest (memory- and
# launch-bound work, where a GPU gains far less: an assumption, to be corrected from the
# first pieces).
OVERHEAD_S = 20.0
SAFETY = 1.5
DENSE, OTHER = 400.0, 20.0


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (or what the platform module knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class RssPeak:
    """Peak resident set size of this process while the ``with`` block runs, sampled by
    a thread."""

    def __init__(self, interval: float = 5e-4):
        self.interval, self.page = interval, os.sysconf("SC_PAGE_SIZE")

    def rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(self.interval)

    def __enter__(self):
        self.base = self.peak = self.rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.rss())


def run_fresh(script: str, cfg: dict, timeout: int) -> dict:
    """Run ``script --one <cfg as json>`` in a fresh Python process and return ``cfg``
    merged with the dict it printed on its last ``RESULT {...}`` line, or with
    ``"error"`` (timeout, crash, killed)."""
    cmd = [sys.executable, script, "--one", json.dumps(cfg)]
    # glibc keeps freed blocks below its (dynamically raised) mmap threshold inside the
    # process, so a second fit could reuse the warm-up's memory without the RSS growing:
    # fix the threshold at 64 KiB so every large buffer is mapped on allocation and
    # returned on free.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    try:
        out = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return {**cfg, "error": f"timeout after {timeout} s"}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        err = (out.stderr.strip().splitlines() or ["killed (out of memory?)"])[-1]
        return {**cfg, "error": err[:200]}
    return {**cfg, **json.loads(lines[-1][7:])}


def nearest(rows: list[dict], size: Callable[[dict], float], P: float) -> dict | None:
    """The row of ``rows`` whose ``size`` is nearest to ``P`` on a log scale (None if
    there is none)."""
    import math

    return min(rows, key=lambda r: abs(math.log(size(r) / P)), default=None)


def pack(
    groups: list[tuple[str, list[tuple[str, float]]]], limit: float, overhead: float
) -> list[tuple[list[str], list[str], float]]:
    """Consecutive ``groups``, ``(name, [(implementation, seconds), ...])``, packed into
    pieces ``(names, implementations, seconds)`` of at most ``limit`` seconds with
    ``overhead`` once per piece, in order; a group too long for one piece is split by
    its implementations (a single measurement longer than a piece gets a piece of its
    own)."""
    pieces: list[tuple[list[str], list[str], float]] = []
    names: list[str] = []
    impls: dict[str, None] = {}
    total = overhead
    for name, cells in groups:
        cost = sum(t for _, t in cells)
        if names and total + cost > limit:
            pieces.append((names, list(impls), total))
            names, impls, total = [], {}, overhead
        if overhead + cost <= limit:
            names.append(name)
            impls |= dict.fromkeys(i for i, _ in cells)
            total += cost
            continue
        part: list[str] = []
        for impl, t in cells:
            if part and total + t > limit:
                pieces.append(([name], part, total))
                part, total = [], overhead
            part.append(impl)
            total += t
        pieces.append(([name], part, total))
        total = overhead
    if names:
        pieces.append((names, list(impls), total))
    return pieces


def fresh_process_args(ap: argparse.ArgumentParser, name: str, timeout: int) -> None:
    """The options of a benchmark that measures in fresh processes (:func:`run_fresh`):
    the training set and batch size, the device, the timeout per process, the output
    file and the hidden ``--one`` of the child process (:func:`child`)."""
    ap.add_argument("--n-train", type=int, default=500)
    ap.add_argument("--batch-size", type=int, default=100)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--timeout", type=int, default=timeout)
    ap.add_argument(
        "--out",
        default=None,
        help=f"output file (default results/{name}_<date>_<device>.json)",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)


def child(args, measure) -> bool:
    """In a process started by :func:`run_fresh` (``--one <cfg>``): run ``measure``,
    print its result."""
    if not args.one:
        return False
    print("RESULT " + json.dumps(measure(json.loads(args.one))), flush=True)
    return True


def machine_meta(device: str, **extra) -> dict:
    """The date, the machine and the versions a record was made
    with (plus ``extra``).
    """
    import datetime

    import laplace
    import torch

    cuda = device == "cuda"
    return {
        "date": datetime.date.today().isoformat(),
        "device": device,
        "device_name": torch.cuda.get_device_name() if cuda else cpu_name(),
        "driver": _driver() if cuda else None,
        "cuda": torch.version.cuda,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "laplace_torch": getattr(laplace, "__version__", "0.3"),
        "python": platform.python_version(),
        # TF32 (a 10-bit mantissa) in cuDNN convolutions and matrix products: PyTorch's
        # defaults, which no script here changes; recorded since the CNN's agreement
        # on a GPU (results/README.md, 2026-11-27) may depend on the first
        "tf32": {
            "cudnn": torch.backends.cudnn.allow_tf32,
            "matmul": torch.backends.cuda.matmul.allow_tf32,
        },
        # which code made the record: a hash of the module's source (works without git,
        # e.g. on a copied working tree) and the commit, where there is one
        "module_sha256": module_hash(),
        "commit": _commit(),
        **extra,
    }


def module_hash() -> str:
    """The first 12 hex digits of the SHA-256 of laplace_from_scratch's Python files,
    read in sorted path order: records with the same hash ran the same module code."""
    import hashlib

    pkg = Path(__file__).resolve().parents[1] / "laplace_from_scratch"
    h = hashlib.sha256()
    for f in sorted(pkg.rglob("*.py")):
        h.update(f.relative_to(pkg).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def _commit() -> str | None:
    """The checkout's commit, with "+changes" when tracked files differ from it; None
    without git."""
    root = Path(__file__).resolve().parents[1]
    try:
        run = lambda *a: subprocess.run(  # noqa: E731
            ["git", *a], capture_output=True, text=True, timeout=30, cwd=root
        )
        head = run("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        dirty = run("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return head.stdout.strip() + ("+changes" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def _driver() -> str | None:
    try:
        q = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        return (
            subprocess.run(q, capture_output=True, text=True, timeout=30).stdout.strip()
            or None
        )
    except (OSError, subprocess.TimeoutExpired):
        return None


def device_slug(meta: dict) -> str:
    """``cpu``, or ``cuda-`` and the GPU's name in lower case with dashes (for file
    names)."""
    if meta["device"] != "cuda":
        return meta["device"]
    name = "".join(c if c.isalnum() else "-" for c in meta["device_name"].lower())
    return "cuda-" + "-".join(filter(None, name.split("-")))


def record_path(
    name: str, meta: dict, out: Path | None = None, resume: bool = False
) -> Path:
    """``out``, or results/<name>_<date>_<device>.json (device: :func:`device_slug`).
    With ``resume`` and no ``out``: the newest results/<name>_*_<device>.json that
    pieces wrote (``meta["resume"]``), if there is one, so that pieces run on later days
    add to one record, named by the day of its first piece."""
    if out is not None:
        return out
    slug = device_slug(meta)
    if resume:
        for path in sorted(RESULTS.glob(f"{name}_*_{slug}.json"), reverse=True):
            if json.loads(path.read_text())["meta"].get("resume"):
                return path
    return RESULTS / f"{name}_{meta['date']}_{slug}.json"


def merge_args(ap: argparse.ArgumentParser, what: str) -> None:
    """The ``--merge RECORD OTHER`` option of a study run in parts (:func:`merge`)."""
    ap.add_argument(
        "--merge",
        nargs=2,
        metavar=("RECORD", "OTHER"),
        help=f"add OTHER's {what} to RECORD (one study run in parts) and exit",
    )


def merge(args, merge_records: Callable[[dict, dict], dict]) -> bool:
    """With ``--merge RECORD OTHER``: write ``merge_records(RECORD, OTHER)`` into RECORD
    (:func:`write_json`) and say so; return whether it did."""
    if not args.merge:
        return False
    record, other = (json.loads(Path(p).read_text()) for p in args.merge)
    write_json(Path(args.merge[0]), merge_records(record, other))
    print("merged", args.merge[1], "into", args.merge[0])
    return True


def write_json(path: Path, obj) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (a temporary file beside it, then
    ``os.replace``): a run stopped at any point leaves the old content or the new, never
    part of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


class Record:
    """A record ``{"meta", "rows"}`` that a run adds rows to, written after every row
    (atomically), so that a run stopped at any point leaves a valid record.

    ``append``: the rows already at ``path`` stay and this run's follow; ``resume``: the
    same, and :meth:`has` tells which cells (``cell(row)``) they hold, so that a piece
    of a sweep skips what an earlier piece recorded. Rows are only added to a record of
    the same device name and the same ``settings`` (keys of ``meta["args"]``). ``meta``
    becomes this run's (date, machine, versions, options); ``meta["runs"]`` lists every
    run that wrote to the record, each with its options, date, device, versions, the
    rows it added and whether it finished. With ``path=None`` nothing is written."""

    RUN_KEYS = (
        "date",
        "device_name",
        "driver",
        "cuda",
        "torch",
        "laplace_torch",
        "python",
    )
    TRANSIENT = ("weights", "probs_file", "probs")  # meaningful during the run only

    def __init__(
        self,
        path: Path | None,
        meta: dict,
        cell: Callable[[dict], tuple],
        *,
        append: bool = False,
        resume: bool = False,
        settings: tuple[str, ...] = (),
    ):
        self.path, self.meta, self.cell, self.rows = path, meta, cell, []
        old = {}
        if (append or resume) and path is not None and path.exists():
            old = json.loads(path.read_text())
            m = old["meta"]
            args = m.get("args", {})
            differ = [k for k in settings if args.get(k) != meta["args"].get(k)]
            differ += ["device_name"] * (m["device_name"] != meta["device_name"])
            if differ:
                raise SystemExit(
                    f"{path} was recorded with another {', '.join(differ)}: give a new "
                    "record with --out"
                )
        self.before = old.get("meta", {})
        self.old = old.get("rows", [])
        self.recorded = {cell(r) for r in self.old} if resume else set()
        self.run = {**meta["args"], **{k: meta.get(k) for k in self.RUN_KEYS}}
        self.run |= {"rows_added": 0, "finished": False}
        # a record from before runs were listed: its options are its one run
        runs = self.before.get("runs", [self.before.get("args", {})]) if old else []
        meta["runs"] = [*runs, self.run]
        meta["resume"] = resume or self.before.get("resume", False)

    def has(self, cell: tuple) -> bool:
        return cell in self.recorded

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.run["rows_added"] += 1
        self.write()

    def all_rows(self) -> list[dict]:
        return self.old + self.rows

    def record(self) -> dict:
        """``{"meta", "rows"}`` as written: the rows of earlier runs, then this
        run's."""
        rows = [
            {k: v for k, v in r.items() if k not in self.TRANSIENT}
            for r in self.all_rows()
        ]
        return {"meta": self.meta, "rows": rows}

    def write(self, finished: bool = False) -> None:
        self.run["finished"] = finished
        if self.path is not None:
            write_json(self.path, self.record())


def write_record(
    name: str, meta: dict, rows: list[dict], out: str | None = None
) -> Path:
    """Write {"meta", "rows"} to ``out`` or results/<name>_<date>_<device>.json; returns
    the path."""
    path = record_path(name, meta, Path(out) if out else None)
    write_json(path, {"meta": meta, "rows": rows})
    return path


def make_laplace(impl: str, model, likelihood: str, **kw):
    """``Laplace(model, likelihood, **kw)``: ours (``impl="ours"``), or laplace-torch's
    with the backend ``impl`` ("curvlinops", its default, "backpack" or "asdl")."""
    if impl == "ours":
        import laplace_from_scratch as lfs

        return lfs.Laplace(model, likelihood, **kw)
    import laplace
    from laplace.curvature import AsdlGGN, BackPackGGN, CurvlinopsGGN

    backend = {"curvlinops": CurvlinopsGGN, "backpack": BackPackGGN, "asdl": AsdlGGN}
    return laplace.Laplace(model, likelihood, backend=backend[impl], **kw)
