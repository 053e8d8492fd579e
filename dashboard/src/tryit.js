// Try it: a form built from a model's metadata that sends one inference and shows its outputs (text for BYTES,
// a table for small tensors, an image for image-shaped outputs), or, for an LLM, a chat box streaming its reply.
import { html } from "./html.js";
import { useEffect, useRef, useState } from "preact/hooks";
import { api, streamChat } from "./api.js";

const MAX_TABLE = 1024;

function concreteShape(shape) {
  return shape.map((d) => (d < 0 ? 1 : d));
}

function elements(shape) {
  return shape.reduce((a, b) => a * b, 1);
}

function initialValue(input) {
  const n = Math.min(elements(concreteShape(input.shape)), 64);
  if (input.datatype === "BYTES") return "hello";
  if (input.datatype === "BOOL") return Array.from({ length: n }, () => "true").join(", ");
  return Array.from({ length: n }, (_, i) => String(i + 1)).join(", ");
}

function parseValues(input, text, count) {
  if (input.datatype === "BYTES") {
    const lines = text.split("\n");
    return count === 1 ? [text] : lines;
  }
  const items = text.split(/[\s,]+/).filter(Boolean);
  if (input.datatype === "BOOL") return items.map((v) => v === "true" || v === "1");
  return items.map((v) => {
    const n = Number(v);
    if (Number.isNaN(n)) throw new Error(`input '${input.name}': '${v}' is not a number`);
    return n;
  });
}

function imageShape(output) {
  let shape = output.shape.slice();
  while (shape.length > 3 && shape[0] === 1) shape = shape.slice(1);
  if (output.datatype === "BYTES" || shape.length < 2) return null;
  if (shape.length === 3 && [1, 3, 4].includes(shape[2]) && shape[0] >= 8 && shape[1] >= 8) return { h: shape[0], w: shape[1], c: shape[2], planar: false };
  if (shape.length === 3 && [1, 3].includes(shape[0]) && shape[1] >= 8 && shape[2] >= 8) return { h: shape[1], w: shape[2], c: shape[0], planar: true };
  if (shape.length === 2 && shape[0] >= 16 && shape[1] >= 16) return { h: shape[0], w: shape[1], c: 1, planar: false };
  return null;
}

function imageUrl(output, geometry) {
  const { h, w, c, planar } = geometry;
  const data = output.data;
  const max = data.reduce((m, v) => Math.max(m, v), 0);
  const scale = max <= 1 ? 255 : 1;
  const canvas = document.createElement("canvas");
  canvas.width = w;
  canvas.height = h;
  const context = canvas.getContext("2d");
  const image = context.createImageData(w, h);
  for (let y = 0; y < h; y += 1) {
    for (let x = 0; x < w; x += 1) {
      const pixel = y * w + x;
      const at = (channel) => data[planar ? channel * h * w + pixel : pixel * c + channel] * scale;
      const r = at(0);
      image.data[pixel * 4] = r;
      image.data[pixel * 4 + 1] = c >= 3 ? at(1) : r;
      image.data[pixel * 4 + 2] = c >= 3 ? at(2) : r;
      image.data[pixel * 4 + 3] = c === 4 ? at(3) : 255;
    }
  }
  context.putImageData(image, 0, 0);
  return canvas.toDataURL();
}

function OutputView({ output }) {
  const shape = output.shape;
  const data = output.data || [];
  const testid = `output-${output.name}`;
  if (output.datatype === "BYTES") {
    return html`<div class="output" data-testid=${testid}><h3>${output.name} <small>BYTES ${JSON.stringify(shape)}</small></h3>
      ${data.map((v) => html`<pre class="text">${String(v)}</pre>`)}</div>`;
  }
  const geometry = imageShape(output);
  if (geometry) {
    return html`<div class="output" data-testid=${testid}><h3>${output.name} <small>${output.datatype} ${JSON.stringify(shape)}, shown as an image</small></h3>
      <img alt=${output.name} src=${imageUrl(output, geometry)} style=${`width:${Math.min(384, geometry.w * 4)}px;image-rendering:pixelated`} /></div>`;
  }
  const width = shape.length >= 2 ? shape[shape.length - 1] : data.length;
  const shown = data.slice(0, MAX_TABLE);
  const rows = [];
  for (let i = 0; i < shown.length; i += Math.max(width, 1)) rows.push(shown.slice(i, i + Math.max(width, 1)));
  return html`<div class="output" data-testid=${testid}><h3>${output.name} <small>${output.datatype} ${JSON.stringify(shape)}</small></h3>
    <table class="plain tensor"><tbody>${rows.map((r) => html`<tr>${r.map((v) => html`<td>${typeof v === "number" ? +v.toPrecision(6) : String(v)}</td>`)}</tr>`)}</tbody></table>
    ${data.length > MAX_TABLE ? html`<p class="hint">First ${MAX_TABLE} of ${data.length} values.</p>` : null}</div>`;
}

