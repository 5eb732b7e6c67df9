"""Helpers the benchmark scripts share."""

from __future__ import annotations

import os
import platform
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
    """Peak resident set size of this process while the ``with`` block runs, sampled by a thread."""

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
