// Memory: the budget of model orchestration, what each resident model holds, and recent evictions and cold starts.
import { html } from "./html.js";
import { bytes, clock, number } from "./format.js";

export function MemoryView({ live }) {
  const latest = live.latest;
  if (!latest) return html`<p class="hint">Waiting for the first update…</p>`;
  const memory = latest.memory;
  const budget = memory.budget_bytes;
  const share = budget ? Math.min(100, (memory.charged_bytes / budget) * 100) : 0;
  return html`<section class="memory">
    <div class="readouts">
      <div class="readout"><span>host budget</span><b data-testid="memory-budget">${budget ? bytes(budget) : "none"}</b></div>
      <div class="readout"><span>charged to models</span><b data-testid="memory-charged">${bytes(memory.charged_bytes)}</b></div>
      <div class="readout"><span>loads</span><b>${memory.loads_total}</b></div>
      <div class="readout"><span>cold starts</span><b data-testid="cold-starts">${memory.cold_starts_total}</b></div>
      <div class="readout"><span>evictions</span><b data-testid="evictions">${memory.evictions_total}</b></div>
      <div class="readout"><span>mean cold-start wait</span><b>${memory.cold_wait_count ? `${number(memory.cold_wait_seconds / memory.cold_wait_count, 2)} s` : "–"}</b></div>
    </div>
    ${budget ? html`<div class="bar" title=${`${number(share)}% of the budget`}><div style=${`width:${share}%`}></div></div>` : null}
    ${memory.orchestrated ? null : html`<p class="hint">Model orchestration is off: footprints are measured once a budget,
      loading on demand or idle unloads are turned on (see docs/orchestration.md).</p>`}
    <h2>Resident models</h2>
    <table class="plain" data-testid="resident"><thead><tr><th>Model</th><th>Footprint</th><th>Source</th></tr></thead>
      <tbody>${memory.resident.map((r) => html`<tr><td>${r.model}</td><td>${bytes(r.bytes)}</td><td>${r.source}</td></tr>`)}</tbody></table>
    <h2>Recent loads, cold starts and evictions <small>(seen while this page is open)</small></h2>
    <table class="plain" data-testid="events"><thead><tr><th>Time</th><th>Event</th><th>Model</th><th>Cause</th></tr></thead>
      <tbody>${memory.events.slice().reverse().map((e) => html`<tr class=${e.kind.replace(" ", "-")}><td>${clock(e.time)}</td><td>${e.kind}</td><td>${e.model}</td><td>${e.cause}</td></tr>`)}</tbody></table>
  </section>`;
}
