package engineio

import (
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"syscall"
)

// Server-to-client websocket data frames are written by this package, not by
// coder/websocket: a server frame is never masked and compression is not
// negotiated, so the frame of a message is the same bytes for every
// recipient and is built once per Message (see Message.wsFrames). That lets
// a broadcast write a member's frame directly from the broadcasting
// goroutine with one non-blocking system call, as an event-loop server does,
// instead of waking a writer goroutine per member; only a member whose
// socket buffer is full (or whose writer is already busy) gets the frame
// queued for a writer goroutine. coder/websocket still reads, answers pings
// and sends the close frame: its writes go through wsConn.Write, which takes
// the same lock, and a control frame fits in its write buffer, so it reaches
// the connection in one Write and frames never interleave.

// wsConn is the hijacked connection of a websocket session as the writers
// see it.
type wsConn struct {
	mu   sync.Mutex // held for every write, whole frames at a time
	conn net.Conn
	sc   syscall.RawConn // nil when the connection has no file descriptor (TLS, pipes)

	// Arguments and results of tryDo, set under mu (a bound method value,
	// so that a write allocates nothing).
	p     []byte
	n     int
	errno error
	do    func(fd uintptr) bool
}

func newWSConn(conn net.Conn) *wsConn {
	w := &wsConn{conn: conn}
	if s, ok := conn.(syscall.Conn); ok {
		if sc, err := s.SyscallConn(); err == nil {
			w.sc = sc
			w.do = w.tryDo
		}
	}
	return w
}

// Write writes p in full (blocking); coder/websocket's writer flushes into it.
func (w *wsConn) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.conn.Write(p)
}

// writeBlocking writes bufs in full with as few system calls as the kernel
// allows (writev on a TCP connection).
func (w *wsConn) writeBlocking(bufs net.Buffers) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, err := bufs.WriteTo(w.conn)
	return err
}

// errWouldBlock: tryWrite wrote nothing because the socket buffer is full,
// another write holds the connection or it cannot write without blocking.
var errWouldBlock = errors.New("engineio: write would block")

// tryWrite writes as much of p as the socket takes without blocking and
// returns how much that was. It returns errWouldBlock with n == 0 when it
// could not write at all.
func (w *wsConn) tryWrite(p []byte) (int, error) {
	if w.sc == nil || !w.mu.TryLock() {
		return 0, errWouldBlock
	}
	defer w.mu.Unlock()
	w.p, w.n, w.errno = p, 0, nil
	err := w.sc.Write(w.do)
	n, errno := w.n, w.errno
	w.p, w.errno = nil, nil
	switch {
	case err != nil:
		return n, err
	case errno != nil:
		return n, errno
	case n == 0:
		return 0, errWouldBlock
	}
	return n, nil
}

func (w *wsConn) tryDo(fd uintptr) bool {
	for len(w.p) > 0 {
		n, err := syscall.Write(int(fd), w.p)
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.EAGAIN {
			return true
		}
		if err != nil {
			w.errno = err
			return true
		}
		w.n += n
		w.p = w.p[n:]
	}
	return true
}

// Websocket opcodes of the data frames this package writes.
const (
	opText   = 0x1
	opBinary = 0x2
)

// appendFrame appends one final, unmasked websocket frame carrying p.
func appendFrame(dst []byte, op byte, p []byte) []byte {
	dst = append(dst, 0x80|op)
	switch n := len(p); {
	case n < 126:
		dst = append(dst, byte(n))
	case n <= 0xffff:
		dst = append(dst, 126)
		dst = binary.BigEndian.AppendUint16(dst, uint16(n))
	default:
		dst = append(dst, 127)
		dst = binary.BigEndian.AppendUint64(dst, uint64(n))
	}
	return append(dst, p...)
}

func frameLen(p []byte) int {
	switch n := len(p); {
	case n < 126:
		return 2 + n
	case n <= 0xffff:
		return 4 + n
	default:
		return 10 + n
	}
}

// wsFrames returns the websocket frames of m, contiguous: its text message
// (if any) and then its binary messages. They are built on first use and
// shared by every recipient.
func (m *Message) wsFrames() []byte {
	if f := m.frames.Load(); f != nil {
		return *f
	}
	if m.raw != nil {
		return m.raw
	}
	size := 0
	if m.text != nil {
		size += frameLen(m.text)
	}
	for _, b := range m.bins {
		size += frameLen(b)
	}
	f := make([]byte, 0, size)
	if m.text != nil {
		f = appendFrame(f, opText, m.text)
	}
	for _, b := range m.bins {
		f = appendFrame(f, opBinary, b)
	}
	m.frames.CompareAndSwap(nil, &f)
	return *m.frames.Load()
}
