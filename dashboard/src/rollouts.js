// Rollouts: every rollout of the server (GET /v2/nereid/rollouts) with its state, its step, the primary's and the
// candidate's figures over the step's window side by side, the reason it stopped and its history as a timeline;
// the buttons of the rollout API, each enabled in the states that allow it (abort, promote and undo ask first); a
// form that starts a rollout; and the monitoring of every model version: drift per tensor and data quality.
import { html } from "./html.js";
import { useEffect, useRef, useState } from "preact/hooks";
import { api } from "./api.js";
import { clock, number } from "./format.js";
import { usePoll } from "./poll.js";

// What each state allows (src/nereid/rollouts/rollout.py): pause a running rollout, resume a paused one, abort or
// promote an open one, undo a promotion. Finished ones (rolled back, aborted) allow nothing: start a new one.
const ACTIONS = [
  { key: "pause", label: "Pause", states: ["running"] },
  { key: "resume", label: "Resume", states: ["paused"] },
  { key: "abort", label: "Abort", states: ["running", "paused"],
    ask: (r) => `Abort the rollout of ${r.model}? Version ${r.primary} keeps every request that names no version.` },
  { key: "promote", label: "Promote", states: ["running", "paused"],
    ask: (r) => `Promote version ${r.candidate} of ${r.model} now, skipping the gates still ahead? It takes every request that names no version.` },
  { key: "undo", label: "Undo", states: ["promoted"],
    ask: (r) => `Undo the promotion of version ${r.candidate} of ${r.model}? Version ${r.primary} takes full traffic again.` },
];
const OPEN = ["running", "paused"];
// docs/monitoring.md: a PSI above 0.1 is a shift worth a look, above 0.25 a large shift (the alerts' default).
export const PSI_WATCH = 0.1;
export const PSI_DRIFT = 0.25;
const DEFAULT_STEPS = "shadow=100%/60s,canary=10%/120s,canary=50%/120s";

function seconds(s) {
  if (s === undefined || s === null) return "–";
  return s >= 3600 ? `${number(s / 3600, 1)} h` : `${Math.floor(s)} s`;
}

function percent(rate) {
  return rate === undefined || rate === null ? "–" : `${number(rate * 100, 2)}%`;
}

export function RolloutsView({ models, interval }) {
  const [rollouts, setRollouts] = useState(null);
  const [histories, setHistories] = useState({});
  const [problem, setProblem] = useState("");
  const [monitoring, setMonitoring] = useState(null);
  const [monitoringProblem, setMonitoringProblem] = useState("");
  async function refresh(signal) {
    try {
      const listing = await api.rollouts(signal);
      const found = {};
      await Promise.all(listing.rollouts.map(async (r) => {
        found[r.model] = (await api.rolloutHistory(r.model, signal)).history;
      }));
      setRollouts(listing.rollouts);
      setHistories(found);
      setProblem("");
    } catch (e) {
      if (e.name === "AbortError") throw e;
      setProblem(e.message);
    }
    try {
      setMonitoring(await api.monitoring(signal));
      setMonitoringProblem("");
    } catch (e) {
      if (e.name === "AbortError") throw e;
      setMonitoringProblem(e.message);
    }
  }
  usePoll(refresh, interval, true);
  const again = () => refresh().catch(() => {});
  const shown = (rollouts || []).slice().sort((a, b) => (OPEN.includes(b.state) - OPEN.includes(a.state)) || a.model.localeCompare(b.model));
  return html`<section class="rollouts">
    <${StartForm} models=${models} started=${again} />
    ${problem ? html`<p class="error" data-testid="rollouts-error">${problem}</p>` : null}
    ${rollouts === null ? (problem ? null : html`<p class="hint">Reading the rollouts…</p>`)
      : shown.length ? shown.map((r) => html`<${Rollout} key=${r.model} rollout=${r} history=${histories[r.model] || []} changed=${again} />`)
      : html`<p class="hint" data-testid="no-rollouts">No rollout yet: start one above, or with <code>nereid rollout start MODEL VERSION --steps ...</code> (docs/rollouts.md).</p>`}
    <${Monitoring} monitoring=${monitoring} problem=${monitoringProblem} />
  </section>`;
}

