// dlr-serve demo page: live microphone keyword spotting (continuous mode: one detection per
// spoken command, with the voice-activity state) or classification (utterance mode) over
// WS /v1/speech/stream, and streamed text generation over POST /v1/generate (Server-Sent Events). Plain browser JavaScript, no
// build step and no external resources.
"use strict";

const $ = (id) => document.getElementById(id);
const CHUNK_SECONDS = 0.05; // audio per WebSocket message
const MAX_PENDING_CHUNKS = 200; // audio held while the session starts (10 s)

// ------------------------------------------------------------------ server messages
function report(text, kind = "error") {
  const li = document.createElement("li");
  li.className = kind;
  li.textContent = `${new Date().toLocaleTimeString()}  ${text}`;
  $("errors").prepend(li);
  while ($("errors").children.length > 20) $("errors").lastChild.remove();
}

function errorText(body, status) {
  if (body && typeof body === "object") {
    const e = body.error && typeof body.error === "object" ? body.error : body;
    if (Array.isArray(e.detail)) {
      return e.detail.map((d) => `${(d.loc || []).filter((p) => p !== "body").join(".")}: ${d.msg}`).join("; ");
    }
    const code = e.code || e.type || `HTTP ${status}`;
    return `[${code}] ${e.message || e.detail || JSON.stringify(body)}`;
  }
  return `HTTP ${status}: ${body || ""}`;
}

// ------------------------------------------------------------------ API key (optional)
// Sent as "Authorization: Bearer <key>" on HTTP and as the WebSocket subprotocol "bearer.<key>"
// (browsers cannot set headers on WebSockets); kept for this tab only (sessionStorage).
function apiKey() {
  return $("api-key").value.trim();
}

function authHeaders(extra = {}) {
  return apiKey() ? { ...extra, Authorization: `Bearer ${apiKey()}` } : extra;
}

function wsProtocols() {
  return apiKey() ? ["dlr.v1", `bearer.${apiKey()}`] : [];
}

// ------------------------------------------------------------------ models
async function loadModels() {
  try {
    const resp = await fetch("/v1/models", { headers: authHeaders() });
    const body = await resp.json();
    if (!resp.ok) throw new Error(errorText(body, resp.status));
    const items = Array.isArray(body) ? body : body.data || body.models || [];
    const speech = items.filter((m) => (m.labels && m.labels.length) || /speech|classifier|audio/.test(m.kind || ""));
    const lms = items.filter((m) => !speech.includes(m));
    for (const [sel, list] of [[$("speech-model"), speech], [$("lm-model"), lms]]) {
      sel.replaceChildren(...list.map((m) => new Option(m.name || m.id, m.name || m.id)));
    }
    if (speech[0] && speech[0].labels) drawBars(speech[0].labels, []);
    $("server-status").textContent = `${items.length} model(s): ${items.map((m) => m.name || m.id).join(", ")}`;
  } catch (err) {
    $("server-status").textContent = "server unreachable";
    report(`cannot list models: ${err.message}`);
  }
}

// ------------------------------------------------------------------ bar chart
let barLabels = [];

function drawBars(labels, top) {
  if (labels.join("\u0000") !== barLabels.join("\u0000")) {
    barLabels = labels.slice();
    $("bars").replaceChildren(
      ...labels.map((label) => {
        const row = document.createElement("div");
        row.className = "bar";
        row.setAttribute("role", "listitem");
        row.dataset.label = label;
        row.innerHTML = '<span class="name"></span><span class="track"><span class="fill"></span></span><span class="val"></span>';
        row.querySelector(".name").textContent = label;
        return row;
      }),
    );
  }
  const scores = new Map(top.map((t) => [t.label, t.score]));
  // scores are probabilities in [0, 1]; anything else (logits) is shown through a softmax
  const vals = [...scores.values()];
  const isProb = vals.every((v) => v >= 0 && v <= 1);
  let shown = scores;
  if (!isProb && vals.length) {
    const m = Math.max(...vals);
    const z = vals.reduce((a, v) => a + Math.exp(v - m), 0);
    shown = new Map([...scores].map(([k, v]) => [k, Math.exp(v - m) / z]));
  }
  const best = top.length ? top.reduce((a, b) => (b.score > a.score ? b : a)).label : null;
  for (const row of $("bars").children) {
    const v = shown.get(row.dataset.label) || 0;
    row.querySelector(".fill").style.width = `${(100 * v).toFixed(1)}%`;
    row.querySelector(".val").textContent = scores.has(row.dataset.label) ? scores.get(row.dataset.label).toFixed(3) : "";
    row.classList.toggle("best", row.dataset.label === best);
  }
}

