// Live traffic for the server and one chosen model: requests and failures per second, latency by stage,
// batch sizes and queue depth, the process's CPU and memory, GPUs where present, and an LLM's engine figures.
import { html } from "./html.js";
import { Chart } from "./chart.js";
import { bytes, micros, number } from "./format.js";

const MEANS = [
  { key: "queue_mean", label: "queue" },
  { key: "compute_input_mean", label: "compute input" },
  { key: "compute_infer_mean", label: "infer" },
  { key: "compute_output_mean", label: "output" },
];
const QUANTILES = ["queue", "compute_input", "compute_infer", "compute_output"].flatMap((s, i) => [
  { key: `${s}_p50`, label: `${MEANS[i].label} p50` },
  { key: `${s}_p99`, label: `${MEANS[i].label} p99`, dash: [4, 3] },
]);
const RATES = [{ key: "rps", label: "requests/s" }, { key: "fps", label: "failures/s", color: "#dc2626" }];
const BATCHING = [{ key: "batch", label: "mean batch size" }, { key: "pending", label: "queue depth", color: "#d97706" }];

function Readout({ id, label, value }) {
  return html`<div class="readout"><span>${label}</span><b data-testid=${id}>${value}</b></div>`;
}

// The share of the paged KV cache's blocks that running sequences hold (cached prefixes nobody uses count as free).
function kvUsed(llm) {
  const total = llm.kv_blocks_used + llm.kv_blocks_free;
  return total ? `${number((llm.kv_blocks_used / total) * 100, 1)}% of ${number(total, 0)} blocks` : "–";
}

export function TrafficView({ live, models, updates }) {
  const latest = live.latest;
  const server = live.server;
  const model = live.model;
  const ready = (models || []).filter((r) => r.state === "READY");
  const names = [...new Set(ready.map((r) => r.name))];
  const chosen = ready.find((r) => r.name === live.modelName);
  const hasQuantiles = latest && latest.model && latest.model.quantiles_us;
  const llm = latest && latest.model && latest.model.llm;
  const process = latest ? latest.process : null;
  return html`<section class="traffic">
    <div class="readouts">
      <${Readout} id="server-rps" label="server requests/s" value=${number(server.last("rps"))} />
      <${Readout} id="server-fps" label="failures/s" value=${number(server.last("fps"))} />
      <${Readout} id="server-pending" label="queued" value=${number(server.last("pending"), 0)} />
      <${Readout} id="server-cpu" label="CPU (% of a core)" value=${number(live.process.last("cpu"))} />
      <${Readout} id="server-rss" label="RSS (server + workers)" value=${process ? bytes(process.rss_bytes + process.workers_rss_bytes) : "–"} />
      <${Readout} id="models-ready" label="models ready" value=${latest ? latest.server.models_ready : "–"} />
    </div>
    ${process && process.gpus.length ? html`<div class="readouts">${process.gpus.map((g) => html`<${Readout}
        id=${"gpu-" + g.index} label=${`GPU ${g.index}`} value=${`${number(g.utilization * 100, 0)}% · ${bytes(g.used_bytes)} of ${bytes(g.total_bytes)}`} />`)}</div>` : null}
    <div class="charts">
      <${Chart} title="server requests" ring=${server} series=${RATES} updates=${updates} unit="/s" />
      <${Chart} title="server latency (mean per request)" ring=${server} series=${MEANS} updates=${updates} unit="µs" />
      <${Chart} title="server batching" ring=${server} series=${BATCHING} updates=${updates} />
      <${Chart} title="process" ring=${live.process} series=${[{ key: "cpu", label: "CPU % of a core" }]} updates=${updates} unit="%" />
    </div>
    <h2>Model
      <select data-testid="traffic-model" value=${live.modelName} onChange=${(e) => live.selectModel(e.currentTarget.value)}>
        <option value="">(choose a ready model)</option>
        ${names.map((n) => html`<option value=${n}>${n}</option>`)}
      </select>
    </h2>
    ${live.modelName && chosen ? html`<div>
      <div class="readouts">
        <${Readout} id="model-rps" label="requests/s" value=${number(model.last("rps"))} />
        <${Readout} id="model-fps" label="failures/s" value=${number(model.last("fps"))} />
        <${Readout} id="model-batch" label="mean batch size" value=${number(model.last("batch"), 2)} />
        <${Readout} id="model-pending" label="queue depth" value=${number(model.last("pending"), 0)} />
        <${Readout} id="model-infer" label="infer (mean)" value=${micros(model.last("compute_infer_mean"))} />
        ${hasQuantiles ? html`<${Readout} id="model-p99" label="infer p99" value=${micros(model.last("compute_infer_p99"))} />` : null}
      </div>
      ${llm ? html`<div class="readouts">
        <${Readout} id="llm-kv" label="KV cache used" value=${kvUsed(llm)} />
        <${Readout} id="llm-prefix-hits" label="prefix cache hits" value=${llm.prefix_cache_queries ? `${number((llm.prefix_cache_hits / llm.prefix_cache_queries) * 100, 1)}%` : "–"} />
        <${Readout} id="llm-preemptions" label="preemptions" value=${number(llm.preemptions, 0)} />
        <${Readout} id="llm-refused" label="refused (queue full)" value=${number(llm.refused, 0)} />
      </div>` : null}
      ${latest && latest.model && Object.keys(latest.model.batches).length ? html`<p class="batches" data-testid="batch-sizes">Executions by batch size:
        ${Object.entries(latest.model.batches).map(([size, count]) => html` <span>${size}: ${count}</span>`)}</p>` : null}
      <div class="charts">
        <${Chart} title="model requests" ring=${model} series=${RATES} updates=${updates} unit="/s" />
        ${hasQuantiles
          ? html`<${Chart} title="model latency p50 / p99" ring=${model} series=${QUANTILES} updates=${updates} unit="µs" />`
          : html`<${Chart} title="model latency (mean per request)" ring=${model} series=${MEANS} updates=${updates} unit="µs" />`}
        <${Chart} title="model batching" ring=${model} series=${BATCHING} updates=${updates} />
        ${llm ? html`<${Chart} title="LLM tokens" ring=${model} series=${[{ key: "tokens", label: "tokens/s" }]} updates=${updates} unit="/s" />
          <${Chart} title="LLM sequences" ring=${model} series=${[{ key: "running", label: "running" }, { key: "waiting", label: "waiting", color: "#d97706" }, { key: "ttft", label: "TTFT ms", color: "#7c3aed" }]} updates=${updates} />` : null}
      </div>
      ${hasQuantiles ? null : html`<p class="hint">Percentiles (p50, p99) need the latency summaries: start the server with
        <code>--metrics-config summary_latencies=true</code>. Without them the chart shows each stage's mean.</p>`}
    </div>` : null}
  </section>`;
}