function StartForm({ models, started }) {
  const ready = {};
  for (const row of models || []) {
    if (row.state === "READY" && row.version) (ready[row.name] = ready[row.name] || []).push(row.version);
  }
  const names = Object.keys(ready).filter((n) => ready[n].length >= 2).sort();
  const [model, setModel] = useState("");
  const [version, setVersion] = useState("");
  const [steps, setSteps] = useState(DEFAULT_STEPS);
  const [sticky, setSticky] = useState("");
  const [busy, setBusy] = useState(false);
  const [outcome, setOutcome] = useState(null);
  const chosen = model || names[0] || "";
  const versions = (ready[chosen] || []).slice().sort((a, b) => Number(a) - Number(b));
  const candidate = versions.includes(version) ? version : versions[versions.length - 1] || "";
  async function submit(event) {
    event.preventDefault();
    setBusy(true);
    setOutcome(null);
    try {
      const status = await api.startRollout(chosen, { version: candidate, steps, sticky_key: sticky });
      setOutcome({ ok: true, text: `Rollout of ${status.model} started: version ${status.candidate} against ${status.primary}.` });
    } catch (e) {
      setOutcome({ ok: false, text: e.message });
    } finally {
      setBusy(false);
      started();
    }
  }
  return html`<details class="start" open=${names.length > 0}>
    <summary>Start a rollout</summary>
    <form class="start-rollout" data-testid="start-rollout" onSubmit=${submit}>
      <label>Model <select data-testid="start-model" value=${chosen} onChange=${(e) => { setModel(e.currentTarget.value); setVersion(""); }}>
        ${names.length ? names.map((n) => html`<option value=${n}>${n}</option>`) : html`<option value="">(no model with two ready versions)</option>`}
      </select></label>
      <label>Candidate version <select data-testid="start-version" value=${candidate} onChange=${(e) => setVersion(e.currentTarget.value)}>
        ${versions.map((v) => html`<option value=${v}>${v}</option>`)}
      </select></label>
      <label class="wide">Steps <input data-testid="start-steps" value=${steps} onInput=${(e) => setSteps(e.currentTarget.value)}
        title="kind=percent/duration[:min_requests], comma-separated: shadow copies requests to the candidate, canary lets it answer them" /></label>
      <label>Sticky key <input data-testid="start-sticky" value=${sticky} placeholder="(none)" onInput=${(e) => setSticky(e.currentTarget.value)}
        title="a request parameter or forwarded header: the same value always meets the same version" /></label>
      <button type="submit" data-testid="start-send" disabled=${busy || !chosen}>${busy ? "Starting…" : "Start"}</button>
    </form>
    ${outcome ? html`<p class=${outcome.ok ? "ok" : "error"} data-testid="start-outcome">${outcome.text}</p>` : null}
  </details>`;
}

function Bar({ done, of, label }) {
  const share = of > 0 ? Math.min(100, (done / of) * 100) : 100;
  return html`<div class="progress"><span>${label}</span><div class="bar"><div style=${`width:${share}%`}></div></div></div>`;
}

