// worldstream latency lab: a "latency session" on the playground page. It shows a key to press
// at random moments (gaps of 0.8-2.5 s), measures each press's action-to-photon latency (key
// event time -> presentation of the first frame whose metadata action_seq >= the action's seq:
// requestVideoFrameCallback over WebRTC, the canvas draw over the WebSocket fallback), draws a
// live histogram, merges the server's frame log (GET /api/sessions/{id}/frames.json) into the
// records and exports them as CSV and JSON (the format of bench/analyse.py). All client times
// are ms on the page's performance.now() clock. Hooks: window.worldstream.listeners (play.js).
(() => {
  "use strict";
  const CONFIG = { gapMinMs: 800, gapMaxMs: 2500, answerTimeoutMs: 5000, bins: 24 };
  const CUE = { up: ["▲", "W / ↑"], down: ["▼", "S / ↓"], left: ["◀", "A / ←"],
    right: ["▶", "D / →"] };
  const $ = (id) => document.getElementById(id);
  const L = {                  // lab state, readable by tests as window.worldstream.lab
    config: CONFIG, active: false, finishing: false, target: 0, cue: null, timer: null,
    records: [], pending: new Map(), session: null, startFrameIndex: null,
    lastFrameIndex: null, server: null, meta: null, done: false,
  };

  const pct = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
  const latencies = () => L.records.filter((r) => r.latency_ms != null).map((r) => r.latency_ms)
    .sort((a, b) => a - b);
  const round = (v) => (v == null ? null : Math.round(v * 1000) / 1000);

  // ------------------------------------------------------------------ session flow
  function start() {
    const S = window.worldstream;
    if (!S.session || !S.transport) { setState("no stream yet: wait for the video"); return; }
    clearTimeout(L.timer);
    Object.assign(L, { active: true, finishing: false, cue: null, records: [], server: null,
      target: parseInt($("lab-count").value, 10), session: S.session,
      startFrameIndex: L.lastFrameIndex, meta: null, done: false });
    L.pending.clear();
    if (document.activeElement && document.activeElement.blur) document.activeElement.blur();
    $("ws-stage").focus();  // key capture ignores keys typed into inputs
    $("lab-panel").classList.remove("ws-hidden");
    $("lab-toggle").textContent = "■ Stop latency session";
    $("lab-csv").disabled = $("lab-json").disabled = true;
    setState("get ready…");
    render();
    schedule();
  }

  function schedule() {
    const gap = CONFIG.gapMinMs + Math.random() * (CONFIG.gapMaxMs - CONFIG.gapMinMs);
    L.timer = setTimeout(showCue, gap);
  }

  // the keys to cue: a game world's own (play.js's S.controls, its key map), else directions
  function cues() {
    const c = window.worldstream.controls;
    if (!c || !c.keys) return CUE;
    const out = {};
    for (const [code, wire] of Object.entries(c.keys)) {
      (out[wire] ||= [CUE[wire] ? CUE[wire][0] : wire, []])[1].push(code);
    }
    for (const wire of Object.keys(out)) out[wire][1] = out[wire][1].join(" / ");
    return out;
  }

  function showCue() {
    if (!L.active) return;
    const cue = cues(), keys = Object.keys(cue);
    const key = keys[Math.floor(Math.random() * keys.length)];
    L.cue = { key, shownAt: performance.now(), label: cue[key][1] };
    const el = $("lab-cue");
    el.replaceChildren(Object.assign(document.createElement("b"), { textContent: cue[key][0] }),
      Object.assign(document.createElement("span"), { textContent: `press ${cue[key][1]}` }));
    el.dataset.key = key;
    el.classList.remove("ws-hidden");
    setState("press the key shown on the video");
  }

  function hideCue() {
    L.cue = null;
    $("lab-cue").classList.add("ws-hidden");
    delete $("lab-cue").dataset.key;
  }

  // play.js hook: an action message left; `cause` is the key event behind it
  function onAction({ seq, t, cause }) {
    if (!L.active || !cause || !cause.down) return;
    if (!L.cue) { setState("too early: wait for the cue"); return; }
    if (cause.key !== L.cue.key) { setState(`wrong key: press ${L.cue.label}`); return; }
    const S = window.worldstream;
    const record = { action_seq: seq, key: cause.key, t_cue_ms: round(L.cue.shownAt),
      t_action_ms: round(cause.t), t_sent_ms: round(t), t_photon_ms: null, latency_ms: null,
      frame_index: null, rtp_ts: null, frame_action_seq: null, transport: S.transport };
    L.records.push(record);
    L.pending.set(seq, record);
    setTimeout(() => { if (L.pending.delete(seq)) { render(); maybeFinish(); } },
      CONFIG.answerTimeoutMs);
    hideCue();
    render();
    if (L.records.length < L.target) schedule(); else stop();
  }

  // play.js hook: a frame was presented at `at`; md: its requestVideoFrameCallback metadata
  // (WebRTC), whose receiveTime is when its last packet arrived
  function onPresented(meta, at, md) {
    L.lastFrameIndex = meta.index;
    let answered = 0;
    for (const [seq, r] of L.pending) {
      // a frame shown before the key event cannot answer it (clock edge): keep waiting
      if (meta.action_seq < seq || at < r.t_action_ms) continue;
      Object.assign(r, { t_photon_ms: round(at), latency_ms: round(at - r.t_action_ms),
        frame_index: meta.index, rtp_ts: meta.rtp_ts, frame_action_seq: meta.action_seq,
        t_frame_received_ms: round(md && md.receiveTime != null ? md.receiveTime
          : meta.received_at), frame_stages_ms: meta.stages_ms,
        frame_queue_ms: meta.queue_ms });
      L.pending.delete(seq);
      answered++;
    }
    if (answered) { render(); maybeFinish(); }
  }

  function stop() {
    clearTimeout(L.timer);
    hideCue();
    L.active = false;
    L.finishing = true;
    $("lab-toggle").textContent = "Start latency session";
    setState("waiting for the last frames…");
    maybeFinish();
  }

  // after stop: once every action is answered (or timed out), fetch the server's frame log
  async function maybeFinish() {
    if (!L.finishing || L.pending.size) return;
    L.finishing = false;
    setState("fetching the server's frame log…");
    try {
      const { session_id, token } = L.session;
      const r = await fetch(`/api/sessions/${session_id}/frames.json`,
        { headers: { Authorization: `Bearer ${token}` } });
      if (!r.ok) throw new Error(`frames.json: HTTP ${r.status}`);
      L.server = await r.json();
    } catch (err) {
      L.server = null;
      setState(`server frame log unavailable (${err.message}); exporting client data only`);
    }
    merge();
    L.meta = await sessionMeta();
    $("lab-csv").disabled = $("lab-json").disabled = false;
    if (L.server) setState(`done: ${latencies().length} samples; export below`);
    L.done = true;
    render();
  }

  // per action: the server's record of its answering frame (same index and rtp_ts) gives the
  // engine stages, the send queue and the ready/sent wall times; the page adds its own stages
  function merge() {
    const byFrame = new Map();
    for (const f of L.server ? L.server.frames : []) byFrame.set(`${f.index}/${f.rtp_ts}`, f);
    for (const r of L.records) {
      if (r.t_photon_ms == null) continue;
      const f = byFrame.get(`${r.frame_index}/${r.rtp_ts}`);
      const stages = { ...(f ? f.stages_ms : r.frame_stages_ms || {}) };
      const sendQueue = f ? f.queue_ms : r.frame_queue_ms;
      if (sendQueue != null) stages.send_queue = sendQueue;
      stages.client_input = round(r.t_sent_ms - r.t_action_ms);
      if (r.t_frame_received_ms != null) {
        // receiveTime is stamped on the network thread: on a busy machine it can read a few ms
        // after the presentation it led to; the stage is then 0, never negative
        stages.client_present = Math.max(0, round(r.t_photon_ms - r.t_frame_received_ms));
      }
      r.stages_ms = stages;
      r.server_logged = !!f;
      if (f) Object.assign(r, { chunk_index: f.chunk_index, server_t_ready_ms: f.t_ready_ms,
        server_t_sent_ms: f.t_sent_ms });
    }
  }

  async function sessionMeta() {
    const S = window.worldstream;
    let model = null;
    try { model = (await (await fetch("/api/health")).json()).model; } catch (err) { /* offline */ }
    const s = L.session;
    return { tool: "worldstream latency lab", model, session_id: s.session_id,
      video: `${s.width}x${s.height} @ ${s.fps} fps`, transport: S.transport,
      presentation: S.transport === "webrtc" ? "requestVideoFrameCallback expectedDisplayTime"
        : "requestAnimationFrame time of the canvas draw",
      clock: "performance.now() ms of the page", actions_asked: L.target,
      gaps_ms: `${CONFIG.gapMinMs}-${CONFIG.gapMaxMs}`, user_agent: navigator.userAgent,
      cpu_threads: navigator.hardwareConcurrency, exported_at: new Date().toISOString(),
      server_frames_evicted: L.server ? L.server.evicted : null };
  }

  // ------------------------------------------------------------------ export
  const exportRecords = () => L.records.map(({ frame_stages_ms, frame_queue_ms, ...r }) => r);

  function exportJson() {
    const frames = L.server ? L.server.frames.filter((f) =>
      L.startFrameIndex == null || f.index >= L.startFrameIndex) : [];
    return JSON.stringify({ meta: L.meta, actions: exportRecords(), server_frames: frames },
      null, 1);
  }

  function exportCsv() {
    const rows = exportRecords();
    const stageKeys = [...new Set(rows.flatMap((r) => Object.keys(r.stages_ms || {})))].sort();
    const cols = ["action_seq", "key", "t_cue_ms", "t_action_ms", "t_sent_ms", "t_photon_ms",
      "latency_ms", "frame_index", "rtp_ts", "frame_action_seq", "chunk_index", "transport",
      "server_logged"];
    const cell = (v) => (v == null ? "" : /[",\n]/.test(String(v))
      ? `"${String(v).replace(/"/g, '""')}"` : String(v));
    const lines = [[...cols, ...stageKeys.map((k) => `stage_${k}_ms`)].join(",")];
    for (const r of rows) {
      lines.push([...cols.map((c) => cell(r[c])),
        ...stageKeys.map((k) => cell((r.stages_ms || {})[k]))].join(","));
    }
    return lines.join("\n") + "\n";
  }

  function download(text, type, ext) {
    const a = document.createElement("a");
    a.href = URL.createObjectURL(new Blob([text], { type }));
    a.download = `latency-session-${L.session.session_id}.${ext}`;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
  }

  // ------------------------------------------------------------------ view
  function setState(text) { $("lab-state").textContent = text; }

  function render() {
    const lat = latencies();
    const answeredOrPending = L.records.length;
    const missed = L.records.filter((r) => r.latency_ms == null && !L.pending.has(r.action_seq))
      .length;
    $("lab-progress").textContent = `${answeredOrPending} / ${L.target}`;
    $("lab-n").textContent = String(lat.length);
    $("lab-missed").textContent = String(missed);
    $("lab-p50").textContent = lat.length ? pct(lat, 50).toFixed(0) : "–";
    $("lab-p95").textContent = lat.length ? pct(lat, 95).toFixed(0) : "–";
    drawHistogram(lat);
  }

  function drawHistogram(lat) {
    const c = $("lab-hist"), g = c.getContext("2d");
    const w = c.width, h = c.height, base = h - 16;
    g.clearRect(0, 0, w, h);
    g.font = "10px sans-serif";
    if (!lat.length) {
      g.fillStyle = "#94a3b8";
      g.fillText("action-to-photon histogram: press the keys shown on the video", 8, h / 2);
      return;
    }
    const top = Math.max(100, Math.ceil((lat[lat.length - 1] * 1.1) / 50) * 50);
    const width = top / CONFIG.bins;
    const counts = new Array(CONFIG.bins).fill(0);
    for (const v of lat) counts[Math.min(CONFIG.bins - 1, Math.floor(v / width))]++;
    const peak = Math.max(...counts);
    const bw = w / CONFIG.bins;
    g.fillStyle = "#f59e0b";
    counts.forEach((n, i) => {
      const bh = (n / peak) * (base - 14);
      g.fillRect(i * bw + 1, base - bh, bw - 2, bh);
    });
    g.fillStyle = "#94a3b8";
    for (let i = 0; i <= 4; i++) {
      const x = (i / 4) * w;
      g.fillText(`${Math.round((i / 4) * top)}`, Math.min(x, w - 40), h - 3);
    }
    g.fillText("ms", w - 14, h - 3);
    [[50, "#38bdf8"], [95, "#f43f5e"]].forEach(([p, colour]) => {
      const x = (pct(lat, p) / top) * w;
      g.strokeStyle = colour; g.lineWidth = 2;
      g.beginPath(); g.moveTo(x, 10); g.lineTo(x, base); g.stroke();
      g.fillStyle = colour; g.fillText(`p${p}`, Math.min(x + 3, w - 24), 10);
    });
  }

  function mount() {
    const S = window.worldstream;
    S.lab = L;
    S.listeners.action.push(onAction);
    S.listeners.presented.push(onPresented);
    $("lab-toggle").onclick = () => (L.active ? stop() : start());
    $("lab-csv").onclick = () => download(exportCsv(), "text/csv", "csv");
    $("lab-json").onclick = () => download(exportJson(), "application/json", "json");
    render();
  }

  // after play.js (deferred, earlier in the page) and Gradio's render of the markup
  const waitForPage = setInterval(() => {
    if (window.worldstream && document.getElementById("lab-panel")) {
      clearInterval(waitForPage);
      mount();
    }
  }, 100);
})();
