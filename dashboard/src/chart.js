// One uPlot chart: created once, then fed new data with setData (no new chart per update), destroyed with its view.
import { html } from "./html.js";
import { useEffect, useRef } from "preact/hooks";
import uPlot from "uplot";

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"];

export function Chart({ title, ring, series, updates, unit = "", height = 170 }) {
  const holder = useRef(null);
  const plot = useRef(null);
  const columns = () => [ring.columns[0], ...series.map((s) => ring.columns[ring.names.indexOf(s.key)])];
  useEffect(() => {
    const options = {
      width: Math.max(260, holder.current.clientWidth || 400),
      height,
      legend: { show: true },
      scales: { x: { time: true }, y: { range: (_u, min, max) => [0, Math.max((max || 0) * 1.1, 1)] } },
      axes: [{}, { size: 70, values: (_u, values) => values.map((v) => (unit === "µs" && v >= 1000 ? `${+(v / 1000).toPrecision(3)} ms` : `${+v.toPrecision(3)}${unit === "µs" ? " µs" : unit}`)) }],
      series: [{}, ...series.map((s, i) => ({ label: s.label, stroke: s.color || PALETTE[i % PALETTE.length], width: 1.5, dash: s.dash, spanGaps: true }))],
    };
    plot.current = new uPlot(options, columns(), holder.current);
    const resize = new ResizeObserver(() => {
      if (plot.current && holder.current) plot.current.setSize({ width: Math.max(260, holder.current.clientWidth), height });
    });
    resize.observe(holder.current);
    return () => {
      resize.disconnect();
      plot.current.destroy();
      plot.current = null;
    };
  }, [series.map((s) => s.key).join(",")]);
  useEffect(() => {
    if (plot.current) plot.current.setData(columns());
  }, [updates]);
  return html`<figure class="chart" data-testid=${`chart-${title}`} data-points=${ring.length}>
    <figcaption>${title}</figcaption>
    <div ref=${holder}></div>
  </figure>`;
}
