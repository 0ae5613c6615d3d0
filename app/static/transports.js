// worldstream page: the transports. WebRTC (one peer connection, its data channel and the
// video track in the one <video>) and the WebSocket fallback (JPEG frames drawn on a canvas,
// credit-paced), and the page's REST calls (S.api). Uses play.js's page state
// (window.worldstream): the session, onServerMessage, sendKeys, setBadge.
(() => {
  "use strict";
  const WEBRTC_TIMEOUT_MS = 6000;   // no frame presented by then: fall back to the WebSocket
  const WS_CREDITS = 2;             // frames requested ahead over the WebSocket
  const $ = (id) => document.getElementById(id);
  const S = window.worldstream;

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
      S.onServerMessage(msg);
    };
    dc.onopen = () => { if (S.pc === pc) { S.dc = dc; S.sendKeys(); } };
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
        S.rvfc = video.requestVideoFrameCallback(S.onVideoFrame);
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
    S.setBadge("WebRTC", "webrtc");
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
        S.setBadge("WebSocket (fallback)", "websocket");
        for (let i = 0; i < WS_CREDITS; i++) ws.send('{"type":"next"}');
        S.sendKeys();
        resolve();
      };
      ws.onerror = () => reject(new Error("WebSocket failed"));
      ws.onclose = () => { if (S.ws === ws) S.setBadge("disconnected", "off"); };
      ws.onmessage = async (e) => {
        S.lastMessageAt = performance.now();  // ws_media.js's watchdog
        if (typeof e.data === "string") { S.onServerMessage(JSON.parse(e.data)); return; }
        const view = new DataView(e.data);
        const size = view.getUint32(0);
        const meta = JSON.parse(new TextDecoder().decode(new Uint8Array(e.data, 4, size)));
        meta.received_at = performance.now();
        const bitmap = await createImageBitmap(new Blob([new Uint8Array(e.data, 4 + size)],
          { type: "image/jpeg" }));
        if (canvas.width !== bitmap.width) { canvas.width = bitmap.width; canvas.height = bitmap.height; }
        requestAnimationFrame((now) => {
          g.drawImage(bitmap, 0, 0);
          S.onPresented(meta, now);
          if (ws.readyState === WebSocket.OPEN) ws.send('{"type":"next"}');
        });
      };
    });
  }

  // A recovery's loop, shared by reconnect.js (WebRTC) and ws_media.js (WebSocket): calls
  // `tryOnce` until it resolves, the session is no longer `live()` or `max` tries are spent
  // (attempt[count] counts them, attempt.last keeps the last error). A refused session (400,
  // 401, 403, 404) ends the page's session; 503 (being moved) and 429 wait as the server says.
  const ENDED = new Set([400, 401, 403, 404]);
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  async function reconnectLoop(attempt, count, max, live, tryOnce) {
    while (live() && attempt[count] < max) {
      attempt[count]++;
      try {
        await tryOnce();
        return;
      } catch (err) {
        if (ENDED.has(err.status)) {
          S.ended = true;
          S.setBadge("session ended", "off");
          S.log(`the session has ended (${err.message}); press Restart`, true);
          return;
        }
        attempt.last = String(err.message || err);
        S.setBadge(`reconnecting… (${attempt[count]})`, "reconnecting");
        await sleep(err.retryAfter ? 1000 * err.retryAfter : 500);
      }
    }
    if (live()) {
      S.transport = null;  // the watchdogs stop here: Restart starts afresh
      S.setBadge("disconnected", "off");
      S.log(`could not reconnect (${attempt.last}); press Restart`, true);
    }
  }

  S.reconnectLoop = reconnectLoop;
  S.startWebSocket = startWebSocket;
  S.startWebRTC = startWebRTC;
})();
