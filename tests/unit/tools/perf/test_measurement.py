"""Measurement windows, perf_analyzer's stability rule, the server-side breakdown from statistics deltas, and
the CSV / JSON / table outputs."""

from __future__ import annotations

import csv
import io
import json
from array import array

import numpy as np
import pytest

from nereid.tools.perf import CSV_COLUMNS, PerfConfig, csv_text, format_table, json_document
from nereid.tools.perf.measurement import Window, WindowCollector, is_stable, latency_summary
from nereid.tools.perf.results import LatencySummary, PerfResult
from nereid.tools.perf.server_stats import breakdown, parse_statistics
from nereid.tools.perf.worker import Records


def _window(count: int, latency_us: float, seconds: float = 1.0) -> Window:
    return Window(0, int(seconds * 1e9), np.full(count, int(latency_us * 1000), dtype=np.int64), None, None, 0, "", 0.1, 0, 0, count, 0)


def test_three_windows_within_the_threshold_are_stable() -> None:
    assert not is_stable([_window(100, 1000), _window(105, 1000)], 10, None)
    assert is_stable([_window(100, 1000), _window(105, 1050), _window(109, 990)], 10, None)
    assert not is_stable([_window(100, 1000), _window(120, 1000), _window(105, 1000)], 10, None)  # throughput
    assert not is_stable([_window(100, 1000), _window(100, 1200), _window(100, 1000)], 10, None)  # latency
    assert not is_stable([_window(100, 1000), _window(100, 1000), _window(0, 0)], 10, None)
    # only the last three count
    assert is_stable([_window(10, 50), _window(100, 1000), _window(100, 1000), _window(100, 1000)], 10, None)


def test_stability_can_use_a_percentile() -> None:
    tail = np.concatenate([np.full(95, 1_000_000), np.full(5, 9_000_000)]).astype(np.int64)
    w = [_window(100, 1000) for _ in range(3)]
    w[1] = Window(0, 1_000_000_000, tail, None, None, 0, "", 0.0, 0, 0, 100, 0)
    assert is_stable(w, 10, 50) and not is_stable(w, 10, 99)


def test_latency_summary_uses_nearest_rank_percentiles() -> None:
    summary = latency_summary(np.arange(1, 101, dtype=np.int64) * 1000, extra_percentile=75)
    assert (summary.p50_us, summary.p90_us, summary.p95_us, summary.p99_us) == (50, 90, 95, 99)
    assert summary.avg_us == pytest.approx(50.5) and summary.extra == {75: 75}


def _records(starts: list[int], ends: list[int], cpu: float, errors: int = 0) -> Records:
    return Records(array("q", starts), array("q", ends), errors=errors, first_error="boom" if errors else "", cpu_s=cpu)


def test_collector_cuts_by_completion_time_and_carries_the_rest() -> None:
    collector = WindowCollector()
    assert collector.add([_records([0], [5], cpu=1.0)]) == 0.0  # baseline
    cpu = collector.add([_records([8, 10, 15], [12, 18, 25], cpu=1.5, errors=1)])
    window = collector.cut(10, 20, cpu)
    assert window.latencies_ns.tolist() == [4, 8] and window.cpu_s == 0.5 and window.errors == 1
    assert window.first_error == "boom"
    following = collector.cut(20, 30, 0.0)
    assert following.latencies_ns.tolist() == [10] and following.errors == 0


def _stats(success: int, queue_ns: int, infer_ns: int, inference: int, executions: int) -> dict[str, object]:
    def d(count: int, ns: int) -> dict[str, int]:
        return {"count": count, "ns": ns}

    return {
        "model_stats": [
            {
                "name": "m",
                "version": "1",
                "inference_count": inference,
                "execution_count": executions,
                "inference_stats": {
                    "success": d(success, success * 500_000),
                    "fail": d(0, 0),
                    "queue": d(success, queue_ns),
                    "compute_input": d(success, success * 10_000),
                    "compute_infer": d(success, infer_ns),
                    "compute_output": d(success, success * 20_000),
                },
            },
            {"name": "other", "version": "1", "inference_count": 99, "inference_stats": {}},
        ]
    }


