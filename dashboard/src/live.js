// The live figures: each snapshot of /dashboard/api/live holds cumulative counters; the difference of two
// consecutive snapshots, divided by the time between them, gives the rates the charts draw. The buffers have a
// fixed length, so a page left open for hours holds the same memory as one opened a minute ago.

export const CAPACITY = 120; // points per chart: two minutes at one update a second

const STAGES = ["queue", "compute_input", "compute_infer", "compute_output"];
const NS_KEYS = { queue: "queue_ns", compute_input: "input_ns", compute_infer: "infer_ns", compute_output: "output_ns" };

class Ring {
  constructor(names) {
    this.names = names;
    this.columns = names.map(() => []);
  }

  push(values) {
    for (let i = 0; i < this.columns.length; i += 1) {
      const column = this.columns[i];
      column.push(values[i] ?? null);
      if (column.length > CAPACITY) column.shift();
    }
  }

  clear() {
    for (const column of this.columns) column.length = 0;
  }

  get length() {
    return this.columns[0].length;
  }

  last(name) {
    const column = this.columns[this.names.indexOf(name)];
    return column.length ? column[column.length - 1] : null;
  }
}

function rate(now, before, key, dt) {
  return Math.max(0, (now[key] - before[key]) / dt);
}

function perRequestMicros(now, before, key) {
  const requests = now.success - before.success;
  return requests > 0 ? (now[key] - before[key]) / requests / 1000 : null;
}

export class LiveSeries {
  constructor() {
    this.server = new Ring(["t", "rps", "fps", "pending", "batch", ...STAGES.map((s) => `${s}_mean`)]);
    this.process = new Ring(["t", "cpu", "rss"]);
    this.model = new Ring([
      "t", "rps", "fps", "pending", "batch",
      ...STAGES.map((s) => `${s}_mean`),
      ...STAGES.flatMap((s) => [`${s}_p50`, `${s}_p99`]),
      "tokens", "ttft", "running", "waiting",
    ]);
    this.modelName = "";
    this.previous = null;
    this.latest = null;
    this.updates = 0;
  }

  selectModel(name) {
    if (name === this.modelName) return;
    this.modelName = name;
    this.model.clear();
  }

  push(snapshot) {
    const before = this.previous;
    this.previous = snapshot;
    this.latest = snapshot;
    this.updates += 1;
    if (!before) return;
    const dt = snapshot.time - before.time;
    if (!(dt > 0)) return;
    const t = snapshot.time;
    this.server.push(this.counters(t, snapshot.server, before.server, dt));
    const p = snapshot.process;
    const q = before.process;
    const cpu = ((p.cpu_seconds - q.cpu_seconds) + (p.workers_cpu_seconds - q.workers_cpu_seconds)) / dt * 100;
    this.process.push([t, Math.max(0, cpu), (p.rss_bytes + p.workers_rss_bytes) / 1048576]);
    const m = snapshot.model;
    const n = before.model;
    if (m && n && m.name === this.modelName && n.name === m.name) {
      const quantiles = m.quantiles_us || {};
      const llm = m.llm;
      const oldLlm = n.llm;
      let tokens = null;
      let ttft = null;
      if (llm && oldLlm) {
        tokens = Math.max(0, (llm.generation_tokens - oldLlm.generation_tokens) / dt);
        const count = llm.ttft_count - oldLlm.ttft_count;
        ttft = count > 0 ? ((llm.ttft_sum - oldLlm.ttft_sum) / count) * 1000 : null;
      }
      this.model.push([
        ...this.counters(t, m, n, dt),
        ...STAGES.flatMap((s) => [quantiles[s] ? quantiles[s].p50 : null, quantiles[s] ? quantiles[s].p99 : null]),
        tokens, ttft, llm ? llm.running : null, llm ? llm.waiting : null,
      ]);
    }
  }

  counters(t, now, before, dt) {
    const executions = now.executions - before.executions;
    return [
      t,
      rate(now, before, "success", dt),
      rate(now, before, "fail", dt),
      now.pending,
      executions > 0 ? (now.inferences - before.inferences) / executions : null,
      ...STAGES.map((s) => perRequestMicros(now, before, NS_KEYS[s])),
    ];
  }
}
