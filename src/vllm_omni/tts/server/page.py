"""``GET /``: one small page to try the server from a browser (no external resources, no build step).

A person types text, picks a voice, a format and a speed, and hears it. ``pcm (streamed)`` plays
each chunk through Web Audio as it arrives, which is what the first-audio time shown measures;
the file formats play in an ``<audio>`` element once the response is complete (the time shown
is then when it started playing). A refusal is shown in words, from the server's JSON error.
"""

from __future__ import annotations

import html
import json

from vllm_omni.tts.encode import FORMATS

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>qwen3-tts-edge: try it</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:16px/1.4 system-ui,sans-serif;max-width:44rem;margin:2rem auto;padding:0 1rem;color:#222}
textarea{width:100%;height:6rem;font:inherit} label{margin-right:1rem} #status{margin-top:1rem;min-height:1.4em}
#status.error{color:#b00020} button{font:inherit;padding:.3rem 1.2rem}
</style></head><body>
<h1>Speak with <code>__MODEL__</code></h1>
<p><textarea id="text">Hello! This is Qwen3-TTS speaking on a CPU.</textarea></p>
<p><label>Voice <select id="voice"></select></label>
<label>Format <select id="format"><option value="stream">pcm (streamed)</option>__FORMATS__</select></label>
<label>Speed <input id="speed" type="number" min="0.25" max="4" step="0.25" value="1" style="width:4rem"></label></p>
<p><label>API key <input id="key" type="password" autocomplete="off" placeholder="if the server needs one"></label>
<button id="speak">Speak</button></p>
<div id="status" role="status"></div>
<audio id="player" controls></audio>
<script>
const $ = (id) => document.getElementById(id);
const RATE = 24000;
function show(text, error) { const s = $("status"); s.textContent = text; s.className = error ? "error" : ""; }
function headers() {
  const h = {"Content-Type": "application/json"}; const k = $("key").value.trim();
  if (k) h["Authorization"] = "Bearer " + k; return h;
}
async function refusal(r) {
  try { const e = (await r.json()).error; return e.message || ("HTTP " + r.status); }
  catch (_) { return "HTTP " + r.status + " " + r.statusText; }
}
async function loadVoices() {
  try {
    const r = await fetch("/v1/audio/voices", {headers: headers()});
    if (!r.ok) { show("voices: " + await refusal(r), true); return; }
    const voices = (await r.json()).voices || [];
    $("voice").innerHTML = "";
    for (const v of voices) { const o = document.createElement("option"); o.value = o.textContent = v.id; $("voice").append(o); }
  } catch (e) { show("voices: " + e, true); }
}
async function speak() {
  const format = $("format").value, started = performance.now();
  const body = {model: __MODEL_JS__, input: $("text").value, voice: $("voice").value || undefined,
                speed: Number($("speed").value), response_format: format === "stream" ? "pcm" : format,
                stream: format === "stream"};
  show("speaking...");
  document.body.dataset.state = "speaking";
  try {
    const r = await fetch("/v1/audio/speech", {method: "POST", headers: headers(), body: JSON.stringify(body)});
    if (!r.ok) { show(await refusal(r), true); document.body.dataset.state = "error"; return; }
    if (format === "stream") await playStream(r, started); else await playFile(r, started);
  } catch (e) { show(String(e), true); document.body.dataset.state = "error"; }
}
async function playStream(r, started) {
  const ctx = new AudioContext({sampleRate: RATE}); let at = ctx.currentTime + 0.05, first = null, samples = 0;
  const reader = r.body.getReader(); let carry = new Uint8Array(0);
  for (;;) {
    const {done, value} = await reader.read(); if (done) break;
    const bytes = new Uint8Array(carry.length + value.length); bytes.set(carry); bytes.set(value, carry.length);
    const even = bytes.length - (bytes.length % 2); carry = bytes.slice(even);
    const pcm = new Int16Array(bytes.buffer.slice(0, even)); if (!pcm.length) continue;
    const buf = ctx.createBuffer(1, pcm.length, RATE), ch = buf.getChannelData(0);
    for (let i = 0; i < pcm.length; i++) ch[i] = pcm[i] / 32768;
    const src = ctx.createBufferSource(); src.buffer = buf; src.connect(ctx.destination);
    at = Math.max(at, ctx.currentTime); src.start(at); at += buf.duration; samples += pcm.length;
    if (first === null) { first = performance.now() - started; show("first audio after " + first.toFixed(0) + " ms"); }
  }
  const seconds = samples / RATE;
  show("first audio after " + (first ?? 0).toFixed(0) + " ms; " + seconds.toFixed(2) + " s of speech");
  document.body.dataset.state = "played"; document.body.dataset.seconds = seconds.toFixed(3);
}
async function playFile(r, started) {
  const blob = await r.blob(); const p = $("player"); p.src = URL.createObjectURL(blob);
  p.onloadedmetadata = () => { document.body.dataset.seconds = p.duration.toFixed(3); };
  p.onplaying = () => { show("playing after " + (performance.now() - started).toFixed(0) + " ms (" + blob.size + " bytes)");
                        document.body.dataset.state = "played"; };
  p.onerror = () => { show("the browser could not play this " + blob.type + " response", true);
                      document.body.dataset.state = "error"; };
  await p.play().catch((e) => { show("press play: " + e, false); document.body.dataset.state = "played"; });
}
$("speak").addEventListener("click", speak);
loadVoices();
</script></body></html>
"""


def render(model_id: str, default_format: str) -> str:
    """The page for the model served as ``model_id``, the server's default format preselected."""
    options = "".join(f'<option value="{f}"{" selected" if f == default_format else ""}>{f}</option>'
                      for f in FORMATS if f != "pcm")
    as_js = json.dumps(model_id).replace("</", "<\\/")
    return (_PAGE.replace("__MODEL_JS__", as_js).replace("__MODEL__", html.escape(model_id))
            .replace("__FORMATS__", options))
