// Talking to the server: the dashboard's own read-only JSON, and the ordinary repository, rollout, inference and
// OpenAI APIs for what the page does. Every error carries the server's own message.

export class ServerError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function errorOf(response) {
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    if (body && typeof body.error === "string") return new ServerError(response.status, body.error);
    if (body && body.error && body.error.message) return new ServerError(response.status, body.error.message);
  } catch (_) {
    /* not JSON: the text itself is the message */
  }
  return new ServerError(response.status, text || `HTTP ${response.status}`);
}

export async function getJson(path, signal) {
  const response = await fetch(path, { signal, headers: { accept: "application/json" } });
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

export async function postJson(path, body, signal) {
  const response = await fetch(path, {
    method: "POST",
    signal,
    headers: { "content-type": "application/json" },
    body: body === undefined ? "" : JSON.stringify(body),
  });
  if (!response.ok) throw await errorOf(response);
  const text = await response.text();
  return text ? JSON.parse(text) : {};
}

const quote = encodeURIComponent;

export const api = {
  models: (signal) => getJson("/dashboard/api/models", signal),
  model: (name, version) => getJson(`/dashboard/api/model?name=${quote(name)}&version=${quote(version || "")}`),
  live: (model, signal) => getJson(`/dashboard/api/live?model=${quote(model || "")}`, signal),
  reports: () => getJson("/dashboard/api/reports"),
  monitoring: (signal) => getJson("/dashboard/api/monitoring", signal),
  rollouts: (signal) => getJson("/v2/nereid/rollouts", signal),
  rolloutHistory: (model, signal) => getJson(`/v2/nereid/rollouts/${quote(model)}/history`, signal),
  startRollout: (model, body) => postJson(`/v2/nereid/rollouts/${quote(model)}/start`, body),
  rolloutAction: (model, action) => postJson(`/v2/nereid/rollouts/${quote(model)}/${quote(action)}`),
  load: (name) => postJson(`/v2/repository/models/${quote(name)}/load`),
  unload: (name) => postJson(`/v2/repository/models/${quote(name)}/unload`),
  metadata: (name, version) => getJson(`/v2/models/${quote(name)}${version ? `/versions/${quote(version)}` : ""}`),
  infer: (name, version, body) => postJson(`/v2/models/${quote(name)}${version ? `/versions/${quote(version)}` : ""}/infer`, body),
};

// Streams an OpenAI chat completion, calling onToken with each piece of text as it arrives.
export async function streamChat(model, messages, onToken, signal) {
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    signal,
    headers: { "content-type": "application/json", accept: "text/event-stream" },
    body: JSON.stringify({ model, messages, stream: true, max_tokens: 64 }),
  });
  if (!response.ok) throw await errorOf(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffered += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffered.indexOf("\n\n")) >= 0) {
      const event = buffered.slice(0, cut);
      buffered = buffered.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new ServerError(200, chunk.error.message || String(chunk.error));
        const piece = chunk.choices && chunk.choices[0] && chunk.choices[0].delta && chunk.choices[0].delta.content;
        if (piece) onToken(piece);
      }
    }
  }
}