// ------------------------------------------------------------------ microphone -> WebSocket
const mic = { ctx: null, stream: null, node: null, ws: null, ready: false, stopping: false, pending: [] };

function wsUrl(path) {
  return `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${path}`;
}

// ------------------------------------------------------------------ continuous mode
const kws = { detections: [], thresholdSet: false, timelineS: 30 };

function setVad(state) {
  const text = { off: "microphone off", listening: "listening", speech: "hearing speech", silence: "silence" };
  $("vad-state").dataset.state = state;
  $("vad-state").textContent = text[state] || state;
}

function clearDetections() {
  kws.detections = [];
  $("detections").replaceChildren();
  $("timeline").replaceChildren();
  $("det-count").textContent = "0";
}

function addDetection(d) {
  if (kws.detections.some((k) => k.index === d.index)) return; // (a replay after a resume)
  kws.detections.push(d);
  const li = document.createElement("li");
  li.dataset.label = d.label;
  li.dataset.endMs = d.end_ms;
  li.innerHTML = '<span class="label"></span><span class="time"></span> <span class="muted score"></span>';
  li.querySelector(".label").textContent = d.label;
  li.querySelector(".time").textContent = `${(d.end_ms / 1000).toFixed(2)} s`;
  li.querySelector(".score").textContent = `score ${Number(d.score).toFixed(3)}`;
  $("detections").append(li);
  li.scrollIntoView({ block: "nearest" });
  $("det-count").textContent = String(kws.detections.length);
  drawTimeline(d.end_ms);
}

function drawTimeline(nowMs) {
  const span = Math.min(kws.timelineS * 1000, Math.max(10000, nowMs + 1000));
  const from = Math.max(0, nowMs - span);
  $("timeline").replaceChildren(
    ...kws.detections
      .filter((d) => d.end_ms >= from)
      .map((d) => {
        const m = document.createElement("span");
        m.className = "mark";
        m.style.left = `${(100 * (d.end_ms - from)) / span}%`;
        m.textContent = d.label;
        m.title = `${d.label} at ${(d.end_ms / 1000).toFixed(2)} s (${Number(d.score).toFixed(3)})`;
        return m;
      }),
  );
}

function showResult(msg) {
  $("label").textContent = msg.label;
  $("label-score").textContent = typeof msg.score === "number" ? msg.score.toFixed(3) : "";
  const labels = barLabels.length ? barLabels : (msg.top || []).map((t) => t.label);
  drawBars(labels, msg.top || [{ label: msg.label, score: msg.score }]);
  if (msg.vad) setVad(msg.vad);
  const secs = ((msg.audio_ms || 0) / 1000).toFixed(1);
  $("speech-status").textContent = `${msg.type} at ${secs} s of audio (sending at ${mic.ctx ? mic.ctx.sampleRate : "?"} Hz)`;
}