// Mounted afresh for each model (the caller keys it by name), so the starting values exist at the first render:
// set in an effect instead, they would land after the first paint and overwrite what a quick user already typed.
function InferForm({ name, version, metadata }) {
  const [values, setValues] = useState(() => Object.fromEntries(metadata.inputs.map((i) => [i.name, initialValue(i)])));
  const [shapes, setShapes] = useState(() => Object.fromEntries(metadata.inputs.map((i) => [i.name, concreteShape(i.shape).join(", ")])));
  const [result, setResult] = useState(null);
  const [problem, setProblem] = useState("");
  const [busy, setBusy] = useState(false);
  async function send(event) {
    event.preventDefault();
    setBusy(true);
    setProblem("");
    setResult(null);
    try {
      const inputs = metadata.inputs.map((input) => {
        const shape = (shapes[input.name] || "").split(/[\s,]+/).filter(Boolean).map(Number);
        return { name: input.name, datatype: input.datatype, shape, data: parseValues(input, values[input.name] || "", elements(shape)) };
      });
      setResult(await api.infer(name, version, { inputs }));
    } catch (e) {
      setProblem(e.message);
    } finally {
      setBusy(false);
    }
  }
  return html`<form class="infer" onSubmit=${send} data-testid="infer-form">
    ${metadata.inputs.map((input) => html`<fieldset>
      <legend>${input.name} <small>${input.datatype} ${JSON.stringify(input.shape)}</small></legend>
      <label>shape <input class="shape" data-testid=${`shape-${input.name}`} value=${shapes[input.name] || ""}
        onInput=${(e) => setShapes({ ...shapes, [input.name]: e.currentTarget.value })} /></label>
      <textarea rows="2" data-testid=${`input-${input.name}`} value=${values[input.name] || ""}
        placeholder=${input.datatype === "BYTES" ? "one string per line" : "numbers separated by commas or spaces"}
        onInput=${(e) => setValues({ ...values, [input.name]: e.currentTarget.value })}></textarea>
    </fieldset>`)}
    <button type="submit" data-testid="infer-send" disabled=${busy}>${busy ? "Sending…" : "Send one inference"}</button>
    ${problem ? html`<p class="error" data-testid="infer-error">${problem}</p>` : null}
    ${result ? html`<div data-testid="infer-result">${(result.outputs || []).map((o) => html`<${OutputView} output=${o} />`)}</div>` : null}
  </form>`;
}

function ChatBox({ name }) {
  const [messages, setMessages] = useState([]);
  const [draft, setDraft] = useState("Tell me a story");
  const [streaming, setStreaming] = useState(false);
  const [problem, setProblem] = useState("");
  const abort = useRef(null);
  useEffect(() => () => abort.current && abort.current.abort(), []);
  async function send(event) {
    event.preventDefault();
    if (!draft.trim() || streaming) return;
    const history = [...messages, { role: "user", content: draft }];
    setMessages([...history, { role: "assistant", content: "" }]);
    setDraft("");
    setProblem("");
    setStreaming(true);
    abort.current = new AbortController();
    let reply = "";
    try {
      await streamChat(name, history, (piece) => {
        reply += piece;
        setMessages([...history, { role: "assistant", content: reply }]);
      }, abort.current.signal);
    } catch (e) {
      if (e.name !== "AbortError") setProblem(e.message);
    } finally {
      setStreaming(false);
    }
  }
  return html`<form class="chat" onSubmit=${send} data-testid="chat">
    <div class="messages" data-testid="chat-messages">
      ${messages.map((m) => html`<div class=${"message " + m.role} data-role=${m.role}><b>${m.role}</b> <span>${m.content}</span></div>`)}
    </div>
    <div class="compose">
      <input data-testid="chat-input" value=${draft} onInput=${(e) => setDraft(e.currentTarget.value)} placeholder="Message" />
      <button type="submit" data-testid="chat-send" disabled=${streaming}>${streaming ? "Streaming…" : "Send"}</button>
      ${streaming ? html`<button type="button" onClick=${() => abort.current.abort()}>Stop</button>` : null}
    </div>
    ${problem ? html`<p class="error" data-testid="chat-error">${problem}</p>` : null}
    <p class="hint">Streams from <code>/v1/chat/completions</code> (the OpenAI-compatible API), 64 tokens at most.</p>
  </form>`;
}

export function TryItView({ models, initial }) {
  const ready = (models || []).filter((r) => r.state === "READY");
  const [choice, setChoice] = useState(initial && initial.state === "READY" ? initial.name : "");
  const [metadata, setMetadata] = useState(null);
  const [problem, setProblem] = useState("");
  const row = ready.find((r) => r.name === choice);
  useEffect(() => {
    setMetadata(null);
    setProblem("");
    if (!choice || (row && row.llm)) return;
    api.metadata(choice, "").then(setMetadata, (e) => setProblem(e.message));
  }, [choice, row && row.llm]);
  return html`<section class="tryit">
    <label>Model <select data-testid="tryit-model" value=${choice} onChange=${(e) => setChoice(e.currentTarget.value)}>
      <option value="">(choose a ready model)</option>
      ${[...new Set(ready.map((r) => r.name))].map((n) => html`<option value=${n}>${n}</option>`)}
    </select></label>
    ${problem ? html`<p class="error">${problem}</p>` : null}
    ${row && row.llm ? html`<${ChatBox} name=${choice} />` : null}
    ${metadata && metadata.name === choice && !(row && row.llm) ? html`<${InferForm} key=${choice} name=${choice} version="" metadata=${metadata} />` : null}
  </section>`;
}