function Rollout({ rollout: r, history, changed }) {
  const [pending, setPending] = useState(null);
  const [busy, setBusy] = useState("");
  const [outcome, setOutcome] = useState(null);
  const dialog = useRef(null);
  const open = OPEN.includes(r.state);
  const steps = r.steps ? r.steps.split(",") : [];
  const step = r.current_step || {};
  const primary = (r.versions || {})[r.primary] || {};
  const candidate = (r.versions || {})[r.candidate] || {};
  useEffect(() => {
    if (pending && dialog.current && !dialog.current.open) dialog.current.showModal();
  }, [pending]);
  async function run(key) {
    setPending(null);
    if (dialog.current && dialog.current.open) dialog.current.close();
    setBusy(key);
    setOutcome(null);
    try {
      const status = await api.rolloutAction(r.model, key);
      setOutcome({ ok: true, text: `${ACTIONS.find((a) => a.key === key).label}: the rollout of ${r.model} is now ${status.state.replace(/_/g, " ")}.` });
    } catch (e) {
      setOutcome({ ok: false, text: e.message });
    } finally {
      setBusy("");
      changed();
    }
  }
  const action = pending ? ACTIONS.find((a) => a.key === pending) : null;
  const rows = [
    ["requests", (v) => v.requests ?? "–"],
    ["errors", (v) => v.errors ?? "–"],
    ["error rate", (v) => percent(v.error_rate), "error_rate"],
    ["p99 latency", (v) => (v.requests ? `${number(v.p99_ms, 2)} ms` : "–"), "p99_ms"],
    ["mean latency", (v) => (v.requests ? `${number(v.mean_ms, 2)} ms` : "–")],
    ["CPU per request", (v) => (v.cpu_ms_per_request ? `${number(v.cpu_ms_per_request, 2)} ms` : "–"), "cpu_ms_per_request"],
    ["shadow comparisons", (v) => v.shadow_comparisons ?? "–"],
    ["divergence", (v) => (v.shadow_comparisons ? number(v.divergence, 4) : "–")],
  ];
  return html`<article class=${"rollout " + r.state} data-testid="rollout" data-model=${r.model} data-state=${r.state}>
    <h2>${r.model} <small>version ${r.candidate} against ${r.primary}</small>
      <span class=${"badge " + r.state} data-testid="rollout-state">${r.state.replace(/_/g, " ")}</span></h2>
    <ol class="steps" data-testid="rollout-steps">
      ${steps.map((s, i) => html`<li class=${i < r.step || r.state === "promoted" ? "done" : i === r.step ? (open ? "current" : "stopped") : ""}><small>${i}</small> ${s}</li>`)}
    </ol>
    <p data-testid="rollout-step">Step <b>${r.step}</b> (${r.step + 1} of ${steps.length}): ${step.kind} ${number(step.percent, step.percent % 1 ? 1 : 0)}%${" · "}
      ${open ? html`<b>${seconds(step.elapsed_seconds)}</b> of ${seconds(step.seconds)}` : `${seconds(step.seconds)} long`}${" · "}
      at least ${step.min_requests} candidate requests${r.sticky_key ? html`${" · "}sticky key <code>${r.sticky_key}</code>` : null}</p>
    ${open ? html`<div class="progresses">
      <${Bar} done=${step.elapsed_seconds} of=${step.seconds} label="duration" />
      <${Bar} done=${candidate.requests || 0} of=${step.min_requests} label="candidate requests" />
    </div>` : null}
    ${r.reason ? html`<p class=${"reason " + r.state} data-testid="rollout-reason">${r.reason}</p>` : null}
    <table class="plain figures" data-testid="rollout-figures">
      <thead><tr><th>${open ? "this step's window" : "the last step's window"}</th>
        <th>primary <small>version ${r.primary}</small></th><th>candidate <small>version ${r.candidate}</small></th></tr></thead>
      <tbody>${rows.map(([label, show, key]) => html`<tr data-figure=${label}>
        <td>${label}</td><td data-testid="primary">${show(primary)}</td>
        <td data-testid="candidate" class=${key && candidate.requests && primary.requests !== undefined && candidate[key] > primary[key] ? "worse" : ""}>${show(candidate)}</td></tr>`)}</tbody>
    </table>
    <div class="buttons">
      ${ACTIONS.map((a) => html`<button data-testid=${"rollout-" + a.key} disabled=${!!busy || !a.states.includes(r.state)}
          title=${a.states.includes(r.state) ? "" : `only for a rollout that is ${a.states.join(" or ")}`}
          onClick=${() => (a.ask ? setPending(a.key) : run(a.key))}>${busy === a.key ? `${a.label}…` : a.label}</button>`)}
    </div>
    ${outcome ? html`<p class=${outcome.ok ? "ok" : "error"} data-testid="rollout-outcome">${outcome.text}</p>` : null}
    <dialog ref=${dialog} data-testid="rollout-confirm" onClose=${() => setPending(null)}>
      ${action ? html`<p>${action.ask(r)}</p>
        <div class="buttons">
          <button data-testid="confirm-yes" onClick=${() => run(action.key)}>${action.label}</button>
          <button data-testid="confirm-no" onClick=${() => dialog.current.close()}>Cancel</button>
        </div>` : null}
    </dialog>
    <details open>
      <summary>History</summary>
      <ol class="timeline" data-testid="rollout-history">
        ${history.map((e) => html`<li class=${"event " + e.event.replace(/ /g, "-")}><time>${clock(e.at)}</time> <b>${e.event}</b>${e.detail ? html` <span>${e.detail}</span>` : null}</li>`)}
      </ol>
    </details>
  </article>`;
}