async function startMic() {
  $("mic-start").disabled = true;
  $("final-label").textContent = "–";
  clearDetections();
  try {
    // The audio graph is built (worklet loaded, context running) before the microphone opens,
    // and the microphone is connected as soon as it is granted: what a user says right after
    // pressing the button is captured, not lost while the worklet loads.
    mic.ctx = new AudioContext();
    await mic.ctx.audioWorklet.addModule("pcm-worklet.js");
    await mic.ctx.resume();
    const rate = mic.ctx.sampleRate;
    mic.node = new AudioWorkletNode(mic.ctx, "pcm-capture", {
      processorOptions: { chunkSamples: Math.round(rate * CHUNK_SECONDS) },
    });
    const mute = mic.ctx.createGain();
    mute.gain.value = 0; // keep the node in the rendered graph without playing the mic back
    mic.node.connect(mute).connect(mic.ctx.destination);
    mic.stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
    });
    mic.ctx.createMediaStreamSource(mic.stream).connect(mic.node);
    openSpeechSocket(rate);
    mic.node.port.onmessage = (e) => {
      if (mic.ws && mic.ready && mic.ws.readyState === WebSocket.OPEN) {
        mic.ws.send(e.data);
      } else if (!mic.ready && mic.pending.length < MAX_PENDING_CHUNKS) {
        mic.pending.push(e.data); // spoken before the session is ready: sent once it is
      }
    };
    $("mic-stop").disabled = false;
    $("speech-status").textContent = `Microphone on at ${rate} Hz; connecting…`;
  } catch (err) {
    report(`microphone: ${err.message || err}`);
    await teardownMic();
  }
}

function openSpeechSocket(rate) {
  const ws = new WebSocket(wsUrl("/v1/speech/stream"), wsProtocols());
  ws.binaryType = "arraybuffer";
  mic.ws = ws;
  mic.ready = false;
  ws.onopen = () => {
    const start = { type: "start", sample_rate: rate, encoding: "pcm_s16le", interim_results: true };
    if ($("speech-model").value) start.model = $("speech-model").value;
    if ($("speech-mode").value === "continuous") {
      start.mode = "continuous";
      if (kws.thresholdSet) start.threshold = Number($("threshold").value);
    }
    ws.send(JSON.stringify(start));
  };
  ws.onmessage = (e) => {
    let msg;
    try {
      msg = JSON.parse(e.data);
    } catch {
      report(`unexpected message from server: ${String(e.data).slice(0, 100)}`);
      return;
    }
    if (msg.type === "ready") {
      mic.ready = true;
      for (const chunk of mic.pending.splice(0)) ws.send(chunk);
      if (mic.stopping) ws.send(JSON.stringify({ type: "end" }));
      if (msg.labels && msg.labels.length) drawBars(msg.labels, []);
      $("speech-status").textContent = `Listening at ${rate} Hz (session ${msg.session_id || "?"})`;
      mic.continuous = msg.mode === "continuous";
      if (msg.mode === "continuous") {
        setVad("listening");
        if (!kws.thresholdSet && msg.detection) {
          $("threshold").value = msg.detection.threshold;
          $("threshold-value").textContent = `${Number(msg.detection.threshold).toFixed(2)} (model)`;
        }
      }
    } else if (msg.type === "configured") {
      const t = Number(msg.detection.threshold).toFixed(2);
      $("threshold-value").textContent = `${t} (from ${(msg.audio_ms / 1000).toFixed(1)} s)`;
    } else if (msg.type === "detection") {
      addDetection(msg);
    } else if (msg.type === "partial") {
      showResult(msg);
    } else if (msg.type === "final") {
      showResult(msg);
      $("final-label").textContent = `${msg.label} (${Number(msg.score).toFixed(3)})`;
      for (const d of msg.detections || []) addDetection(d);
      if (mic.stopping) ws.close(1000);
    } else if (msg.type === "error") {
      report(`speech: [${msg.code}] ${msg.message}`);
    }
  };
  ws.onclose = (e) => {
    if (!mic.ready && !mic.stopping && e.code === 1006) {
      report("speech session refused at the handshake (is an API key needed, or the server full?)");
    } else if (!mic.stopping && e.code !== 1000) {
      report(`speech connection closed (code ${e.code}${e.reason ? `: ${e.reason}` : ""})`);
    }
    if (mic.ws === ws) teardownMic();
  };
  ws.onerror = () => {
    if (!mic.stopping) report("speech connection error");
  };
}

async function stopMic() {
  $("mic-stop").disabled = true;
  mic.stopping = true;
  if (mic.node) mic.node.port.postMessage("stop"); // flush the last partial chunk
  await new Promise((r) => setTimeout(r, 60));
  if (mic.ws && mic.ws.readyState === WebSocket.OPEN) {
    if (mic.ready) mic.ws.send(JSON.stringify({ type: "end" })); // else sent after the held audio
    setTimeout(() => mic.ws && mic.ws.readyState === WebSocket.OPEN && mic.ws.close(1000), 5000);
  } else {
    await teardownMic();
  }
  if (mic.stream) mic.stream.getTracks().forEach((t) => t.stop());
}

