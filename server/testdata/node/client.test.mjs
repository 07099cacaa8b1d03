// Drives the Go Socket.IO server (URL in SIO_URL) with the real socket.io-client.
// Run by server/sio's TestNodeClient; the server pings every 300 ms (pingTimeout
// 1 s, generous for loaded CI machines) and implements the events used below.
import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { io } from 'socket.io-client';

const URL = process.env.SIO_URL;
if (!URL) throw new Error('SIO_URL is not set');

const sockets = [];

function connect(transports, opts = {}) {
  const socket = io(URL, {
    forceNew: true,
    reconnection: false,
    timeout: 5000,
    ...(transports ? { transports } : {}),
    ...opts,
  });
  sockets.push(socket);
  return socket;
}

function once(emitter, event, ms = 5000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timeout waiting for ${event}`)), ms);
    emitter.once(event, (...args) => {
      clearTimeout(timer);
      resolve(args);
    });
  });
}

async function connected(socket) {
  if (!socket.connected) await once(socket, 'connect');
  return socket;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

after(() => {
  for (const s of sockets) s.disconnect();
});

const modes = [
  { name: 'websocket', transports: ['websocket'], final: 'websocket' },
  { name: 'default (polling then upgrade)', transports: undefined, final: 'websocket' },
  { name: 'polling', transports: ['polling'], final: 'polling' },
];

for (const mode of modes) {
  describe(`transport ${mode.name}`, () => {
    it('connects with auth and ends on the expected transport', async () => {
      const socket = connect(mode.transports, { auth: { token: 'js' } });
      let upgraded = null;
      // Register on the manager's open: the upgrade can finish before connect.
      socket.io.on('open', () => {
        socket.io.engine.on('upgrade', (t) => { upgraded = t.name; });
      });
      const authEvent = once(socket, 'auth');
      await connected(socket);
      assert.equal(typeof socket.id, 'string');
      const [auth] = await authEvent;
      assert.deepEqual(auth, { token: 'js' });
      if (mode.final === 'websocket' && socket.io.engine.transport.name !== 'websocket') {
        await once(socket.io.engine, 'upgrade');
      }
      assert.equal(socket.io.engine.transport.name, mode.final);
      if (mode.transports === undefined) assert.equal(upgraded, 'websocket');
      socket.disconnect();
    });

    it('timeout().emitWithAck round-trips JSON (ack id 0 first)', async () => {
      const socket = await connected(connect(mode.transports));
      const payload = { job: 'j1', n: 3, nested: { list: [1, 'two', null, true] }, text: 'ünïcødé ✓' };
      const res = await socket.timeout(3000).emitWithAck('echo', payload);
      assert.deepEqual(res, payload);
      const res2 = await socket.timeout(3000).emitWithAck('echo', 'second');
      assert.equal(res2, 'second');
      socket.disconnect();
    });

    it('round-trips a Buffer through a binary ack', async () => {
      const socket = await connected(connect(mode.transports));
      const buf = Buffer.from([0, 1, 2, 254, 255]);
      const res = await socket.timeout(3000).emitWithAck('echo', { file: buf, name: 'f.bin' });
      assert.equal(res.name, 'f.bin');
      assert.deepEqual(Buffer.from(res.file), buf);
      const top = await socket.timeout(3000).emitWithAck('echo', Buffer.from('hello'));
      assert.equal(Buffer.from(top).toString(), 'hello');
      socket.disconnect();
    });

    it('answers a server→client ack', async () => {
      const socket = await connected(connect(mode.transports));
      socket.on('question', (q, cb) => cb({ answer: q.n * 2 }));
      const answer = once(socket, 'answer');
      socket.emit('ask', { n: 21 });
      const [res] = await answer;
      assert.deepEqual(res, { answer: 42 });
      socket.disconnect();
    });

    it('gets "io server disconnect" from Socket.Disconnect', async () => {
      const socket = await connected(connect(mode.transports));
      const dis = once(socket, 'disconnect');
      socket.emit('disconnect-me');
      const [reason] = await dis;
      assert.equal(reason, 'io server disconnect');
    });

    it('stays connected over several heartbeat intervals', async () => {
      const socket = await connected(connect(mode.transports));
      const id = socket.id;
      let dropped = null;
      socket.on('disconnect', (r) => { dropped = r; });
      await sleep(2000); // ~6 ping intervals, and longer than pingInterval + pingTimeout
      assert.equal(dropped, null);
      assert.equal(socket.connected, true);
      assert.equal(socket.id, id);
      const res = await socket.timeout(3000).emitWithAck('echo', 'still here');
      assert.equal(res, 'still here');
      socket.disconnect();
    });

    it('reports a refused CONNECT as connect_error with message and data', async () => {
      const socket = connect(mode.transports, { auth: { token: 'bad' } });
      const [err] = await once(socket, 'connect_error');
      assert.equal(err.message, 'not authorized');
      assert.deepEqual(err.data, { reason: 'bad token' });
      assert.equal(socket.connected, false);
      socket.disconnect();
    });

    it('receives a room broadcast', async () => {
      const room = `room-${mode.name}`;
      const a = await connected(connect(mode.transports));
      const b = await connected(connect(mode.transports));
      const outsider = await connected(connect(mode.transports));
      assert.equal(await a.timeout(3000).emitWithAck('join', room), 'joined');
      assert.equal(await b.timeout(3000).emitWithAck('join', room), 'joined');
      let outsiderGot = false;
      outsider.on('news', () => { outsiderGot = true; });
      const na = once(a, 'news');
      const nb = once(b, 'news');
      assert.equal(await outsider.timeout(3000).emitWithAck('broadcast', room, { hello: room }), true);
      assert.deepEqual((await na)[0], { hello: room });
      assert.deepEqual((await nb)[0], { hello: room });
      // A round trip on the outsider orders after the broadcast it triggered.
      await outsider.timeout(3000).emitWithAck('echo', 1);
      assert.equal(outsiderGot, false);
      a.disconnect(); b.disconnect(); outsider.disconnect();
    });

    it('reconnects after the server drops the transport', async () => {
      const socket = connect(mode.transports, { reconnection: true, reconnectionDelay: 50, reconnectionDelayMax: 100 });
      await connected(socket);
      const first = socket.id;
      const dis = once(socket, 'disconnect');
      socket.emit('close-me');
      const [reason] = await dis;
      assert.ok(['transport close', 'transport error'].includes(reason), reason);
      await once(socket, 'connect');
      assert.notEqual(socket.id, first);
      assert.equal(await socket.timeout(3000).emitWithAck('echo', 'back'), 'back');
      socket.disconnect();
    });
  });
}