// The reference's source: a file (shown by its model/version/file tail), a version (a candidate borrows its
// primary's) or the first sampled requests; none yet while those are being collected.
function reference(source) {
  if (!source) return "collecting from traffic…";
  return source.includes("/") ? `…/${source.split("/").slice(-3).join("/")}` : source;
}

function level(psi) {
  if (psi > PSI_DRIFT) return "drift";
  if (psi > PSI_WATCH) return "watch";
  return "calm";
}

function Monitoring({ monitoring, problem }) {
  if (problem) return html`<h2>Monitoring</h2><p class="error">${problem}</p>`;
  if (!monitoring) return null;
  const rows = [];
  for (const v of monitoring.versions) {
    const quality = {};
    for (const q of v.quality) (quality[q.tensor] = quality[q.tensor] || []).push(q);
    const tensors = v.tensors.map((t) => ({ ...t, key: `${t.direction === "input" ? "in" : "out"}:${t.name}` }));
    for (const name of Object.keys(quality)) {
      if (!tensors.some((t) => t.key === name)) {
        tensors.push({ key: name, name: name.slice(name.indexOf(":") + 1), direction: name.startsWith("in:") ? "input" : "output" });
      }
    }
    if (!tensors.length) tensors.push({ key: "", name: "", direction: "" });
    tensors.forEach((t, i) => rows.push({ v, t, first: i === 0, span: tensors.length, issues: quality[t.key] || [] }));
  }
  return html`<div class="monitoring">
    <h2>Monitoring <small>drift of each version's traffic against its reference over the last ${seconds(monitoring.window_seconds)};
      PSI above ${PSI_WATCH} is worth a look, above ${PSI_DRIFT} a large shift (docs/monitoring.md)</small></h2>
    ${monitoring.active ? html`<p class="hint">${monitoring.sampled} requests sampled (up to ${monitoring.samples_per_second} a second), ${monitoring.dropped} dropped by a full queue.</p>`
      : html`<p class="hint" data-testid="monitoring-off">Monitoring is off: start the server with <code>--monitoring-samples-per-second</code> above 0.</p>`}
    ${rows.length ? html`<table class="plain monitoring-table" data-testid="monitoring">
      <thead><tr><th>Model</th><th>Version</th><th>Reference</th><th>Tensor</th><th>PSI</th><th>KS</th><th>Rows in window</th><th>Data-quality issues</th></tr></thead>
      <tbody>${rows.map(({ v, t, first, span, issues }) => html`<tr data-model=${v.model} data-version=${v.version} data-tensor=${t.key}>
        ${first ? html`<td rowspan=${span}>${v.model}</td><td rowspan=${span}>${v.version}</td>
          <td rowspan=${span} class="reference" title=${v.reference}>${reference(v.reference)}</td>` : null}
        <td>${t.name ? html`<small>${t.direction === "input" ? "in" : "out"}</small> ${t.name}` : "–"}</td>
        ${t.psi === undefined ? html`<td>–</td><td>–</td><td>–</td>`
          : html`<td class=${"psi " + level(t.psi)} data-testid="psi" data-level=${level(t.psi)} title=${`worst feature: ${t.feature}`}>
              ${number(t.psi, 3)}${level(t.psi) === "drift" ? " drift" : level(t.psi) === "watch" ? " watch" : ""}</td>
            <td>${number(t.ks, 3)}</td><td>${t.samples}</td>`}
        <td data-testid="quality">${issues.length ? issues.map((q) => html`<span class="issue">${q.issue.replace(/_/g, " ")} ${q.count}</span> `) : "none"}</td>
      </tr>`)}</tbody>
    </table>` : monitoring.active ? html`<p class="hint" data-testid="monitoring-empty">No model version has been sampled yet.</p>` : null}
  </div>`;
}
