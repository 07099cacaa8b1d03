// Namespaces and upgrade corners with the real socket.io-client, against the Go
// server started by server/sio's TestNodeClient ("/" plus "/admin", which only
// lets the token "admin" in).
import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { io, Manager } from 'socket.io-client';

const URL = process.env.SIO_URL;
if (!URL) throw new Error('SIO_URL is not set');

const managers = [];
const sockets = [];
after(() => {
  for (const s of sockets) s.disconnect();
  for (const m of managers) if (m.engine) m.engine.close();
});

function once(emitter, event, ms = 5000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timeout waiting for ${event}`)), ms);
    emitter.once(event, (...args) => {
      clearTimeout(timer);
      resolve(args);
    });
  });
}

for (const transports of [['websocket'], ['polling'], undefined]) {
  const label = transports ? transports[0] : 'default';
  describe(`namespaces over ${label}`, () => {
    it('multiplexes "/" and "/admin" on one engine, leaves and rejoins /admin while "/" stays', async () => {
      const m = new Manager(URL, { reconnection: false, timeout: 5000, ...(transports ? { transports } : {}) });
      managers.push(m);
      const root = m.socket('/');
      sockets.push(root);
      const admin = m.socket('/admin', { auth: { token: 'admin' } });
      sockets.push(admin);
      await Promise.all([once(root, 'connect'), once(admin, 'connect')]);
      assert.equal(root.io.engine, admin.io.engine);
      assert.equal(await admin.timeout(5000).emitWithAck('whoami'), '/admin');

      const blob = Buffer.from([1, 2, 3, 250]);
      const back = await admin.timeout(5000).emitWithAck('echo', blob);
      assert.ok(Buffer.from(back).equals(blob), 'binary ack on /admin');

      admin.disconnect();
      assert.equal(admin.connected, false);
      assert.equal(await root.timeout(5000).emitWithAck('echo', 'root still up'), 'root still up');

      admin.connect();
      await once(admin, 'connect');
      assert.equal(await admin.timeout(5000).emitWithAck('whoami'), '/admin');
      assert.equal(root.io.engine, admin.io.engine);
      root.disconnect();
      admin.disconnect();
    });

    it('gets connect_error for an unknown namespace and for refused auth', async () => {
      const m = new Manager(URL, { reconnection: false, timeout: 5000, ...(transports ? { transports } : {}) });
      managers.push(m);
      const nope = m.socket('/nope');
      sockets.push(nope);
      const [err] = await once(nope, 'connect_error');
      assert.equal(err.message, 'Invalid namespace');
      const refused = m.socket('/admin', { auth: { token: 'guest' } });
      sockets.push(refused);
      const [err2] = await once(refused, 'connect_error');
      assert.equal(err2.message, 'not authorized');
      assert.deepEqual(err2.data, { reason: 'admin only' });
      const root2 = m.socket('/');
      sockets.push(root2);
      await once(root2, 'connect');
      root2.disconnect();
    });
  });
}

describe('upgrade corners', () => {
  it('upgrades from polling to websocket and keeps working', async () => {
    const s = io(URL, { forceNew: true, reconnection: false, timeout: 5000 });
    sockets.push(s);
    await once(s, 'connect');
    if (s.io.engine.transport.name !== 'websocket') await once(s.io.engine, 'upgrade');
    assert.equal(s.io.engine.transport.name, 'websocket');
    assert.equal(await s.timeout(5000).emitWithAck('echo', 'upgraded'), 'upgraded');
    s.disconnect();
  });
});
