// worldstream playground page: owns the <video>, the transports (WebRTC, falling back to a
// WebSocket), key capture, steering controls and the latency HUD. Wire protocol:
// /work/shared/PROTOCOL.md + streaming/PROTOCOL_EXTENSIONS.md. Per-frame and per-key traffic
// never goes through Gradio.
(() => {
  "use strict";
  // browser key (KeyboardEvent.code) -> wire key; a game world replaces it with its key map
  // (game.js, from GET /api/controls)
  const KEY_OF_CODE = {
    KeyW: "up", ArrowUp: "up", KeyS: "down", ArrowDown: "down",
    KeyA: "left", ArrowLeft: "left", KeyD: "right", ArrowRight: "right",
  };
  const MAX_HELD_KEYS = 4;          // keys one action message may hold (PROTOCOL_EXTENSIONS)
  const WEBRTC_TIMEOUT_MS = 6000;   // no frame presented by then: fall back to the WebSocket
  const WS_CREDITS = 2;             // frames requested ahead over the WebSocket
  const SAMPLES = 100;              // rolling window of latency samples
  const CHART_POINTS = 120;

  const $ = (id) => document.getElementById(id);
  const S = {                       // page state, readable by tests as window.worldstream
    session: null, transport: null, pc: null, dc: null, ws: null, seq: 0,
    held: new Set(), sentAt: new Map(), frames: new Map(), rtpOrigin: null, misses: 0,
    shownEarly: new Map(),          // rtp pts -> {pts, shownAt, md}: shown before its message
    lastActionSeq: -1, a2p: [], presented: [], jitterMs: null, genMs: null, dropped: 0,
    chart: [], stageHist: [], budget: null, jbLast: null, recording: false, statsTimer: null, connecting: false,
    // the newest video frame presented and data-channel message received (performance.now()),
    // read by reconnect.js's watchdog; closing: the page is being left; ended: the server
    // closed the session (neither is re-offered)
    lastFrameAt: 0, lastMessageAt: 0, rvfc: null, closing: false, ended: false,
    // hooks for add-ons (latency_lab.js, world.js): action({seq, t, keys, cause}),
    // presented(meta, at, videoFrameMetadata?), event(msg): every server "event" message
    listeners: { action: [], presented: [], event: [] },
  };
  window.worldstream = S;
  S.keyOfCode = KEY_OF_CODE;        // game.js puts a game world's key map in it
  const emit = (kind, ...args) => S.listeners[kind].forEach((fn) => fn(...args));

  // ------------------------------------------------------------------ helpers
  const log = (text, isError) => {
    const el = $("ws-log");
    el.textContent = text;
    el.classList.toggle("ws-error", !!isError);
  };
  const pct = (values, p) => {
    if (!values.length) return null;
    const sorted = [...values].sort((a, b) => a - b);
    return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
  };
  const push = (arr, v, n) => { arr.push(v); if (arr.length > n) arr.shift(); };
  const setBadge = (text, kind) => {
    const b = $("ws-badge");
    b.textContent = text;
    b.dataset.kind = kind || "";
  };

  function send(msg) {
    const text = JSON.stringify(msg);
    if (S.dc && S.dc.readyState === "open") S.dc.send(text);
    else if (S.ws && S.ws.readyState === WebSocket.OPEN) S.ws.send(text);
    else return false;
    return true;
  }
  const nextSeq = () => ++S.seq;
  S.sendMessage = (msg) => send({ ...msg, seq: nextSeq() });  // for add-ons (world.js)
  S.log = log;
  S.setBadge = setBadge;

  // ------------------------------------------------------------------ server messages
  function onServerMessage(msg) {
    switch (msg.type) {
      case "frame":
        msg.received_at = performance.now();
        S.frames.set(msg.rtp_ts, msg);
        push(S.stageHist, { ...(msg.stages_ms || {}), send_queue: msg.queue_ms }, 30);
        if (S.frames.size > 600) S.frames.delete(S.frames.keys().next().value);
        presentedEarly(msg);
        break;
      case "stats":
        S.genMs = msg.gen_ms;
        S.dropped = msg.dropped;
        S.budget = msg.budget || null;
        break;
      case "pong":
        S.rttMs = performance.now() - msg.t;
        break;
      case "error":
        log(`rejected${msg.field ? " " + msg.field : ""}: ${msg.message} (${msg.code})`, true);
        break;
      case "preview":
        showPreviews(msg);
        break;
      case "event":
        onEvent(msg);
        emit("event", msg);
        break;
    }
  }

  function onEvent(msg) {
    if (msg.kind === "recording") {
      S.recording = msg.on;
      $("ws-record").textContent = msg.on ? "■ Stop recording" : "● Record";
      $("ws-record").classList.toggle("ws-rec-on", msg.on);
      const a = $("ws-download");
      if (!msg.on && msg.url) {
        a.href = `${msg.url}?token=${encodeURIComponent(S.session.token)}`;
        a.classList.remove("ws-disabled");
        log("recording ready: Download MP4");
      } else if (msg.on) {
        log("recording…");
      }
    } else if (msg.kind === "degraded") {
      log(msg.degraded
        ? `the model cannot keep up (${msg.reason || "chunks late"}): now ${msg.steps} steps at ${msg.fps} fps`
        : `back to full quality: ${msg.steps} steps at ${msg.fps} fps`);
    } else if (msg.kind === "closed") {
      S.ended = true;
      log("session closed by the server; press Restart", true);
    } else if (msg.kind === "recovered") {
      // reconnect.js reports it (scale-out: the session moved to another replica)
    } else if (msg.adopted !== undefined) {
      log(`adopted future ${msg.adopted + 1}`);
    } else if (msg.kind === "story" || msg.loaded !== undefined || msg.picture) {
      // world.js reports these (stories), or the HTTP answer did (loads, pictures)
    } else if (msg.rewound !== undefined) {
      log(`rewound ${msg.rewound} chunks`);
    } else if (msg.chunk_frames !== undefined) {
      log(`settings: ${msg.mode || "custom"} mode, ${msg.chunk_frames}-frame chunks, `
        + `${msg.steps} steps, ${msg.fps} fps`);
    } else {
      log(msg.message || `${msg.kind}: ${JSON.stringify(msg)}`);
    }
  }

  function showPreviews(msg) {
    const box = $("ws-previews");
    if (msg.fork_id !== S.forkId || msg.fork_id == null) box.replaceChildren();
    S.forkId = msg.fork_id;  // the engine sends one message per branch of a fork
    for (const b of msg.branches) {
      const img = document.createElement("img");
      img.src = b.image;
      img.title = `adopt future ${b.branch + 1}`;
      img.alt = `future ${b.branch + 1}`;
      img.addEventListener("click", () => {
        send({ type: "adopt", seq: nextSeq(), branch: b.branch });
        box.replaceChildren();
        log(`adopted future ${b.branch + 1}`);
      });
      box.appendChild(img);
    }
  }

  // ------------------------------------------------------------------ presentation + latency
  // A frame was shown at `shownAt` (performance.now() clock). The first frame conditioned on a
  // newer action gives one action-to-photon sample: shownAt - the time the action was sent.
  // md: the requestVideoFrameCallback metadata (WebRTC only)
  function onPresented(meta, shownAt, md) {
    push(S.presented, shownAt, 60);
    emit("presented", meta, shownAt, md);
    if (meta.action_seq > S.lastActionSeq) {
      S.lastActionSeq = meta.action_seq;
      const sentAt = S.sentAt.get(meta.action_seq) ?? meta.action_t;
      if (sentAt != null) push(S.a2p, shownAt - sentAt, SAMPLES);
    }
  }

  // the value of `map` at RTP timestamp `pts` or one tick either side
  const nearKey = (map, pts) => map.get(pts) ?? map.get((pts + 1) >>> 0)
    ?? map.get((pts - 1) >>> 0);

  // A `frame` message whose video frame was already presented: that presentation counts now
  // (the data channel is ordered, so such frames still reach onPresented in stream order).
  function presentedEarly(msg) {
    const early = nearKey(S.shownEarly, msg.rtp_ts);
    if (!early) return;
    S.shownEarly.delete(early.pts);
    S.misses = 0;
    onPresented(msg, early.shownAt, early.md);
  }

  // WebRTC: match each presented frame to its `frame` message by RTP timestamp. aiortc adds a
  // random origin to the RTP clock (RFC 3550); the first frame presented is pts 0 (the stream's
  // first keyframe; the callback is registered before any frame arrives), which gives the
  // origin; a run of misses recalibrates.
  function onVideoFrame(now, md) {
    S.lastFrameAt = now;
    if (S.onFirstFrame) { S.onFirstFrame(); S.onFirstFrame = null; }
    if (S.pc && md.rtpTimestamp !== undefined) {
      if (S.rtpOrigin === null) {
        // first frame: pts 0; after a run of misses: the newest frame message received
        const pts = S.frames.size && S.recalibrating ? Math.max(...S.frames.keys()) : 0;
        S.rtpOrigin = (md.rtpTimestamp - pts) >>> 0;
      }
      // NOTE: Chromium's rtpTimestamp has been through microseconds and lands a tick (11 us)
      // below the frame's RTP timestamp on every third frame at 15 fps; matching exactly
      // skipped those frames (the HUD showed 5-10 fps of 15 received) and counted an
      // action's photon on a later frame (+67-133 ms)
      const pts = (md.rtpTimestamp - S.rtpOrigin) >>> 0;
      const meta = nearKey(S.frames, pts);
      if (meta) {
        S.misses = 0;
        onPresented(meta, md.expectedDisplayTime || now, md);
      } else {
        // on a loaded machine the video can outrun its `frame` message (RTP vs the data
        // channel): keep the photon time until the message arrives (presentedEarly)
        S.shownEarly.set(pts, { pts, shownAt: md.expectedDisplayTime || now, md });
        if (S.shownEarly.size > 60) S.shownEarly.delete(S.shownEarly.keys().next().value);
        if (++S.misses > 30) {
          S.rtpOrigin = null;
          S.recalibrating = true;
          S.misses = 0;
          S.shownEarly.clear();
        }
      }
    }
    S.rvfc = $("ws-video").requestVideoFrameCallback(onVideoFrame);
  }

  // ------------------------------------------------------------------ HUD
  // the designed budget (server stats) beside the measured p50 of each stage of recent frames
  function budgetText(b) {
    const keys = [...new Set(S.stageHist.flatMap((s) => Object.keys(s)))];
    const stage = (k) => pct(S.stageHist.map((s) => s[k]).filter((v) => v != null), 50);
    const measured = keys.filter((k) => stage(k) != null)
      .map((k) => `${k} ${stage(k).toFixed(0)}`).join(" · ");
    if (!b) return `latency budget: ${measured || "–"}`;
    return `latency budget: wait ${b.wait_ms.toFixed(0)} + planned chunk ${b.plan_ms.toFixed(0)}`
      + ` ms at ${b.fps} fps (measured p50: ${measured || "–"}; after delivery: cache fill`
      + ` ${b.after_delivery_ms.toFixed(0)})`;
  }

  function updateHud() {
    const p = S.presented;
    const fps = p.length > 1 ? (1000 * (p.length - 1)) / (p[p.length - 1] - p[0]) : 0;
    $("hud-fps").textContent = fps ? fps.toFixed(1) : "–";
    $("hud-gen").textContent = S.genMs != null ? S.genMs.toFixed(1) : "–";
    const p50 = pct(S.a2p, 50), p95 = pct(S.a2p, 95);
    $("hud-a2p").textContent = p50 != null ? `${p50.toFixed(0)} / ${p95.toFixed(0)}` : "–";
    $("hud-jb").textContent = S.transport === "websocket" ? "n/a"
      : S.jitterMs != null ? S.jitterMs.toFixed(0) : "–";
    $("hud-drop").textContent = String(S.dropped ?? 0);
    const b = S.budget;
    if (b) {
      $("hud-mode").textContent = `${b.mode || "custom"} · ${b.chunk_frames} / ${b.steps}`;
      $("hud-floor").textContent = b.floor_ms.toFixed(0);
      if (b.mode) $("ws-mode").value = b.mode;
    }
    $("hud-budget").textContent = budgetText(b);
    push(S.chart, { a2p: p50, jb: S.jitterMs, fps }, CHART_POINTS);
    drawChart();
  }

  function drawChart() {
    const c = $("hud-chart"), g = c.getContext("2d");
    const w = c.width, h = c.height;
    g.clearRect(0, 0, w, h);
    const series = [["a2p", "#f59e0b", "a2p p50 ms"], ["jb", "#38bdf8", "jitter buf ms"]];
    const top = Math.max(50, ...S.chart.flatMap((d) => [d.a2p || 0, d.jb || 0])) * 1.15;
    g.strokeStyle = "#334155"; g.fillStyle = "#94a3b8"; g.font = "10px sans-serif";
    for (const frac of [0.5, 1]) {
      const y = h - frac * (h - 12);
      g.beginPath(); g.moveTo(0, y); g.lineTo(w, y); g.stroke();
      g.fillText(`${Math.round(top * frac)} ms`, 2, y + 10);
    }
    series.forEach(([key, colour, label], i) => {
      g.strokeStyle = colour; g.lineWidth = 1.5; g.beginPath();
      let started = false;
      S.chart.forEach((d, x) => {
        if (d[key] == null) return;
        const px = (x / (CHART_POINTS - 1)) * w, py = h - (d[key] / top) * (h - 12);
        if (started) g.lineTo(px, py); else { g.moveTo(px, py); started = true; }
      });
      g.stroke();
      g.fillStyle = colour; g.fillText(label, w - 190 + i * 95, 10);
    });
  }

  async function pollStats() {
    if (S.transport === "webrtc" && S.pc) {
      const report = await S.pc.getStats();
      report.forEach((s) => {
        if (s.type !== "inbound-rtp" || s.kind !== "video") return;
        const last = S.jbLast;
        if (last && s.jitterBufferEmittedCount > last.count) {
          S.jitterMs = (1000 * (s.jitterBufferDelay - last.delay))
            / (s.jitterBufferEmittedCount - last.count);
        }
        S.jbLast = { delay: s.jitterBufferDelay, count: s.jitterBufferEmittedCount };
        if (s.codecId && report.get(s.codecId)) {
          const codec = report.get(s.codecId).mimeType.split("/")[1];
          setBadge(`WebRTC · ${codec}`, "webrtc");
        }
      });
    }
    send({ type: "ping", seq: nextSeq(), t: performance.now() });
    updateHud();
  }

  // ------------------------------------------------------------------ keys
  // cause: the key event behind the change, {key, down, t: event time}, when there is one
  function sendKeys(cause) {
    const seq = nextSeq(), t = performance.now();
    S.sentAt.set(seq, t);
    if (S.sentAt.size > 500) S.sentAt.delete(S.sentAt.keys().next().value);
    const keys = [...S.held].slice(0, MAX_HELD_KEYS);
    send({ type: "action", seq, t, keys });
    emit("action", { seq, t, keys, cause });
    document.querySelectorAll(".ws-keys [data-key]").forEach((el) =>
      el.classList.toggle("ws-held", S.held.has(el.dataset.key)));
  }
  const typing = () => {
    const el = document.activeElement;
    return el && (el.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(el.tagName));
  };
  // avatar world: number keys and buttons set an expression, the say box queues speech; both
  // ride on an action message with the keys held now
  const EXPRESSION_OF_DIGIT = {};
  function sendAvatar(fields) {
    const seq = nextSeq(), t = performance.now();
    S.sentAt.set(seq, t);
    const keys = [...S.held].slice(0, MAX_HELD_KEYS);
    send({ type: "action", seq, t, keys, ...fields });
    emit("action", { seq, t, keys, cause: fields });
  }
  function sendSay() {
    const text = $("ws-say").value.trim();
    if (!text) { log("nothing to say", true); return; }
    sendAvatar({ say: text });
    log(`say: ${text}`);
  }
  function onKey(e) {
    const expression = EXPRESSION_OF_DIGIT[e.code];
    if (expression && e.type === "keydown" && !typing() && !e.repeat) {
      sendAvatar({ expression });
      log(`expression: ${expression}`);
      return;
    }
    const key = KEY_OF_CODE[e.code];
    if (!key || typing() || e.ctrlKey || e.metaKey || e.altKey) return;
    e.preventDefault();
    if (e.repeat) return;
    const down = e.type === "keydown";
    if (down === S.held.has(key)) return;
    if (down) S.held.add(key); else S.held.delete(key);
    sendKeys({ key, down, t: e.timeStamp });
  }
  function releaseAll() {
    if (S.held.size) { S.held.clear(); sendKeys(); }
  }

  // ------------------------------------------------------------------ transports
  async function api(method, path, body) {
    const headers = { "Content-Type": "application/json" };
    // a session's token; before one exists, the server key of an exposed server (?key=)
    const key = S.session ? S.session.token : new URLSearchParams(location.search).get("key");
    if (key) headers.Authorization = `Bearer ${key}`;
    const r = await fetch(path, { method, headers, body: body && JSON.stringify(body) });
    const data = r.status === 204 ? null : await r.json();
    if (!r.ok) {
      const err = new Error(`${r.status}: ${data.error}${data.field ? ` (${data.field})` : ""}`);
      err.status = r.status;
      err.retryAfter = data.retry_after_s ?? (parseFloat(r.headers.get("Retry-After")) || undefined);
      throw err;
    }
    return data;
  }

  function waitIce(pc) {
    if (pc.iceGatheringState === "complete") return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => { if (pc.iceGatheringState === "complete") resolve(); };
      pc.addEventListener("icegatheringstatechange", done);
      setTimeout(resolve, 2000);
    });
  }

  // One peer connection to the session, current at once (S.pc; its data channel becomes S.dc
  // when it opens): its messages feed onServerMessage, its track plays in the one <video>.
  // Resolves once its first frame is presented; rejects, closed, when the offer is refused
  // (err.status, err.retryAfter), the connection fails or no frame comes within timeoutMs.
  // startWebRTC makes the first; reconnect.js (S.connectPeer) the next after a failover.
  async function connectPeer(timeoutMs) {
    const pc = new RTCPeerConnection({ iceServers: [] });
    S.pc = pc;
    pc.addTransceiver("video", { direction: "recvonly" });
    const dc = pc.createDataChannel("control", { ordered: true });
    dc.onmessage = (e) => {
      if (S.pc !== pc) return;  // a replaced connection's
      S.lastMessageAt = performance.now();
      const msg = JSON.parse(e.data);
      // a hidden tab presents no frame: its frame messages say the video flows
      if (msg.type === "frame" && document.hidden && S.onFirstFrame) {
        S.onFirstFrame(); S.onFirstFrame = null;
      }
      onServerMessage(msg);
    };
    dc.onopen = () => { if (S.pc === pc) { S.dc = dc; sendKeys(); } };
    const video = $("ws-video");
    let timer;
    const playing = new Promise((resolve, reject) => {
      pc.ontrack = (e) => {
        // show each frame as soon as it is decoded: the server already paces the frames,
        // a jitter buffer on top only adds delay (WebRTC: RTCRtpReceiver.jitterBufferTarget;
        // playoutDelayHint is Chrome's older name)
        if ("jitterBufferTarget" in e.receiver) e.receiver.jitterBufferTarget = 0;
        if ("playoutDelayHint" in e.receiver) e.receiver.playoutDelayHint = 0;
        S.onFirstFrame = resolve;
        // one callback chain per <video>, whichever connection's track it shows
        if (S.rvfc !== null) video.cancelVideoFrameCallback(S.rvfc);
        S.rvfc = video.requestVideoFrameCallback(onVideoFrame);
        video.srcObject = e.streams[0] || new MediaStream([e.track]);
        video.play().catch(() => {});
      };
      pc.onconnectionstatechange = () => {
        if (pc.connectionState === "failed") reject(new Error("WebRTC connection failed"));
      };
      timer = setTimeout(() => reject(new Error("no WebRTC frame in time")), timeoutMs);
      pc.cancel = () => reject(new Error("connection cancelled"));  // dropPeer: unwind now
    });
    playing.catch(() => {});  // awaited below unless the offer fails first
    try {
      await pc.setLocalDescription(await pc.createOffer());
      await waitIce(pc);
      if (S.pc !== pc) throw new Error("connection cancelled");  // no offer for a dropped one
      const answer = await api("POST", `/api/sessions/${S.session.session_id}/offer`,
        { sdp: pc.localDescription.sdp, type: "offer" });
      await pc.setRemoteDescription(answer);
      await playing;
    } catch (err) {
      pc.close();
      if (S.pc === pc) Object.assign(S, { pc: null, dc: null, onFirstFrame: null });
      throw err;
    } finally {
      clearTimeout(timer);
    }
    return pc;
  }
  S.connectPeer = connectPeer;
  S.api = api;

  async function startWebRTC() {
    await connectPeer(WEBRTC_TIMEOUT_MS);
    S.transport = "webrtc";
    setBadge("WebRTC", "webrtc");
  }

  // url: where the session's WebSocket is served (ws_media.js: its replica's host); default
  // this server's route
  function startWebSocket(url) {
    return new Promise((resolve, reject) => {
      const proto = location.protocol === "https:" ? "wss" : "ws";
      if (!S.session) { reject(new Error("no session to connect to")); return; }
      const { session_id, token } = S.session;
      const base = url || `${proto}://${location.host}/api/sessions/${session_id}/ws`;
      const ws = new WebSocket(`${base}?token=${encodeURIComponent(token)}`);
      ws.binaryType = "arraybuffer";
      S.ws = ws;
      const canvas = $("ws-canvas"), g = canvas.getContext("2d");
      ws.onopen = () => {
        S.transport = "websocket";
        $("ws-video").classList.add("ws-hidden");
        canvas.classList.remove("ws-hidden");
        setBadge("WebSocket (fallback)", "websocket");
        for (let i = 0; i < WS_CREDITS; i++) ws.send('{"type":"next"}');
        sendKeys();
        resolve();
      };
      ws.onerror = () => reject(new Error("WebSocket failed"));
      ws.onclose = () => { if (S.ws === ws) setBadge("disconnected", "off"); };
      ws.onmessage = async (e) => {
        S.lastMessageAt = performance.now();  // ws_media.js's watchdog
        if (typeof e.data === "string") { onServerMessage(JSON.parse(e.data)); return; }
        const view = new DataView(e.data);
        const size = view.getUint32(0);
        const meta = JSON.parse(new TextDecoder().decode(new Uint8Array(e.data, 4, size)));
        meta.received_at = performance.now();
        const bitmap = await createImageBitmap(new Blob([new Uint8Array(e.data, 4 + size)],
          { type: "image/jpeg" }));
        if (canvas.width !== bitmap.width) { canvas.width = bitmap.width; canvas.height = bitmap.height; }
        requestAnimationFrame((now) => {
          g.drawImage(bitmap, 0, 0);
          onPresented(meta, now);
          if (ws.readyState === WebSocket.OPEN) ws.send('{"type":"next"}');
        });
      };
    });
  }

  S.startWebSocket = startWebSocket;

  // the peer connection closed and what matched its frames (RTP origin, frame messages,
  // stats) reset; the HUD's counters (fps, action-to-photon, dropped, chart) are kept:
  // reconnect.js calls it before it offers again
  function dropPeer() {
    if (S.pc) { if (S.pc.cancel) S.pc.cancel(); S.pc.close(); }
    Object.assign(S, { pc: null, dc: null, rtpOrigin: null, recalibrating: false,
      onFirstFrame: null, jbLast: null });
    S.frames.clear();
    S.shownEarly.clear();
  }
  S.dropPeer = dropPeer;

  function teardown() {
    dropPeer();
    if (S.ws) S.ws.close();
    Object.assign(S, { ws: null, transport: null, jitterMs: null, lastActionSeq: -1,
      ended: false });
    $("ws-video").srcObject = null;
  }

  // the start under way ({cancelled, done}): a restart (Restart, a transport change) cancels
  // it and waits for it to unwind; left alone it would go on with the session being deleted
  let starting = null;
  function start() {
    if (!starting) {
      const run = { cancelled: false };
      starting = run;
      run.done = connect(run).finally(() => { starting = null; S.connecting = false; });
    }
    return starting.done;
  }

  async function connect(run) {
    S.connecting = true;
    setBadge("connecting…", "");
    const live = () => { if (run.cancelled) throw new Error("start cancelled"); };
    try {
      const prompt = ($("ws-prompt") ? $("ws-prompt").value.trim() : "")
        || $("ws-root").dataset.defaultPrompt;
      const seed = parseInt($("ws-seed").value, 10);
      while (!S.session) {
        live();
        try {
          S.session = await api("POST", "/api/sessions",
            { prompt, seed: Number.isFinite(seed) ? seed : undefined });
        } catch (err) {
          if (err.status !== 503) throw err;
          log(`server full, retrying in ${err.retryAfter} s`, true);
          await new Promise((r) => setTimeout(r, 1000 * (err.retryAfter || 5)));
        }
      }
      live();
      $("ws-status").textContent = `${S.session.width}×${S.session.height} @ ${S.session.fps} fps`;
      const pref = $("ws-transport").value;
      if (pref !== "websocket") {
        try {
          await startWebRTC();
        } catch (err) {
          if (pref === "webrtc" || run.cancelled) throw err;
          log(`WebRTC unavailable (${err.message}); using the WebSocket fallback`);
          teardown();
          await (S.openWebSocket || startWebSocket)();
        }
      } else {
        await (S.openWebSocket || startWebSocket)();
      }
      if (!S.statsTimer) S.statsTimer = setInterval(pollStats, 1000);
    } catch (err) {
      if (run.cancelled) return;  // the restart that cancelled it goes on
      setBadge("error", "off");
      log(String(err.message || err), true);
    }
  }

  // one restart at a time: a second one (the selector changed twice) follows the first
  let restarting = Promise.resolve();
  const restart = () => (restarting = restarting.then(restartNow)
    .catch((err) => log(String(err.message || err), true)));
  async function restartNow() {
    if (starting) { starting.cancelled = true; teardown(); await starting.done; }
    const old = S.session;
    if (old) old.closed = true;  // closed by the user: never re-offered (reconnect.js)
    teardown();
    S.session = old;
    if (old) await api("DELETE", `/api/sessions/${old.session_id}`).catch(() => {});
    S.session = null;
    $("ws-download").classList.add("ws-disabled");
    $("ws-previews").replaceChildren();
    await start();
  }

  // ------------------------------------------------------------------ controls
  function sendPrompt() {
    const text = $("ws-prompt").value.trim();
    if (!text) { log("the prompt is empty", true); return; }
    const msg = { type: "prompt", seq: nextSeq(), t: performance.now(), text };
    const blendText = $("ws-blend-text").value.trim();
    const weight = parseFloat($("ws-blend").value);
    if (blendText && weight > 0) msg.blend = { text: blendText, weight };
    send(msg);
    log(`prompt: ${text}${msg.blend ? ` + ${weight.toFixed(2)} × ${blendText}` : ""}`);
  }

  function mount(root) {
    root.dataset.mounted = "1";
    document.addEventListener("keydown", onKey, true);
    document.addEventListener("keyup", onKey, true);
    window.addEventListener("blur", releaseAll);
    const stage = $("ws-stage");
    stage.addEventListener("click", () => stage.focus());
    if ($("ws-prompt")) {  // a game world has no prompt
      $("ws-prompt-send").onclick = sendPrompt;
      $("ws-prompt").addEventListener("keydown", (e) => { if (e.key === "Enter") sendPrompt(); });
      $("ws-blend").addEventListener("input", () => {
        $("ws-blend-value").textContent = parseFloat($("ws-blend").value).toFixed(2);
      });
      $("ws-blend").addEventListener("change", sendPrompt);
    }
    $("ws-apply").onclick = () => send({ type: "settings", seq: nextSeq(),
      steps: parseInt($("ws-steps").value, 10) });
    $("ws-mode").onchange = () => {
      send({ type: "settings", seq: nextSeq(), mode: $("ws-mode").value });
      log(`mode: ${$("ws-mode").value}`);
    };
    $("ws-restart").onclick = restart;
    $("ws-transport").onchange = restart;
    $("ws-rewind").onclick = () => send({ type: "rewind", seq: nextSeq(), chunks: 2 });
    $("ws-fork").onclick = () => { send({ type: "fork", seq: nextSeq(), k: 4 });
      log("generating 4 futures…"); };
    $("ws-record").onclick = () => send({ type: "record", seq: nextSeq(), on: !S.recording });
    if (root.dataset.world === "avatar") {
      document.querySelectorAll("[data-expression]").forEach((el, i) => {
        EXPRESSION_OF_DIGIT[`Digit${i + 1}`] = el.dataset.expression;
        el.onclick = () => sendAvatar({ expression: el.dataset.expression });
      });
      $("ws-say-send").onclick = sendSay;
      $("ws-say").addEventListener("keydown", (e) => { if (e.key === "Enter") sendSay(); });
    }
    window.addEventListener("beforeunload", () => {
      S.closing = true;  // never re-offered (reconnect.js)
      if (S.session) {
        fetch(`/api/sessions/${S.session.session_id}`, { method: "DELETE", keepalive: true,
          headers: { Authorization: `Bearer ${S.session.token}` } });
      }
    });
    start();
  }

  // Gradio renders the page after this script runs: mount once the player markup exists.
  const waitForRoot = setInterval(() => {
    const root = document.getElementById("ws-root");
    if (root && !root.dataset.mounted) { clearInterval(waitForRoot); mount(root); }
  }, 100);
})();
