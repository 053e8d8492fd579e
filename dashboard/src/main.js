// The dashboard's shell: the views, one poll of the live figures (every second, or ?interval=MS), and the models
// list (every 3 s on the models view, every 15 s on the traffic, rollouts and try-it views, and after every action).
// The rollouts view polls the rollouts and the monitoring figures itself, at the live interval, while it is open.
import { render } from "preact";
import { useCallback, useEffect, useRef, useState } from "preact/hooks";
import { html } from "./html.js";
import { api } from "./api.js";
import { LiveSeries } from "./live.js";
import { ModelsView } from "./models.js";
import { TrafficView } from "./traffic.js";
import { MemoryView } from "./memory.js";
import { TryItView } from "./tryit.js";
import { ReportsView } from "./reports.js";
import { RolloutsView } from "./rollouts.js";
import { usePoll } from "./poll.js";

const VIEWS = [
  ["models", "Models"],
  ["traffic", "Live traffic"],
  ["memory", "Memory"],
  ["rollouts", "Rollouts"],
  ["tryit", "Try it"],
  ["reports", "Reports"],
];
const params = new URLSearchParams(location.search);
const INTERVAL_MS = Math.max(50, Number(params.get("interval")) || 1000);
// The models list costs the server a scan of the repository (as the index does: about 15 ms for 1,000 models
// here), so it is polled every 3 s on the models view, every 15 s where only the ready models are needed.
const MODELS_MS = 3000;
const READY_MODELS_MS = 15000;

function viewFromHash() {
  const name = location.hash.replace("#", "");
  return VIEWS.some(([key]) => key === name) ? name : "models";
}

function App() {
  const [view, setView] = useState(viewFromHash());
  const [models, setModels] = useState(null);
  const [modelsError, setModelsError] = useState("");
  const [selected, setSelected] = useState(null);
  const [updates, setUpdates] = useState(0);
  const [liveError, setLiveError] = useState("");
  const live = useRef(new LiveSeries()).current;
  useEffect(() => {
    const onHash = () => setView(viewFromHash());
    window.addEventListener("hashchange", onHash);
    return () => window.removeEventListener("hashchange", onHash);
  }, []);
  const refreshModels = useCallback(async (signal) => {
    try {
      const listing = await api.models(signal);
      setModels(listing.models);
      setModelsError("");
    } catch (e) {
      if (e.name !== "AbortError") setModelsError(e.message);
      throw e;
    }
  }, []);
  usePoll(refreshModels, view === "models" ? MODELS_MS : READY_MODELS_MS, view === "models" || view === "traffic" || view === "tryit" || view === "rollouts");
  usePoll(async (signal) => {
    try {
      live.push(await api.live(live.modelName, signal));
      setLiveError("");
      setUpdates((n) => n + 1);
    } catch (e) {
      if (e.name !== "AbortError") setLiveError(e.message);
      throw e;
    }
  }, INTERVAL_MS, true);
  const selectModel = (row) => {
    setSelected(row);
    if (row.state === "READY") live.selectModel(row.name);
  };
  return html`<div class="shell">
    <header>
      <h1>Nereid</h1>
      <nav>${VIEWS.map(([key, label]) => html`<a href=${"#" + key} class=${view === key ? "active" : ""} data-testid=${"tab-" + key}>${label}</a>`)}</nav>
      <span class=${liveError ? "status error" : "status"} data-testid="live-status" data-updates=${updates}>
        ${liveError ? `disconnected: ${liveError}` : `live · ${INTERVAL_MS >= 1000 ? `${INTERVAL_MS / 1000} s` : `${INTERVAL_MS} ms`}`}</span>
    </header>
    <main>
      ${view === "models" ? html`<${ModelsView} models=${models} error=${modelsError} refresh=${() => refreshModels().catch(() => {})} selected=${selected} select=${selectModel} />` : null}
      ${view === "traffic" ? html`<${TrafficView} live=${live} models=${models} updates=${updates} />` : null}
      ${view === "memory" ? html`<${MemoryView} live=${live} updates=${updates} />` : null}
      ${view === "rollouts" ? html`<${RolloutsView} models=${models} interval=${INTERVAL_MS} />` : null}
      ${view === "tryit" ? html`<${TryItView} models=${models} initial=${selected} />` : null}
      ${view === "reports" ? html`<${ReportsView} />` : null}
    </main>
  </div>`;
}

const root = document.getElementById("app");
root.textContent = ""; // the boot message goes; Preact renders into an empty element
render(html`<${App} />`, root);
