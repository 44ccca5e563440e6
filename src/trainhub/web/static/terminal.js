// The dashboard's web terminal of a session (web/session_pages.py): xterm.js over the
// session server's terminal WebSocket (jupyter-server-terminals' JSON messages: ["stdin", s],
// ["stdout", s], ["set_size", rows, cols, height, width]), all through the control plane's
// proxy, which authenticates the dashboard's cookie on the POST and on the WebSocket.
"use strict";
(async function () {
  const box = document.getElementById("terminal");
  if (!box || typeof Terminal === "undefined") return;
  const base = box.dataset.base;
  const term = new Terminal({ cursorBlink: true, rows: 30, cols: 110, scrollback: 5000 });
  term.open(box);
  let name;
  try {
    const made = await fetch(base + "api/terminals", { method: "POST", credentials: "same-origin" });
    if (!made.ok) throw new Error("HTTP " + made.status + " " + (await made.text()).slice(0, 200));
    name = (await made.json()).name;
  } catch (err) {
    box.dataset.state = "failed";
    term.write("cannot open a terminal: " + err.message + "\r\n");
    return;
  }
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const url = scheme + "//" + location.host + base + "terminals/websocket/" + encodeURIComponent(name);
  const ws = new WebSocket(url);
  const send = (message) => { if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(message)); };
  ws.onopen = () => {
    box.dataset.state = "open";
    send(["set_size", term.rows, term.cols, box.clientHeight, box.clientWidth]);
    term.focus();
  };
  ws.onmessage = (event) => {
    const message = JSON.parse(event.data);
    if (message[0] === "stdout") term.write(message[1]);
    else if (message[0] === "disconnect") term.write("\r\n[the terminal ended]\r\n");
  };
  ws.onclose = () => {
    box.dataset.state = "closed";
    term.write("\r\n[disconnected]\r\n");
  };
  term.onData((data) => send(["stdin", data]));
})();
