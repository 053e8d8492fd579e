"""The report of an analysis: a CSV of every measurement, two PNG charts drawn with matplotlib (throughput
against p99 latency, memory against p99 latency, one line per configuration) and a self-contained HTML page
with the best configurations, a summary table, the charts and every config tried. Reads results only."""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from pathlib import Path
from typing import Any

from nereid.tools.analyze.results import AnalyzeResult, LevelMeasurement, VariantOutcome
from nereid.tools.analyze.settings import AnalyzeError

__all__ = ["CSV_COLUMNS", "csv_rows", "draw_charts", "render_html", "write_report"]

CSV_COLUMNS = [
    "variant",
    "max_batch_size",
    "dynamic_batching",
    "max_queue_delay_us",
    "preferred_batch_sizes",
    "instance_count",
    "intra_op_thread_count",
    "concurrency",
    "throughput_infer_per_s",
    "p50_latency_ms",
    "p90_latency_ms",
    "p95_latency_ms",
    "p99_latency_ms",
    "avg_latency_ms",
    "server_queue_us",
    "server_compute_infer_us",
    "client_cpu_percent",
    "server_cpu_percent",
    "server_memory_mb",
    "gpu_utilization_percent",
    "gpu_memory_mb",
    "stable",
    "meets_constraints",
    "violations",
]

_TOP_LINES = 9  # configurations drawn in colour with a legend entry; the rest are grey


