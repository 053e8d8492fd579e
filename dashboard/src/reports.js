// Reports: the `nereid analyze` runs found under --dashboard-reports-dir, each with its charts and its full report.
import { html } from "./html.js";
import { useEffect, useState } from "preact/hooks";
import { api } from "./api.js";
import { clock } from "./format.js";

const fileUrl = (path) => `/dashboard/reports/${path.split("/").map(encodeURIComponent).join("/")}`;

export function ReportsView() {
  const [listing, setListing] = useState(null);
  const [problem, setProblem] = useState("");
  const [open, setOpen] = useState(null);
  useEffect(() => {
    api.reports().then((l) => {
      setListing(l);
      if (l.reports.length) setOpen(l.reports[0].html);
    }, (e) => setProblem(e.message));
  }, []);
  if (problem) return html`<p class="error">${problem}</p>`;
  if (!listing) return html`<p class="hint">Looking for reports…</p>`;
  if (!listing.folder) return html`<p class="hint" data-testid="no-reports">No reports folder is configured: start the server with
    <code>--dashboard-reports-dir=PATH</code> and write reports there with <code>nereid analyze --output-dir PATH/RUN</code>.</p>`;
  if (!listing.reports.length) return html`<p class="hint" data-testid="no-reports">No report.html under the reports folder yet.</p>`;
  const report = listing.reports.find((r) => r.html === open) || listing.reports[0];
  return html`<section class="reports">
    <ul class="report-list" data-testid="report-list">
      ${listing.reports.map((r) => html`<li class=${r === report ? "chosen" : ""}><a href="#" onClick=${(e) => { e.preventDefault(); setOpen(r.html); }}>
        ${r.name}</a> <small>${r.model ? `${r.model} · ` : ""}${clock(r.modified)}</small></li>`)}
    </ul>
    <div class="report" data-testid="report">
      <h2>${report.name} ${report.model ? html`<small>model ${report.model}</small>` : null}</h2>
      ${report.best ? html`<p>Best: ${Object.entries(report.best).map(([k, v]) => html`<span class="best">${k}: <b>${v}</b></span> `)}</p>` : null}
      <div class="report-charts">${report.charts.map((c) => html`<img src=${fileUrl(c)} alt=${c} />`)}</div>
      <p><a href=${fileUrl(report.html)} target="_blank" rel="noopener">Open the full report</a>
        ${report.json ? html` · <a href=${fileUrl(report.json)} target="_blank" rel="noopener">results.json</a>` : null}</p>
      <iframe title="report" sandbox="" src=${fileUrl(report.html)}></iframe>
    </div>
  </section>`;
}
