"""Helpers the benchmark scripts share."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path


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

    return {
        "date": datetime.date.today().isoformat(),
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else cpu_name(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "laplace_torch": getattr(laplace, "__version__", "0.3"),
        "python": platform.python_version(),
        **extra,
    }


def write_record(
    name: str, meta: dict, rows: list[dict], out: str | None = None
) -> Path:
    """Write {"meta", "rows"} to ``out`` or results/<name>_<date>_<device>.json; returns
    the path."""
    root = Path(__file__).resolve().parent.parent / "results"
    path = Path(out) if out else root / f"{name}_{meta['date']}_{meta['device']}.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return path