def _num(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def csv_rows(result: AnalyzeResult) -> list[list[str]]:
    rows = []
    for outcome in result.outcomes:
        v = outcome.variant
        for m in outcome.measurements:
            rows.append(
                [
                    outcome.label,
                    str(v.max_batch_size),
                    "on" if v.dynamic_batching else "off",
                    str(v.max_queue_delay_us) if v.dynamic_batching else "",
                    " ".join(str(s) for s in v.preferred_batch_sizes),
                    str(v.instance_count),
                    "" if v.intra_op_threads is None else str(v.intra_op_threads),
                    str(m.concurrency),
                    _num(m.throughput),
                    _num(m.p50_ms),
                    _num(m.p90_ms),
                    _num(m.p95_ms),
                    _num(m.p99_ms),
                    _num(m.avg_ms),
                    _num(m.server_queue_us, 1),
                    _num(m.server_compute_us, 1),
                    _num(m.client_cpu_percent, 1),
                    _num(m.server_cpu_percent, 1),
                    _num(m.server_memory_mb, 1),
                    _num(m.gpu_utilization_percent, 1),
                    _num(m.gpu_memory_mb, 1),
                    "yes" if m.stable else "no",
                    "yes" if m.meets_constraints else "no",
                    "; ".join(m.violations),
                ]
            )
    return rows


def _write_csv(result: AnalyzeResult, path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_COLUMNS)
        writer.writerows(csv_rows(result))


def _peak_throughput(outcome: VariantOutcome) -> float:
    return max((m.throughput for m in outcome.measurements), default=0.0)


def _ranked(result: AnalyzeResult) -> tuple[list[VariantOutcome], list[VariantOutcome]]:
    """Configurations drawn in colour (the best picks, the baseline, the highest throughputs) and the rest."""
    measured = [o for o in result.outcomes if o.measured]
    picked = {pick.outcome.label for pick in result.best.values()}
    ordered = sorted(measured, key=lambda o: (o.label not in picked, not o.is_baseline, -_peak_throughput(o)))
    return ordered[:_TOP_LINES], ordered[_TOP_LINES:]


def _chart(result: AnalyzeResult, y_of: Any, y_label: str, title: str, y_limit: float | None, y_limit_label: str) -> bytes:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11.5, 5.0), dpi=100, layout="constrained")
    axes = figure.subplots()
    shown, rest = _ranked(result)
    picked: dict[str, list[str]] = {}
    for name, pick in result.best.items():
        picked.setdefault(pick.outcome.label, []).append(name)
    plotted = False
    for index, outcome in enumerate([*rest, *shown]):
        points = [(m.p99_ms, y_of(m), m) for m in sorted(outcome.measurements, key=lambda m: m.concurrency) if y_of(m) is not None]
        if not points:
            continue
        plotted = True
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        if outcome in rest:
            axes.plot(xs, ys, color="#c8c8c8", linewidth=1, marker=".", zorder=1, label="_nolegend_")
            continue
        label = outcome.label + (f"  (best: {', '.join(picked[outcome.label])})" if outcome.label in picked else "")
        line = axes.plot(
            xs, ys, marker="o", linewidth=2.6 if outcome.label in picked else 1.4, zorder=3, label=label,
            color=f"C{index % 10}",
        )[0]
        for x, y, m in points:
            axes.annotate(f"c{m.concurrency}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=line.get_color())
    if rest:
        axes.plot([], [], color="#c8c8c8", linewidth=1, marker=".", label=f"{len(rest)} other configuration(s)")
    limit = result.constraints.get("max_p99_latency_ms")
    if limit is not None:
        axes.axvline(limit, color="#b22222", linestyle="--", linewidth=1, label=f"max p99 {limit:g} ms")
    if y_limit is not None:
        axes.axhline(y_limit, color="#8b008b", linestyle=":", linewidth=1, label=y_limit_label)
    if not plotted:
        axes.text(0.5, 0.5, "nothing measured", transform=axes.transAxes, ha="center", va="center", color="#666666")
    axes.set_xlabel("p99 latency (ms)")
    axes.set_ylabel(y_label)
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    if plotted:
        axes.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def draw_charts(result: AnalyzeResult) -> dict[str, bytes]:
    """PNG bytes of both charts, by file name."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise AnalyzeError("the charts need matplotlib: pip install 'nereid[analyze]'") from None
    throughput = _chart(
        result,
        lambda m: m.throughput,
        "throughput (inferences/s)",
        f"{result.model}: throughput against p99 latency (points are concurrency levels)",
        result.constraints.get("min_throughput"),
        f"min throughput {result.constraints.get('min_throughput', 0):g}/s",
    )
    memory = _chart(
        result,
        lambda m: m.server_memory_mb,
        "server memory (MB)",
        f"{result.model}: memory against p99 latency",
        result.constraints.get("max_memory_mb"),
        f"max memory {result.constraints.get('max_memory_mb', 0):g} MB",
    )
    return {"throughput_vs_latency.png": throughput, "memory_vs_latency.png": memory}


_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; margin: 24px auto; max-width: 1240px;
       color: #1d232a; padding: 0 16px; }
h1 { font-size: 1.6em; margin-bottom: 4px; } h2 { margin-top: 32px; border-bottom: 1px solid #d8dee4; padding-bottom: 4px; }
.meta { color: #57606a; margin: 2px 0; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: 0.82em; }
th, td { border: 1px solid #d0d7de; padding: 4px 6px; text-align: right; }
th { background: #f3f5f7; } td.name, th.name, td.text { text-align: left; }
tr.best td { background: #e8f5e9; font-weight: 600; } tr.failed td { color: #8c1c13; background: #fdf0ef; }
.cards { display: flex; gap: 16px; flex-wrap: wrap; }
.card { border: 1px solid #d0d7de; border-radius: 8px; padding: 12px 16px; flex: 1 1 420px; background: #fbfcfd; }
.card h3 { margin: 0 0 6px 0; } .figures { font-size: 1.05em; margin: 6px 0; }
pre { background: #f6f8fa; border: 1px solid #e1e4e8; padding: 8px; overflow-x: auto; font-size: 0.85em; }
img { max-width: 100%; border: 1px solid #e1e4e8; } .no { color: #8c1c13; } .yes { color: #1a7f37; }
.warning { background: #fff8e1; border: 1px solid #f0c36d; padding: 8px 12px; border-radius: 6px; }
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _ms(value: float) -> str:
    return f"{value:,.2f}"


def _summary_row(outcome: VariantOutcome, best_labels: dict[str, list[str]]) -> str:
    v = outcome.variant
    batching = f"on, {v.max_queue_delay_us} µs" + (f", pref {list(v.preferred_batch_sizes)}" if v.preferred_batch_sizes else "") if v.dynamic_batching else "off"
    threads = "" if v.intra_op_threads is None else str(v.intra_op_threads)
    marks = best_labels.get(outcome.label, [])
    name = _e(outcome.label) + "".join(f' <span class="yes">★ {_e(m)}</span>' for m in marks)
    cells = [
        f'<td class="name">{outcome.order}</td>',
        f'<td class="name">{name}</td>',
        f"<td>{v.max_batch_size}</td>",
        f'<td class="text">{_e(batching)}</td>',
        f"<td>{v.instance_count}</td>",
        f"<td>{threads}</td>",
    ]
    if not outcome.measured:
        cells.append(f'<td class="text" colspan="7">failed: {_e(outcome.error or "not measured")}</td>')
        return f'<tr class="failed">{"".join(cells)}</tr>'
    top = max(outcome.measurements, key=lambda m: m.throughput)
    fastest = min(outcome.measurements, key=lambda m: m.p99_ms)
    memory = [m.server_memory_mb for m in outcome.measurements if m.server_memory_mb is not None]
    qualifying = sum(1 for m in outcome.measurements if m.meets_constraints)
    status = "measured" if outcome.complete and not outcome.error else ("partial: " + (outcome.error or "time budget"))
    cells += [
        f"<td>{top.throughput:,.1f} @ c{top.concurrency}</td>",
        f"<td>{_ms(top.p99_ms)}</td>",
        f"<td>{_ms(fastest.p99_ms)} @ c{fastest.concurrency}</td>",
        f"<td>{'' if top.server_cpu_percent is None else f'{top.server_cpu_percent:.0f}'}</td>",
        f"<td>{f'{max(memory):,.0f}' if memory else ''}</td>",
        f'<td class="{"yes" if qualifying else "no"}">{f"yes ({qualifying}/{len(outcome.measurements)})" if qualifying else "no"}</td>',
        f'<td class="text">{_e(status)}</td>',
    ]
    return f'<tr class="{"best" if marks else ""}">{"".join(cells)}</tr>'


def _measurement_rows(result: AnalyzeResult) -> str:
    rows = []
    for outcome in result.outcomes:
        for m in outcome.measurements:
            rows.append(_measurement_row(m))
    return "\n".join(rows)


def _measurement_row(m: LevelMeasurement) -> str:
    def opt(value: float | None, fmt: str) -> str:
        return "" if value is None else format(value, fmt)

    return (
        f'<tr><td class="name">{_e(m.variant)}</td><td>{m.concurrency}</td><td>{m.throughput:,.1f}</td><td>{_ms(m.p50_ms)}</td>'
        f"<td>{_ms(m.p99_ms)}</td><td>{opt(m.server_queue_us, ',.0f')}</td><td>{opt(m.server_compute_us, ',.0f')}</td>"
        f"<td>{opt(m.server_cpu_percent, '.0f')}</td><td>{opt(m.server_memory_mb, ',.0f')}</td>"
        f"<td>{opt(m.gpu_utilization_percent, '.0f')}</td><td>{'yes' if m.stable else 'no'}</td>"
        f'<td class="{"yes" if m.meets_constraints else "no"}">{"yes" if m.meets_constraints else _e("; ".join(m.violations))}</td></tr>'
    )


def render_html(result: AnalyzeResult, charts: dict[str, bytes]) -> str:
    best_labels: dict[str, list[str]] = {}
    for name, pick in result.best.items():
        best_labels.setdefault(pick.outcome.label, []).append(name)
    constraints = ", ".join(f"{k} = {v:g}" for k, v in result.constraints.items()) or "none"
    measured = sum(1 for o in result.outcomes if o.measured)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>nereid analyze: {_e(result.model)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>nereid analyze: model <code>{_e(result.model)}</code></h1>",
        f'<p class="meta">Server: {_e(result.server)}</p>',
        f'<p class="meta">Search: {_e(result.mode)} mode over {_e(result.search_space)} '
        f"({result.variants_in_space} configurations in the grid); objectives: {_e(', '.join(result.objectives))}; "
        f"constraints: {_e(constraints)}</p>",
        f'<p class="meta">Measured {measured} configuration(s) of {len(result.outcomes)} tried in {result.elapsed_s:.1f} s '
        f"(time budget {result.time_budget_s:g} s). Server CPU and memory: {_e(result.resource_source)}.</p>",
    ]
    if result.stopped_early:
        parts.append(f'<p class="warning">Stopped early: {_e(result.stopped_early)}. The report covers what was measured.</p>')
    if result.fatal:
        parts.append(f'<p class="warning">The search ended on an error: {_e(result.fatal)}</p>')
    parts.append('<h2>Best configurations</h2><div class="cards" id="best">')
    for name in result.objectives:
        chosen = result.best.get(name)
        if chosen is None:
            parts.append(f'<div class="card"><h3>{_e(name)}</h3><p class="no">No measured configuration meets the constraints.</p></div>')
            continue
        pick = chosen
        m = pick.measurement
        where = f"<p>Written to <code>{_e(pick.config_path)}</code></p>" if pick.config_path else ""
        parts.append(
            f'<div class="card"><h3>{_e(name)}: {_e(pick.outcome.label)}</h3>'
            f"<p>{_e(pick.outcome.variant.describe())}</p>"
            f'<p class="figures">{m.throughput:,.1f} infer/s, p99 {_ms(m.p99_ms)} ms at concurrency {m.concurrency}'
            + (f", server memory {m.server_memory_mb:,.0f} MB" if m.server_memory_mb is not None else "")
            + f"</p>{where}<details><summary>config.pbtxt</summary><pre>{_e(pick.outcome.config_text)}</pre></details></div>"
        )
    parts.append("</div>")
    parts.append(
        '<h2>Summary</h2><div class="scroll"><table id="summary"><thead><tr><th class="name">#</th><th class="name">Configuration</th>'
        "<th>max_batch_size</th><th class=\"name\">Dynamic batching</th><th>Instances</th><th>Intra-op threads</th>"
        "<th>Max throughput (infer/s)</th><th>p99 there (ms)</th><th>Lowest p99 (ms)</th><th>Server CPU %</th>"
        "<th>Peak memory (MB)</th><th>Meets constraints</th><th class=\"name\">Status</th></tr></thead><tbody>"
    )
    parts.extend(_summary_row(o, best_labels) for o in result.outcomes)
    parts.append("</tbody></table></div>")
    parts.append("<h2>Charts</h2>")
    captions = {
        "throughput_vs_latency.png": "Throughput against p99 latency for each configuration; each point is a concurrency level.",
        "memory_vs_latency.png": "Peak server memory against p99 latency for each configuration.",
    }
    for file_name, data in charts.items():
        encoded = base64.b64encode(data).decode("ascii")
        parts.append(
            f'<figure><img src="data:image/png;base64,{encoded}" alt="{_e(captions.get(file_name, file_name))}">'
            f"<figcaption>{_e(captions.get(file_name, file_name))} ({_e(file_name)})</figcaption></figure>"
        )
    parts.append(
        '<h2>All measurements</h2><div class="scroll"><table id="measurements"><thead><tr><th class="name">Configuration</th><th>Concurrency</th>'
        "<th>Throughput (infer/s)</th><th>p50 (ms)</th><th>p99 (ms)</th><th>Server queue (µs)</th><th>Server compute (µs)</th>"
        "<th>Server CPU %</th><th>Memory (MB)</th><th>GPU %</th><th>Stable</th><th>Meets constraints</th></tr></thead><tbody>"
    )
    parts.append(_measurement_rows(result))
    parts.append("</tbody></table></div><h2>Configurations tried</h2>")
    for outcome in result.outcomes:
        parts.append(
            f"<details><summary>{_e(outcome.label)}: {_e(outcome.variant.describe())}</summary><pre>{_e(outcome.config_text)}</pre></details>"
        )
    if result.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in result.notes) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(result: AnalyzeResult, output_dir: Path) -> dict[str, Path]:
    """Write measurements.csv, the two PNG charts, report.html and results.json; returns their paths by kind."""
    output_dir.mkdir(parents=True, exist_ok=True)
    files = {"csv": output_dir / "measurements.csv"}
    _write_csv(result, files["csv"])
    charts = draw_charts(result)
    for file_name, data in charts.items():
        path = output_dir / file_name
        path.write_bytes(data)
        files[file_name.removesuffix(".png")] = path
    files["json"] = output_dir / "results.json"
    files["html"] = output_dir / "report.html"
    result.files.update(files)
    files["json"].write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    files["html"].write_text(render_html(result, charts))
    return files