async function teardownMic() {
  if (mic.stream) mic.stream.getTracks().forEach((t) => t.stop());
  if (mic.ctx) await mic.ctx.close().catch(() => {});
  Object.assign(mic, { ctx: null, stream: null, node: null, ws: null, ready: false, stopping: false, continuous: false, pending: [] });
  setVad("off");
  $("mic-start").disabled = false;
  $("mic-stop").disabled = true;
}

// ------------------------------------------------------------------ generation (SSE over fetch)
let genAbort = null;

async function* sseEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    let cut;
    while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut).replace(/^\r?\n\r?\n/, "");
      let event = "message";
      const data = [];
      for (const line of block.split(/\r?\n/)) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) yield { event, data: data.join("\n") };
    }
  }
}

async function generate(ev) {
  ev.preventDefault();
  const out = $("output");
  out.textContent = "";
  $("gen-status").textContent = "generating…";
  $("gen-start").disabled = true;
  $("gen-stop").disabled = false;
  genAbort = new AbortController();
  const req = {
    prompt: $("prompt").value,
    max_new_tokens: Number($("max-tokens").value) || 64,
    temperature: Number($("temperature").value),
    stream: true,
  };
  if ($("seed").value !== "") req.seed = Number($("seed").value);
  if ($("lm-model").value) req.model = $("lm-model").value;
  let count = 0;
  try {
    const resp = await fetch("/v1/generate", {
      method: "POST",
      headers: authHeaders({ "Content-Type": "application/json", Accept: "text/event-stream" }),
      body: JSON.stringify(req),
      signal: genAbort.signal,
    });
    if (!resp.ok) {
      const text = await resp.text();
      let body = text;
      try {
        body = JSON.parse(text);
      } catch {}
      throw new Error(errorText(body, resp.status));
    }
    for await (const { event, data } of sseEvents(resp.body)) {
      if (data === "[DONE]") break;
      const msg = JSON.parse(data);
      if (event === "error" || msg.error) throw new Error(errorText(msg, resp.status));
      const piece = typeof msg.text === "string" ? msg.text : msg.token && msg.token.text ? msg.token.text : "";
      if (piece) {
        out.textContent += piece;
        count += 1;
      }
      if (msg.finish_reason) {
        const used = msg.usage ? `, ${msg.usage.completion_tokens} tokens` : "";
        $("gen-status").textContent = `finished: ${msg.finish_reason}${used}`;
        break;
      }
    }
  } catch (err) {
    if (err.name === "AbortError") $("gen-status").textContent = `stopped after ${count} tokens`;
    else {
      $("gen-status").textContent = "failed";
      report(`generate: ${err.message}`);
    }
  } finally {
    genAbort = null;
    $("gen-start").disabled = false;
    $("gen-stop").disabled = true;
  }
}

// ------------------------------------------------------------------ wiring
$("mic-start").addEventListener("click", startMic);
$("mic-stop").addEventListener("click", stopMic);
let configureTimer = null;
$("threshold").addEventListener("input", () => {
  kws.thresholdSet = true;
  const value = Number($("threshold").value);
  $("threshold-value").textContent = value.toFixed(2);
  // a live continuous stream takes the new threshold at once (debounced while dragging)
  clearTimeout(configureTimer);
  configureTimer = setTimeout(() => {
    if (mic.ws && mic.ready && mic.continuous && mic.ws.readyState === WebSocket.OPEN) {
      mic.ws.send(JSON.stringify({ type: "configure", threshold: value }));
    }
  }, 150);
});
$("gen-form").addEventListener("submit", generate);
$("gen-stop").addEventListener("click", () => genAbort && genAbort.abort());
window.addEventListener("error", (e) => report(`page: ${e.message}`));
$("api-key").value = sessionStorage.getItem("dlr-api-key") || "";
$("api-key").addEventListener("change", () => {
  sessionStorage.setItem("dlr-api-key", apiKey());
  loadModels();
});
loadModels();
