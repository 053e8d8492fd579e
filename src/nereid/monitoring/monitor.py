"""The server's monitor: samples finished requests on the request path (a counter and a comparison), hands them
through a bounded queue to a thread of its own, and there keeps each version's drift windows, data-quality counts
and the payload log. A full queue drops the sample (counted); nothing here can delay or fail a request."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nereid.core.types import InferenceResponse, InputTensor
from nereid.monitoring.payload_log import PayloadLog, TensorLog, payload_record
from nereid.monitoring.version_monitor import TensorDrift, VersionMonitor

__all__ = ["Monitor", "MonitorConfig", "REFERENCE_FILE"]

log = logging.getLogger("nereid.monitoring")

# A version folder's reference data: an .npz of samples, inputs by name, outputs as "output:NAME".
REFERENCE_FILE = "reference.npz"
_OUTPUT_PREFIX = "output:"
_QUEUE_CAPACITY = 256
# A sampled tensor is copied up to this many values (its first rows): the monitor's memory is bounded whatever
# the tensors' size, and the payload log writes tensors of this size whole (larger ones by shape only).
_MAX_ELEMENTS = 4096
_REFRESH_SECONDS = 1.0  # how often the drift snapshot is brought up to date
# The thread takes the queued samples together, this often: one wake-up and one pass of numpy calls per tensor for
# all of them, where a wake-up per sample had the thread and the event loop hand the GIL back and forth.
_DRAIN_SECONDS = 0.25


@dataclass(frozen=True, slots=True)
class MonitorConfig:
    samples_per_second: float = 50.0  # 0: monitoring off (the server flag's default)
    window_seconds: float = 60.0
    reference_requests: int = 500  # sampled requests that make the reference when the version folder has none
    payload_log_dir: str = ""  # "": no payload log
    payload_log_share: float = 1.0  # of the monitored samples, the share that is also logged
    payload_log_max_bytes: int = 64 << 20
    payload_log_backups: int = 5


@dataclass(slots=True)
class _Sample:
    """A sampled request as the thread gets it: small copies of its tensors ("in:X", "out:Y"), so that nothing of the
    request outlives its answer (a worker's output arena is reused once the answer is sent)."""

    at: float
    model: str
    version: str
    folder: Path | None
    request_id: str
    tensors: dict[str, np.ndarray]
    shapes: dict[str, tuple[int, ...]]  # each tensor's shape as served (the copy may hold its first rows only)
    error: str
    latency_ns: int


class Monitor:
    def __init__(self, config: MonitorConfig) -> None:
        self.config = config
        self.active = config.samples_per_second > 0
        # Every stride-th request is looked at; the stride follows the arrival rate, measured at each look, so that
        # about samples_per_second are sampled from the first second on (a stride adapted once a second let the
        # first second of a busy server sample every request and fill the queue with work for the thread).
        self.stride = 1
        self._count = 0
        self._offered = 0  # requests counted at the looks so far (the thread's measure of a rate that fell)
        self._looked = 0.0  # monotonic seconds of the last look
        self._queue: queue.Queue[_Sample] = queue.Queue(_QUEUE_CAPACITY)
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._logged = 0  # samples offered to the payload log
        self.versions: dict[tuple[str, str], VersionMonitor] = {}
        self.snapshot: dict[tuple[str, str], dict[str, TensorDrift]] = {}
        self.dropped = 0
        self.sampled = 0
        self.payload = PayloadLog(config.payload_log_dir, config.payload_log_max_bytes, config.payload_log_backups) if config.payload_log_dir else None  # fmt: skip
        self._payload_every = max(1, round(1 / config.payload_log_share)) if config.payload_log_share > 0 else 0
        self._reference_of: dict[tuple[str, str], tuple[str, str]] = {}  # a candidate's reference: its primary's

    # -- the request path ----------------------------------------------------------------------------------------
    def wants(self) -> bool:
        """Whether this request is sampled: one counter and one comparison, and a clock reading once a stride."""
        self._count += 1
        if self._count < self.stride:
            return False
        now = time.monotonic()
        rate = self._count / max(now - self._looked, 1e-6)
        self._offered += self._count
        self._count, self._looked = 0, now
        self.stride = max(1, round(rate / self.config.samples_per_second))
        return True

    def observe(
        self, model: str, version: str, folder: Path | None, request_id: str, inputs: list[InputTensor],
        response: InferenceResponse, latency_ns: int,
    ) -> None:  # fmt: skip
        """A sampled request has ended: small copies of its tensors queued for the thread, or dropped when the queue
        is full. Bounded: at most _MAX_ELEMENTS values of each tensor are copied."""
        if self._thread is None:
            self._start()
        if self._queue.full():
            self.dropped += 1
            return
        tensors: dict[str, np.ndarray] = {}
        shapes: dict[str, tuple[int, ...]] = {}
        named = [("in:" + t.name, t.data) for t in inputs]
        if response.error is None:
            named += [("out:" + t.name, t.data) for t in response.outputs]
        for name, data in named:
            array = np.asarray(data)
            shapes[name] = array.shape
            tensors[name] = _first_values(array)
        error = response.error.message if response.error is not None else ""
        try:
            self._queue.put_nowait(_Sample(time.time(), model, version, folder, request_id, tensors, shapes, error, latency_ns))
        except queue.Full:
            self.dropped += 1

    # -- control ---------------------------------------------------------------------------------------------------
    def compare_with(self, model: str, candidate: str, primary: str) -> None:
        """During a rollout the candidate's traffic is judged against its primary's reference."""
        self._reference_of[(model, candidate)] = (model, primary)

    def input_drift(self, model: str, version: str) -> float | None:
        """The worst input PSI of a version now (None before it has a reference)."""
        drifts = [d.psi for name, d in self.snapshot.get((model, version), {}).items() if name.startswith("in:")]
        return max(drifts) if drifts else None

    def close(self) -> None:
        if self._thread is not None:
            self._closing.set()
            self._thread.join(5)
            self._thread = None
        if self.payload is not None:
            self.payload.close()

    # -- the thread ------------------------------------------------------------------------------------------------
    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="nereid-monitor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        refreshed = time.monotonic()
        offered = self._offered
        while not self._closing.wait(_DRAIN_SECONDS):
            self._take_queued()
            now = time.monotonic()
            if now - refreshed >= _REFRESH_SECONDS:
                offered = self.follow_falling_rate(now - refreshed, offered)
                self._refresh()
                refreshed = now

    def _take_queued(self) -> None:
        by_version: dict[tuple[str, str], list[_Sample]] = {}
        while True:
            try:
                sample = self._queue.get_nowait()
            except queue.Empty:
                break
            by_version.setdefault((sample.model, sample.version), []).append(sample)
        for samples in by_version.values():
            try:
                self._take(samples)
            except Exception:  # one odd sample must not stop monitoring
                log.exception("monitoring requests of model '%s' failed", samples[0].model)

    def follow_falling_rate(self, elapsed: float, offered_before: int) -> int:
        """Traffic that fell since the last look would wait a whole stride for the next one: the stride comes down
        to the rate of the last `elapsed` seconds (the looks only ever raise it). The requests offered so far."""
        offered = self._offered + self._count
        rate = (offered - offered_before) / elapsed
        self.stride = max(1, min(self.stride, round(rate / self.config.samples_per_second)))
        return offered

    def _take(self, samples: list[_Sample]) -> None:
        """Samples of one version: into its windows (or its reference, until it has one) and the payload log."""
        first, last = samples[0], samples[-1]
        key = (first.model, first.version)
        monitor = self.versions.get(key)
        if monitor is None:
            monitor = self.versions[key] = VersionMonitor(
                first.model, first.version, self.config.reference_requests, self.config.window_seconds
            )
            self._load_reference(monitor, first.folder, first.at)
        self._borrow_reference(key, monitor, last.at)
        self.sampled += len(samples)
        monitor.observe_many([sample.tensors for sample in samples], last.at)
        if self.payload is not None and self._payload_every:
            for sample in samples:
                self._logged += 1
                if self._logged % self._payload_every == 0:
                    self._log(sample)

    def _borrow_reference(self, key: tuple[str, str], monitor: VersionMonitor, now: float) -> None:
        source = self._reference_of.get(key)
        if source is None:
            return
        primary = self.versions.get(source)
        borrowed = f"version {source[1]}"
        if primary is not None and primary.profiles and monitor.reference_source != borrowed:
            monitor.use_profiles(dict(primary.profiles), borrowed, now)

    def _load_reference(self, monitor: VersionMonitor, folder: Path | None, now: float) -> None:
        path = folder / REFERENCE_FILE if folder is not None else None
        if path is None or not path.exists():
            return
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {
                    ("out:" + key[len(_OUTPUT_PREFIX) :]) if key.startswith(_OUTPUT_PREFIX) else "in:" + key: data[key]
                    for key in data.files
                }
            monitor.set_reference(arrays, str(path), now)
        except (OSError, ValueError) as exc:
            log.error("monitoring reference '%s' of model '%s' could not be read: %s", path, monitor.model, exc)

    def _refresh(self) -> None:
        now = time.time()
        self.snapshot = {key: monitor.drift(now) for key, monitor in self.versions.items() if monitor.profiles}

    def _log(self, sample: _Sample) -> None:
        assert self.payload is not None
        inputs: dict[str, TensorLog] = {}
        outputs: dict[str, TensorLog] = {}
        for name, array in sample.tensors.items():
            kind, _, tensor = name.partition(":")
            (inputs if kind == "in" else outputs)[tensor] = TensorLog(sample.shapes[name], array)
        self.payload.write(payload_record(sample.at, sample.model, sample.version, sample.request_id,
                                          sample.latency_ns / 1e6, sample.error, inputs, outputs))  # fmt: skip


def _first_values(array: np.ndarray) -> np.ndarray:
    """A copy of the tensor, or of its first rows when it holds more than _MAX_ELEMENTS values (of the first row's
    first values when one row alone is larger)."""
    if array.size <= _MAX_ELEMENTS:
        return array.copy()
    if array.ndim >= 2:
        row = array.size // max(array.shape[0], 1)
        if row <= _MAX_ELEMENTS:
            return array[: _MAX_ELEMENTS // row].copy()
        return array[:1].reshape(1, -1)[:, :_MAX_ELEMENTS].copy()
    return array[:_MAX_ELEMENTS].copy()

