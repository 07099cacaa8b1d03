// A small Socket.IO client for the dashboard: Engine.IO v4 over WebSocket
// only (no polling, no binary), one namespace ("/"), JSON events and acks.
//
//   Engine.IO: "0{...}" open, "2" ping -> "3" pong, "4<socket.io packet>".
//   Socket.IO: "0{auth}" connect, "0{sid}" connected, "4{message}" refused,
//              "2[...]" event, "2<id>[...]" event asking for an ack,
//              "3<id>[...]" ack.
//
// It reconnects by itself (backoff up to 5 s) unless the server refused the
// credential, which is reported to onRefused and ends the client.
"use strict";

export class SocketIO {
  constructor(url, auth, handlers) {
    this.url = url;
    this.auth = auth;
    this.h = handlers; // {onConnect, onDisconnect(reason), onRefused(message), onEvent(name, args)}
    this.ws = null;
    this.acks = new Map();
    this.nextAck = 0;
    this.closed = false;
    this.backoff = 500;
    this.pingTimer = 0;
    this.connected = false;
  }

  open() {
    if (this.closed) return;
    const ws = new WebSocket(this.url);
    this.ws = ws;
    ws.onmessage = (m) => this.onFrame(ws, m.data);
    ws.onclose = () => this.onClose(ws, "transport close");
    ws.onerror = () => {}; // onclose follows
  }

  close() {
    this.closed = true;
    clearTimeout(this.pingTimer);
    if (this.ws) this.ws.close();
  }

  onFrame(ws, data) {
    if (ws !== this.ws || typeof data !== "string" || data.length === 0) return;
    const kind = data[0];
    if (kind === "0") {
      // Engine.IO open: arm the liveness timer, then join the namespace.
      try {
        const o = JSON.parse(data.slice(1));
        this.pingWindow = (o.pingInterval || 25000) + (o.pingTimeout || 20000);
      } catch {
        this.pingWindow = 45000;
      }
      this.armPing(ws);
      ws.send("40" + JSON.stringify(this.auth));
    } else if (kind === "2") {
      ws.send("3");
      this.armPing(ws);
    } else if (kind === "1") {
      ws.close();
    } else if (kind === "4") {
      this.onPacket(ws, data.slice(1));
    }
  }

  // armPing drops a connection whose server stopped pinging (a half-open
  // TCP connection): the reconnect finds a live server.
  armPing(ws) {
    clearTimeout(this.pingTimer);
    this.pingTimer = setTimeout(() => {
      if (ws === this.ws) ws.close();
    }, this.pingWindow + 1000);
  }

  onPacket(ws, p) {
    const type = p[0];
    let i = 1;
    if (p[i] === "/") {
      const comma = p.indexOf(",", i);
      i = comma < 0 ? p.length : comma + 1; // other namespaces are not used
    }
    let id = "";
    while (i < p.length && p[i] >= "0" && p[i] <= "9") id += p[i++];
    let body;
    try {
      body = i < p.length ? JSON.parse(p.slice(i)) : undefined;
    } catch {
      return;
    }
    switch (type) {
      case "0":
        this.connected = true;
        this.backoff = 500;
        this.h.onConnect && this.h.onConnect();
        break;
      case "4": {
        const msg = (body && body.message) || "refused";
        this.closed = true;
        ws.close();
        this.h.onRefused && this.h.onRefused(msg);
        break;
      }
      case "1":
        ws.close();
        break;
      case "2":
        if (Array.isArray(body) && typeof body[0] === "string") {
          this.h.onEvent && this.h.onEvent(body[0], body.slice(1));
          if (id !== "") ws.send("43" + id + "[]");
        }
        break;
      case "3": {
        const cb = this.acks.get(id);
        if (cb) {
          this.acks.delete(id);
          this.acks.delete("reject:" + id);
          cb(Array.isArray(body) ? body : []);
        }
        break;
      }
    }
  }

  // emit sends an event; with ack, it returns a promise of the ack's
  // arguments (rejected when the connection closes first).
  emit(name, arg, ack) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) {
      return ack ? Promise.reject(new Error("not connected")) : undefined;
    }
    const args = JSON.stringify(arg === undefined ? [name] : [name, arg]);
    if (!ack) {
      this.ws.send("42" + args);
      return undefined;
    }
    const id = String(this.nextAck++);
    return new Promise((resolve, reject) => {
      this.acks.set(id, (a) => resolve(a));
      this.acks.set("reject:" + id, reject);
      this.ws.send("42" + id + args);
    });
  }

  onClose(ws, reason) {
    if (ws !== this.ws) return;
    clearTimeout(this.pingTimer);
    const was = this.connected;
    this.connected = false;
    for (const [k, f] of this.acks) {
      if (k.startsWith("reject:")) f(new Error("disconnected"));
    }
    this.acks.clear();
    this.ws = null;
    if (was && this.h.onDisconnect) this.h.onDisconnect(reason);
    if (this.closed) return;
    const wait = this.backoff * (0.75 + Math.random() / 2);
    this.backoff = Math.min(this.backoff * 2, 5000);
    setTimeout(() => this.open(), wait);
  }
}
