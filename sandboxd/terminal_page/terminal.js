// The terminal page of sandboxd (docs/extensions.rst, "The terminal page"), served at
// /sandboxes/{rid}/terminal. The token comes from the fragment (#token=...; the fragment is
// never sent to a server) or a prompt, never from a query string a log could keep; it is
// removed from the address bar at once. The page starts a terminal in the sandbox (or
// attaches to #terminal=ID), then opens its WebSocket with the token in a subprotocol
// (a browser's WebSocket sends no Authorization header).
"use strict";
(function () {
  const status = document.getElementById("status");
  function say(text, refused) {
    status.textContent = text;
    status.className = refused ? "refused" : "";
  }

  const fragment = new URLSearchParams(location.hash.slice(1));
  let token = fragment.get("token");
  if (token === null) token = window.prompt("sandboxd token") || "";
  history.replaceState(null, "", location.pathname);

  function base64url(text) {
    let binary = "";
    for (const byte of new TextEncoder().encode(text)) binary += String.fromCharCode(byte);
    return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  const term = new Terminal({ cursorBlink: true, scrollback: 5000 });
  const fit = new FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(document.getElementById("terminal"));
  fit.fit();

  async function refusal(response) {
    let detail = "";
    try {
      const body = await response.json();
      detail = (body.error || "") + ": " + (body.detail || "");
    } catch (e) {
      detail = response.statusText;
    }
    return "refused: " + response.status + " " + detail;
  }

  async function terminalId() {
    if (fragment.get("terminal")) return fragment.get("terminal");
    const response = await fetch(location.pathname + "s", {
      method: "POST",
      headers: { "Authorization": "Bearer " + token, "Content-Type": "application/json" },
      body: JSON.stringify({ rows: term.rows, cols: term.cols, term: "xterm-256color" }),
    });
    if (!response.ok) throw new Error(await refusal(response));
    return (await response.json()).id;
  }

  function attach(id) {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const url = scheme + "//" + location.host + location.pathname + "s/" + encodeURIComponent(id);
    const socket = new WebSocket(url, ["sandboxd.terminal", "sandboxd.bearer." + base64url(token)]);
    socket.binaryType = "arraybuffer";
    const encoder = new TextEncoder();
    let ended = null;
    socket.onopen = function () {
      say("connected: terminal " + id);
      socket.send(JSON.stringify({ resize: { rows: term.rows, cols: term.cols } }));
      term.focus();
    };
    socket.onmessage = function (event) {
      if (typeof event.data !== "string") {
        term.write(new Uint8Array(event.data));
        return;
      }
      const message = JSON.parse(event.data);
      ended = "exit" in message
        ? "the terminal ended: exit " + message.exit
        : "the terminal ended: " + message.error + ": " + message.message;
    };
    socket.onclose = function (event) {
      if (ended !== null) say(ended);
      else if (event.code === 1006) say("refused: the daemon closed the connection (a wrong token?)", true);
      else say("closed: " + event.code + " " + event.reason, event.code >= 4000);
    };
    term.onData(function (data) {
      if (socket.readyState === WebSocket.OPEN) socket.send(encoder.encode(data));
    });
    term.onBinary(function (data) {
      if (socket.readyState !== WebSocket.OPEN) return;
      socket.send(Uint8Array.from(data, function (c) { return c.charCodeAt(0); }));
    });
    term.onResize(function (size) {
      if (socket.readyState === WebSocket.OPEN) {
        socket.send(JSON.stringify({ resize: { rows: size.rows, cols: size.cols } }));
      }
    });
  }

  window.addEventListener("resize", function () { fit.fit(); });
  say("starting a terminal");
  terminalId().then(attach, function (error) { say(error.message, true); });
})();
