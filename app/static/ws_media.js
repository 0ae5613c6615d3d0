// worldstream page add-on (issue 55): the WebSocket fallback from the host that generates the
// session. With `play --replicas N --media-from replica` the session's replica serves its
// WebSocket itself (same protocol, same token); GET /api/sessions/{id}/ws-url names it
// (streaming/PROTOCOL_EXTENSIONS.md, "Media from the replicas' hosts"). The page tries that URL
// first and falls back to this server's own route when there is none or it cannot be reached
// within CONNECT_MS: a client that reaches only this server's origin (the usual reason for a
// WebSocket fallback: a proxy or firewall that passes nothing else, an https page that may not
// open a ws: URL) keeps working, its frames then cost this server as before.
// On a failover the replica's WebSocket dies with it; mirroring reconnect.js (WebRTC), a
// watchdog takes it for gone when it closes or neither a frame nor a message came for
// SILENCE_MS, asks where the session is now (503 while it moves) and reconnects; the new
// connection carries the `recovered` event. A WebSocket to this server's route needs none of
// this: the server follows the session itself.
(() => {
  "use strict";
  const TICK_MS = 100;
  const CONNECT_MS = 3000;   // the replica's address does not answer by then: this server's
  // neither a frame nor a message this long: gone (stats and pongs come every second, also to
  // a hidden tab, which asks for no frame)
  const SILENCE_MS = 2000;
  const MAX_TRIES = 20;      // per recovery: a move answers 503 for about a second
  const ENDED = new Set([400, 401, 403, 404]);  // the session (or its token) is no more

  let busy = false;

  // the current WebSocket closed and forgotten (its late messages must not count)
  function dropWs(S) {
    const ws = S.ws;
    S.ws = null;
    if (ws) { ws.onclose = null; ws.onmessage = null; ws.close(); }
  }

  // connect to `url`, or reject after CONNECT_MS (an unroutable address can hang far longer)
  async function connectWithin(S, url) {
    let timer;
    const late = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no answer in ${CONNECT_MS} ms`)), CONNECT_MS);
    });
    try {
      await Promise.race([S.startWebSocket(url), late]);
    } catch (err) {
      dropWs(S);
      throw err;
    } finally {
      clearTimeout(timer);
    }
  }

  // open the session's WebSocket: its replica's first, else this server's route. `strict`
  // (a recovery): a failed ask (503: the session is moving) throws, to be retried
  async function open(strict) {
    const S = window.worldstream;
    let url = null;
    try {
      url = (await S.api("GET", `/api/sessions/${S.session.session_id}/ws-url`)).ws_url;
    } catch (err) {
      if (strict || ENDED.has(err.status)) throw err;
    }
    if (url) {
      try {
        await connectWithin(S, url);
        S.wsFrom = "replica";
        return;
      } catch (err) {
        S.log(`the replica's WebSocket failed (${err.message}); using this server's`);
      }
    }
    await S.startWebSocket();
    S.wsFrom = "front";
  }

  function watch() {
    const S = window.worldstream;
    if (busy || S.connecting || S.closing || S.ended || !S.session || S.session.closed
        || S.transport !== "websocket" || S.wsFrom !== "replica" || !S.ws) return;
    const now = performance.now(), last = S.lastMessageAt;
    const why = S.ws.readyState >= WebSocket.CLOSING ? "WebSocket closed"
      : last && now - last >= SILENCE_MS ? `nothing for ${Math.round(now - last)} ms` : null;
    if (why) recover(S, why);
  }

  async function recover(S, why) {
    busy = true;
    const session = S.session, t0 = performance.now();
    const live = () => S.session === session && !session.closed && !S.closing && !S.ended;
    const attempt = { at: t0, why, tries: 0, ok: false };
    S.wsReconnects.push(attempt);
    S.setBadge("reconnecting…", "reconnecting");
    S.log(`WebSocket stopped (${why}): reconnecting…`);
    dropWs(S);
    try {
      await S.reconnectLoop(attempt, "tries", MAX_TRIES, live, async () => {
        await open(true);
        if (!live()) { dropWs(S); return; }
        Object.assign(attempt, { ok: true, ms: performance.now() - t0, to: S.wsFrom });
        S.log(`reconnected in ${(attempt.ms / 1000).toFixed(1)} s`);
      });
    } finally {
      busy = false;
    }
  }

  // play.js defines window.worldstream (deferred scripts run in order); mount once it has
  const waitForPage = setInterval(() => {
    const S = window.worldstream;
    if (!S || !S.startWebSocket) return;
    clearInterval(waitForPage);
    Object.assign(S, { openWebSocket: () => open(false), wsFrom: null, wsReconnects: [] });
    setInterval(watch, TICK_MS);
  }, 100);
})();
