// worldstream playground page: the page state (window.worldstream), server messages, key
// capture, steering controls and the session's start and restart; its parts are the
// transports (transports.js), frame matching (present.js) and the latency HUD (hud.js). Wire
// protocol: streaming/PROTOCOL.md + streaming/PROTOCOL_EXTENSIONS.md. Per-frame and per-key traffic
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
        S.presentedEarly(msg);
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
      setBadge("session ended", "off");  // no reconnect follows to say so
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
  S.onServerMessage = onServerMessage;  // transports.js feeds it
  S.sendKeys = sendKeys;

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
          S.session = await S.api("POST", "/api/sessions",
            { prompt, seed: Number.isFinite(seed) ? seed : undefined });
        } catch (err) {
          if (err.status !== 503) throw err;
          log(`server full, retrying in ${err.retryAfter} s`, true);
          await new Promise((r) => setTimeout(r, 1000 * (err.retryAfter || 5)));
        }
      }
      live();
      $("ws-status").textContent = `${S.session.width}×${S.session.height} @ ${S.session.fps} fps`;
      // a pixel-art world (a game) is drawn with hard pixel edges; others smoothly
      $("ws-stage").classList.toggle("ws-pixel-art", Boolean(S.session.pixel_art));
      const pref = $("ws-transport").value;
      if (pref !== "websocket") {
        try {
          await S.startWebRTC();
        } catch (err) {
          if (pref === "webrtc" || run.cancelled) throw err;
          log(`WebRTC unavailable (${err.message}); using the WebSocket fallback`);
          teardown();
          await (S.openWebSocket || S.startWebSocket)();
        }
      } else {
        await (S.openWebSocket || S.startWebSocket)();
      }
      if (!S.statsTimer) S.statsTimer = setInterval(S.pollStats, 1000);
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
    if (old) await S.api("DELETE", `/api/sessions/${old.session_id}`).catch(() => {});
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