def test_breakdown_is_the_per_request_average_of_the_delta() -> None:
    before = parse_statistics(_stats(10, 1_000_000, 2_000_000, 10, 10), "m")
    after = parse_statistics(_stats(110, 21_000_000, 32_000_000, 410, 60), "m")
    server = breakdown(before, after)
    assert server.request_count == 100 and server.inference_count == 400 and server.execution_count == 50
    assert server.queue_us == pytest.approx(200) and server.compute_infer_us == pytest.approx(300)
    assert server.compute_input_us == pytest.approx(10) and server.compute_output_us == pytest.approx(20)
    assert server.avg_request_us == pytest.approx(500)
    assert server.overhead_us == 0.0  # 500 us is less than queue + compute (530 us): clamped, never negative
    assert parse_statistics(_stats(1, 0, 0, 1, 1), "m", version="2").count("success") == 0


def _result(concurrency: int, throughput: float, with_server: bool = True) -> PerfResult:
    from nereid.tools.perf.server_stats import ServerBreakdown

    server = ServerBreakdown(100, 0, 100, 50, 400.0, 100.0, 10.0, 200.0, 20.0, 70.0, 0) if with_server else None
    return PerfResult(
        mode="concurrency", concurrency=concurrency, request_rate=0.0, batch_size=1, protocol="http", model="m",
        throughput=throughput, requests_per_s=throughput, request_count=100, error_count=0, window_s=1.0,
        latency=LatencySummary(1000.0, 900.0, 1500.0, 1700.0, 2500.0), client_send_us=5.0, client_recv_us=15.0,
        server=server, stable=True, windows=3, client_cpu_percent=12.5, workers=1, sent_total=120, completed_total=120,
    )  # fmt: skip


def test_csv_has_perf_analyzer_columns_sorted_by_throughput() -> None:
    text = csv_text([_result(4, 300.0), _result(1, 100.0), _result(2, 250.5, with_server=False)])
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["Concurrency", *CSV_COLUMNS]
    assert rows[0][:13] == [
        "Concurrency", "Inferences/Second", "Client Send", "Network+Server Send/Recv", "Server Queue",
        "Server Compute Input", "Server Compute Infer", "Server Compute Output", "Client Recv",
        "p50 latency", "p90 latency", "p95 latency", "p99 latency",
    ]  # fmt: skip
    assert [r[0] for r in rows[1:]] == ["1", "2", "4"]
    first = dict(zip(rows[0], rows[1]))
    assert first["Inferences/Second"] == "100.00" and first["Server Queue"] == "100" and first["p99 latency"] == "2500"
    # 1000 avg - 5 send - 15 recv - (100 + 10 + 200 + 20) server = 650
    assert first["Network+Server Send/Recv"] == "650" and first["Avg latency"] == "1000"
    assert first["request/response"] == "20" and first["response wait"] == "980"


def test_csv_extra_percentile_and_verbose_columns() -> None:
    result = _result(1, 100.0)
    result.latency.extra[75] = 1234.0
    header, row = list(csv.reader(io.StringIO(csv_text([result], percentile=75, verbose=True))))
    assert header[header.index("p99 latency") + 1] == "p75 latency" and row[header.index("p75 latency")] == "1234"
    assert dict(zip(header, row))["Client CPU %"] == "12.5"


def test_json_document_and_table() -> None:
    results = [_result(1, 100.0), _result(2, 180.0, with_server=False)]
    doc = json.loads(json.dumps(json_document(results, PerfConfig("m", concurrency_range=(1, 2, 1)))))
    assert doc["mode"] == "concurrency" and len(doc["results"]) == 2
    assert doc["results"][0]["latency"]["p99_us"] == 2500.0 and doc["results"][0]["server"]["queue_us"] == 100.0
    assert doc["results"][1]["server"] is None
    table = format_table(results)
    assert "Concurrency" in table.splitlines()[0] and "180.0" in table and len(table.splitlines()) == 3
