// The models table: every model version of the repository index with its state, reason and settings, rendered
// as a virtual list (only the rows in view exist in the page, so 1,000 models scroll as fast as 10), a filter
// box, and a detail panel with the config and the load, unload and reload buttons.
import { html } from "./html.js";
import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import { api } from "./api.js";
import { bytes } from "./format.js";

const ROW_HEIGHT = 30;
const VIEW_ROWS = 16;
const OVERSCAN = 6;

function matches(row, needle) {
  if (!needle) return true;
  return [row.name, row.state, row.backend, row.reason].some((v) => v && String(v).toLowerCase().includes(needle));
}

export function ModelsView({ models, error, refresh, selected, select }) {
  const [filter, setFilter] = useState("");
  const [scrollTop, setScrollTop] = useState(0);
  const needle = filter.trim().toLowerCase();
  const rows = useMemo(() => (models || []).filter((r) => matches(r, needle)), [models, needle]);
  const first = Math.max(0, Math.floor(scrollTop / ROW_HEIGHT) - OVERSCAN);
  const last = Math.min(rows.length, first + VIEW_ROWS + 2 * OVERSCAN);
  const chosen = selected ? (models || []).find((r) => r.name === selected.name && r.version === selected.version) || selected : null;
  return html`<section class="models">
    <div class="toolbar">
      <input type="search" placeholder="Filter by name, state, backend or reason" value=${filter}
        data-testid="model-filter" onInput=${(e) => setFilter(e.currentTarget.value)} />
      <span data-testid="model-count">${rows.length} of ${(models || []).length} model versions</span>
      ${error ? html`<span class="error">${error}</span>` : null}
    </div>
    <div class="table" role="table" aria-label="Models">
      <div class="row head" role="row">
        <span>Model</span><span>Version</span><span>State</span><span>Reason</span><span>Backend</span>
        <span>Instances</span><span>Batching</span><span>Footprint</span>
      </div>
      <div class="body" data-testid="model-rows" style=${`height:${VIEW_ROWS * ROW_HEIGHT}px`}
        onScroll=${(e) => setScrollTop(e.currentTarget.scrollTop)}>
        <div style=${`height:${rows.length * ROW_HEIGHT}px;position:relative`}>
          ${rows.slice(first, last).map((row, i) => html`<div role="row" key=${row.name + "/" + row.version}
              class=${"row" + (chosen && chosen.name === row.name && chosen.version === row.version ? " chosen" : "")}
              data-model=${row.name} data-version=${row.version} data-state=${row.state}
              style=${`position:absolute;top:${(first + i) * ROW_HEIGHT}px;height:${ROW_HEIGHT}px`}
              onClick=${() => select(row)}>
            <span class="name" title=${row.name}>${row.name}</span><span>${row.version}</span>
            <span class=${"state " + row.state.toLowerCase()} data-testid="state">${row.state}</span>
            <span title=${row.reason}>${row.reason}</span><span>${row.backend || ""}</span>
            <span>${row.instances || ""}</span><span title=${row.batching}>${row.batching || ""}</span>
            <span title=${row.footprint_source || ""}>${bytes(row.footprint_bytes)}</span>
          </div>`)}
        </div>
      </div>
    </div>
    ${chosen ? html`<${ModelDetail} row=${chosen} refresh=${refresh} />` : html`<p class="hint">Choose a model to see its config and to load or unload it.</p>`}
  </section>`;
}

const ACTIONS = {
  load: { label: "Load", verb: "load", call: (name) => api.load(name) },
  unload: { label: "Unload", verb: "unload", call: (name) => api.unload(name) },
  reload: { label: "Reload", verb: "reload (load again from the repository)", call: (name) => api.load(name) },
};

function ModelDetail({ row, refresh }) {
  const [detail, setDetail] = useState(null);
  const [problem, setProblem] = useState("");
  const [pending, setPending] = useState(null); // the action waiting for its confirmation
  const [busy, setBusy] = useState("");
  const [outcome, setOutcome] = useState(null);
  const dialog = useRef(null);
  const ready = row.state === "READY";
  useEffect(() => setOutcome(null), [row.name, row.version]); // an action's outcome stays while its model changes state
  useEffect(() => {
    setDetail(null);
    setProblem("");
    if (!ready) return;
    api.model(row.name, row.version).then(setDetail, (e) => setProblem(e.message));
  }, [row.name, row.version, ready]);
  useEffect(() => {
    if (pending && dialog.current && !dialog.current.open) dialog.current.showModal();
  }, [pending]);
  async function run(action) {
    setPending(null);
    if (dialog.current && dialog.current.open) dialog.current.close();
    setBusy(action);
    setOutcome(null);
    try {
      await ACTIONS[action].call(row.name);
      setOutcome({ ok: true, text: `${ACTIONS[action].label} of '${row.name}' succeeded.` });
    } catch (e) {
      setOutcome({ ok: false, text: e.message });
    } finally {
      setBusy("");
      refresh();
    }
  }
  return html`<div class="detail" data-testid="model-detail">
    <h2>${row.name} <small>version ${row.version || "–"}</small></h2>
    <p>State <b data-testid="detail-state">${row.state}</b>${row.reason ? html` — ${row.reason}` : null}</p>
    <div class="buttons">
      ${Object.entries(ACTIONS).map(([key, action]) => html`<button data-testid=${"action-" + key} disabled=${!!busy}
          onClick=${() => setPending(key)}>${busy === key ? `${action.label}ing…` : action.label}</button>`)}
    </div>
    ${outcome ? html`<p class=${outcome.ok ? "ok" : "error"} data-testid="action-outcome">${outcome.text}</p>` : null}
    <dialog ref=${dialog} data-testid="confirm" onClose=${() => setPending(null)}>
      ${pending ? html`<p>Really ${ACTIONS[pending].verb} model <b>${row.name}</b>?</p>
        <div class="buttons">
          <button data-testid="confirm-yes" onClick=${() => run(pending)}>${ACTIONS[pending].label}</button>
          <button data-testid="confirm-no" onClick=${() => dialog.current.close()}>Cancel</button>
        </div>` : null}
    </dialog>
    ${problem ? html`<p class="error">${problem}</p>` : null}
    ${detail ? html`<details open><summary>Config (JSON, as /config returns it)</summary>
        <pre data-testid="config-json">${JSON.stringify(detail.config, null, 2)}</pre></details>`
      : ready ? null : html`<p class="hint">The config is shown while the model is loaded.</p>`}
  </div>`;
}
