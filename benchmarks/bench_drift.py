"""How fast input drift is detected and how often it cries wolf, through the monitor's own windows
(`nereid.monitoring.version_monitor.VersionMonitor`, the code `nereid serve` runs), on synthetic data:

- a reference of 5,000 rows of 4 standard-normal features (a version folder's reference.npz);
- false alarms: windows of reference-distribution rows; the share whose worst feature's PSI passes the threshold;
- detection: reference rows for a window, then every feature's mean shifted by `shift` standard deviations from
  t=0; the delay until the PSI passes the threshold, evaluated each second (the sliding window still holds
  reference rows at first, which is what delays it).

Rows per second is the monitor's sampling (--monitoring-samples-per-second, 10 by default) times the rows a request
carries; the window is --monitoring-window-secs (60 by default).

    .venv/bin/python benchmarks/bench_drift.py [--windows 300] [--out benchmarks/results/drift.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from nereid.monitoring.version_monitor import VersionMonitor  # noqa: E402

WINDOW_SECONDS = 60
THRESHOLDS = (0.1, 0.25)  # PSI's usual readings: above 0.1 worth a look, above 0.25 a large shift (docs/monitoring.md)


def _monitor(rng: np.random.Generator) -> VersionMonitor:
    monitor = VersionMonitor("m", "1", reference_rows=1, window_seconds=WINDOW_SECONDS)
    monitor.set_reference({"in:X": rng.normal(0, 1, (5000, 4)).astype(np.float32)}, "reference.npz", now=0.0)
    return monitor


def false_alarms(rows_per_second: int, windows: int, seed: int) -> list[float]:
    """The worst feature's PSI of each of `windows` windows of reference-distribution rows."""
    rng = np.random.default_rng(seed)
    monitor = _monitor(rng)
    values = []
    for window in range(windows):
        start = window * WINDOW_SECONDS
        for second in range(WINDOW_SECONDS):
            monitor.observe({"in:X": rng.normal(0, 1, (rows_per_second, 4)).astype(np.float32)}, now=float(start + second))
        values.append(monitor.drift(now=float(start + WINDOW_SECONDS - 1))["in:X"].psi)
    return values


def detection_delay(rows_per_second: int, shift: float, threshold: float, seed: int) -> float | None:
    """Seconds from the shift until the PSI passes `threshold` (None: not within two windows)."""
    rng = np.random.default_rng(seed)
    monitor = _monitor(rng)
    for second in range(WINDOW_SECONDS):  # a full window of reference rows first
        monitor.observe({"in:X": rng.normal(0, 1, (rows_per_second, 4)).astype(np.float32)}, now=float(second))
    for elapsed in range(1, 2 * WINDOW_SECONDS + 1):
        now = float(WINDOW_SECONDS + elapsed - 1)
        monitor.observe({"in:X": rng.normal(shift, 1, (rows_per_second, 4)).astype(np.float32)}, now=now)
        if monitor.drift(now=now)["in:X"].psi > threshold:
            return float(elapsed)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=300)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "drift.md")
    args = parser.parse_args()
    rates = (2, 10, 40)
    out = ["# Drift detection: false alarms and delay (`benchmarks/bench_drift.py`)", "",
           f"`{' '.join(['benchmarks/bench_drift.py', *sys.argv[1:]])}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
           f"a {WINDOW_SECONDS} s sliding window, 4 standard-normal features, a 5,000-row reference; the statistic is "
           "the worst feature's PSI over the reference's deciles.", "",
           f"## False alarms ({args.windows} windows of reference-distribution rows each)", "",
           "| rows/s | rows a window | PSI median | PSI p99 | PSI max | windows > 0.1 | windows > 0.25 |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for rate in rates:
        values = false_alarms(rate, args.windows, seed=rate)
        over = [sum(v > t for v in values) for t in THRESHOLDS]
        out.append(f"| {rate} | {rate * WINDOW_SECONDS} | {statistics.median(values):.3f} | {np.quantile(values, 0.99):.3f} | "
                   f"{max(values):.3f} | {over[0]} ({over[0] / len(values):.1%}) | {over[1]} ({over[1] / len(values):.1%}) |")  # fmt: skip
    out += ["", f"## Detection delay after a shift (seconds; median and worst of {args.trials} trials; — never within 120 s)", "",
            "| rows/s | shift (sd) | delay to PSI > 0.1 | delay to PSI > 0.25 |", "|---|---|---|---|"]  # fmt: skip
    for rate in rates:
        for shift in (0.25, 0.5, 1.0):
            cells = []
            for threshold in THRESHOLDS:
                delays = [detection_delay(rate, shift, threshold, seed=1000 + trial) for trial in range(args.trials)]
                found = [d for d in delays if d is not None]
                missed = len(delays) - len(found)
                cell = f"{statistics.median(found):.0f} / {max(found):.0f}" if found else "—"
                cells.append(cell + (f" ({missed} missed)" if missed and found else ""))
            out.append(f"| {rate} | {shift:g} | {cells[0]} | {cells[1]} |")
    text = "\n".join(out) + "\n"
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
