// A socket.io-client agent driven over stdin/stdout by Go tests that need
// many real client sockets on several servers (cmd/joblib's cluster test).
// Each stdin line is a JSON command {req, op, ...}; each stdout line is a
// JSON object: a reply {req, ok, result|error}, or an event
// {sock, event, payload} for everything a socket receives (and
// {sock, event: "$disconnect", reason} when one closes).
import { io } from "socket.io-client";
import { createInterface } from "node:readline";

const sockets = new Map();
const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");

async function handle(cmd) {
  switch (cmd.op) {
    case "connect": {
      // reconnection (off by default): the client reconnects by itself, as
      // a UI does; every connect is reported as "$connect" with the session
      // id and whether the session was recovered (recover: ask for it).
      const auth = cmd.recover ? { token: cmd.token, recover: true } : { token: cmd.token };
      const opts = { auth, reconnection: !!cmd.reconnection, reconnectionDelay: 200, reconnectionDelayMax: 1000, forceNew: true };
      if (cmd.transports) opts.transports = cmd.transports;
      if (cmd.headers) opts.extraHeaders = cmd.headers;
      const socket = io(cmd.url, opts);
      sockets.set(cmd.sock, socket);
      socket.onAny((event, payload) => out({ sock: cmd.sock, event, payload }));
      socket.on("connect", () => out({ sock: cmd.sock, event: "$connect", payload: { sid: socket.io.engine.id, recovered: socket.recovered } }));
      socket.on("disconnect", (reason) => out({ sock: cmd.sock, event: "$disconnect", reason }));
      await new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error("connect timed out")), 5000);
        socket.once("connect", () => { clearTimeout(timer); resolve(); });
        socket.once("connect_error", (err) => { clearTimeout(timer); reject(new Error("connect_error: " + err.message)); });
      });
      return { id: socket.id };
    }
    case "emit": {
      const socket = sockets.get(cmd.sock);
      if (!socket) throw new Error("no socket " + cmd.sock);
      return await socket.timeout(cmd.timeout ?? 5000).emitWithAck(cmd.event, cmd.payload);
    }
    case "emitn": {
      // n acknowledged emits one after the other; returns the milliseconds taken.
      const socket = sockets.get(cmd.sock);
      if (!socket) throw new Error("no socket " + cmd.sock);
      const start = performance.now();
      for (let i = 0; i < cmd.n; i++) {
        const ack = await socket.timeout(cmd.timeout ?? 5000).emitWithAck(cmd.event, cmd.payload);
        if (!ack || ack.ok !== true) throw new Error("ack " + JSON.stringify(ack));
      }
      return performance.now() - start;
    }
    case "close": {
      const socket = sockets.get(cmd.sock);
      if (socket) socket.close();
      sockets.delete(cmd.sock);
      return null;
    }
    case "sid": {
      // The Engine.IO session id (it names the node holding the session).
      const socket = sockets.get(cmd.sock);
      return socket?.io?.engine?.id ?? null;
    }
    case "transport": {
      const socket = sockets.get(cmd.sock);
      return socket?.io?.engine?.transport?.name ?? null;
    }
    default:
      throw new Error("unknown op " + cmd.op);
  }
}

const rl = createInterface({ input: process.stdin });
rl.on("line", (line) => {
  let cmd;
  try {
    cmd = JSON.parse(line);
  } catch (err) {
    out({ req: -1, ok: false, error: "bad json: " + err.message });
    return;
  }
  handle(cmd).then(
    (result) => out({ req: cmd.req, ok: true, result }),
    (err) => out({ req: cmd.req, ok: false, error: String(err?.message ?? err) }),
  );
});
rl.on("close", () => {
  for (const s of sockets.values()) s.close();
  process.exit(0);
});
