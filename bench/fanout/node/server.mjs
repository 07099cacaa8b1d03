// The reference: a Node socket.io server with the same behaviour as the Go
// server of bench/fanout. A "join" event joins room "r" and is acked with
// "joined". Commands arrive on stdin, one per line:
//
//	emit <events> <interval ms> <padding bytes>   broadcast ["tick", seq, sentUnixNano, pad] to "r"
//	gc                                             collect garbage (node --expose-gc)
//
// and every command is answered on stdout ("emitted" / "collected"). The
// first line on stdout is "port <n>".
import { createServer } from 'node:http';
import { createInterface } from 'node:readline';
import { Server } from 'socket.io';

const http = createServer();
const io = new Server(http, { maxHttpBufferSize: 1e6 });
io.on('connection', (socket) => {
  socket.on('join', (ack) => {
    socket.join('r');
    if (typeof ack === 'function') ack('joined');
  });
});

const nowNs = () => Math.round((performance.timeOrigin + performance.now()) * 1e6);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

http.listen(0, '127.0.0.1', () => {
  console.log(`port ${http.address().port}`);
});

const rl = createInterface({ input: process.stdin });
rl.on('line', async (line) => {
  const [cmd, ...args] = line.trim().split(/\s+/);
  if (cmd === 'emit') {
    const [events, interval, padding] = args.map(Number);
    const pad = 'x'.repeat(padding);
    for (let i = 0; i < events; i++) {
      io.to('r').emit('tick', i, nowNs(), pad);
      await sleep(interval);
    }
    console.log('emitted');
  } else if (cmd === 'gc') {
    if (global.gc) global.gc();
    await sleep(200);
    if (global.gc) global.gc();
    console.log('collected');
  }
});
rl.on('close', () => process.exit(0));
