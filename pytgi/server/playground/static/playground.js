// The playground: chat through the public /v1/chat/completions (SSE streaming) and a dashboard
// polling /metrics. It only calls the public API, with the key typed by the user as a Bearer header.
"use strict";
const $ = (id) => document.getElementById(id);
const history = [];
let controller = null;

function authHeaders() {
  const key = $("api-key").value.trim();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  div.textContent = text;
  $("messages").appendChild(div);
  $("messages").scrollTop = $("messages").scrollHeight;
  return div;
}

function chatRequest() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...history);
  const body = {
    model: "tgi",
    messages,
    stream: true,
    max_tokens: Number($("max-tokens").value) || 64,
    temperature: Number($("temperature").value),
    top_p: Number($("top-p").value) || undefined,
  };
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  if ($("json-mode").checked) body.response_format = { type: "json_object" };
  return body;
}

// Yield each SSE event's data string from a fetch Response body.
async function* sseData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trimStart()).join("\n");
      if (data) yield data;
    }
  }
}

async function errorText(response) {
  try {
    const body = await response.json();
    return `${response.status}: ${body.error || JSON.stringify(body)}`;
  } catch (e) {
    return response.status === 401 ? "401: this server needs its API key" : `HTTP ${response.status}`;
  }
}

async function send(event) {
  event.preventDefault();
  const prompt = $("prompt").value;
  if (!prompt.trim() || controller) return;
  history.push({ role: "user", content: prompt });
  addMessage("user", prompt);
  $("prompt").value = "";
  const out = addMessage("assistant", "");
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  $("chat-status").textContent = "streaming…";
  let text = "";
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json", ...authHeaders() },
      body: JSON.stringify(chatRequest()),
      signal: controller.signal,
    });
    if (!response.ok) throw new Error(await errorText(response));
    let finish = null;
    for await (const data of sseData(response)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error);
      const choice = (chunk.choices || [])[0];
      if (!choice) continue;
      text += (choice.delta && choice.delta.content) || "";
      out.textContent = text;
      finish = choice.finish_reason || finish;
    }
    $("chat-status").textContent = finish ? `finish_reason: ${finish}` : "done";
    history.push({ role: "assistant", content: text });
  } catch (err) {
    history.pop();
    out.className = "msg error";
    out.textContent = err.name === "AbortError" ? `${text} [stopped]` : String(err.message || err);
    $("chat-status").textContent = "";
  } finally {
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

// --- dashboard ---
const TPS_POINTS = 60;
const tpsSeries = [];
let previous = null;

function drawChart() {
  const canvas = $("tps-chart");
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const max = Math.max(1, ...tpsSeries);
  ctx.strokeStyle = "#2f6fde";
  ctx.beginPath();
  tpsSeries.forEach((v, i) => {
    const x = (i / (TPS_POINTS - 1)) * canvas.width;
    const y = canvas.height - (v / max) * (canvas.height - 4) - 2;
    i ? ctx.lineTo(x, y) : ctx.moveTo(x, y);
  });
  ctx.stroke();
}

async function pollMetrics() {
  try {
    const response = await fetch("/metrics", { headers: authHeaders() });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const m = parsePrometheus(await response.text());
    const now = performance.now() / 1000;
    $("m-running").textContent = m.tgi_batch_current_size ?? "–";
    $("m-waiting").textContent = m.tgi_queue_size ?? "–";
    if (m.pytgi_kv_blocks_total !== undefined) {
      const used = m.pytgi_kv_blocks_total - m.pytgi_kv_blocks_free;
      $("m-kv").textContent = `${used} / ${m.pytgi_kv_blocks_total}`;
    }
    if (m.pytgi_prefix_cache_hit_rate !== undefined) {
      $("m-prefix").textContent = `${(100 * m.pytgi_prefix_cache_hit_rate).toFixed(1)} %`;
    }
    $("m-requests").textContent = m.tgi_request_success ?? "–";
    const tokens = m.tgi_request_generated_tokens_sum || 0;
    if (previous) {
      const tps = Math.max(0, (tokens - previous.tokens) / (now - previous.time));
      $("m-tps").textContent = tps.toFixed(1);
      tpsSeries.push(tps);
      if (tpsSeries.length > TPS_POINTS) tpsSeries.shift();
      drawChart();
    }
    previous = { tokens, time: now };
    $("metrics-status").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (err) {
    $("metrics-status").textContent = `metrics unavailable: ${err.message || err}`;
  }
}

async function loadInfo() {
  try {
    const info = await (await fetch("/info")).json();
    $("model").textContent = info.model_id || "";
  } catch (e) { /* the page works without it */ }
}

$("chat-form").addEventListener("submit", send);
$("stop").addEventListener("click", () => controller && controller.abort());
$("clear").addEventListener("click", () => { history.length = 0; $("messages").textContent = ""; });
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) send(e);
});
$("api-key").value = sessionStorage.getItem("pytgi-api-key") || "";
$("api-key").addEventListener("change", () => sessionStorage.setItem("pytgi-api-key", $("api-key").value));
loadInfo();
pollMetrics();
setInterval(pollMetrics, 1000);
