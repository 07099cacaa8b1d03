package sio

import (
	"strings"
	"testing"
	"time"
)

// Namespaces over raw websocket: several on one Engine.IO session, each with
// its own auth and handler; a custom one joined and left while "/" stays.

func TestNamespacesMultiplexed(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	w, _ := connectWS(t, ts)

	w.send(`40/admin,{"token":"admin"}`)
	got := w.next()
	if !strings.HasPrefix(got, `40/admin,{"sid":"`) {
		t.Fatalf("admin CONNECT reply %q", got)
	}
	w.send(`42/admin,1["whoami"]`)
	if got := w.next(); got != `43/admin,1["/admin"]` {
		t.Fatalf("whoami %q", got)
	}
	w.send(`420["echo","root"]`)
	if got := w.next(); got != `430["root"]` {
		t.Fatalf("root echo %q", got)
	}
	if n := ts.srv.Namespace("/admin").NumSockets(); n != 1 {
		t.Fatalf("admin sockets %d", n)
	}

	// A binary event with an ack on the custom namespace.
	w.send(`451-/admin,5["echo",{"_placeholder":true,"num":0}]`)
	w.sendBinary([]byte{0xde, 0xad})
	if got := w.next(); got != `461-/admin,5[{"_placeholder":true,"num":0}]` {
		t.Fatalf("binary ack %q", got)
	}
	if b := w.nextBinary(); string(b) != "\xde\xad" {
		t.Fatalf("attachment %x", b)
	}

	// Rooms are per namespace: a broadcast in /admin's "r" skips "/"'s "r".
	w.send(`420["join","r"]`)
	w.next()
	w.send(`42/admin,2["join","r"]`)
	w.next()
	w.send(`42/admin,3["broadcast","r","admins only"]`)
	if got := w.next(); got != `42/admin,["news","admins only"]` {
		t.Fatalf("admin broadcast %q", got)
	}
	if got := w.next(); got != `43/admin,3[true]` {
		t.Fatalf("broadcast ack %q", got)
	}

	// Leave /admin; "/" stays up; join /admin again.
	w.send(`41/admin,`)
	select {
	case rec := <-ts.admin.disconnCh:
		if rec.reason != ReasonClientNamespaceDisconnect {
			t.Fatalf("admin disconnect reason %q", rec.reason)
		}
	case <-time.After(ioTimeout):
		t.Fatal("no admin OnDisconnect")
	}
	w.send(`421["echo","still"]`)
	if got := w.next(); got != `431["still"]` {
		t.Fatalf("root after leaving admin %q", got)
	}
	w.send(`42/admin,["whoami"]`) // not joined any more
	if code := w.closed(ioTimeout); code != CloseCodeParseError {
		t.Fatalf("event for a namespace left: close %d", code)
	}
}

func TestNamespaceRejoinAndRefusal(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	w, _ := connectWS(t, ts)
	w.send(`40/admin,{"token":"nope"}`)
	if got := w.next(); got != `44/admin,{"data":{"reason":"admin only"},"message":"not authorized"}` {
		t.Fatalf("refusal %q", got)
	}
	w.send(`40/nope,`)
	if got := w.next(); got != `44/nope,{"message":"Invalid namespace"}` {
		t.Fatalf("unknown namespace %q", got)
	}
	for range 2 {
		w.send(`40/admin,{"token":"admin"}`)
		if got := w.next(); !strings.HasPrefix(got, `40/admin,{"sid":`) {
			t.Fatalf("admin CONNECT %q", got)
		}
		w.send(`41/admin,`)
		<-ts.admin.disconnCh
	}
	w.send(`420["echo","ok"]`)
	if got := w.next(); got != `430["ok"]` {
		t.Fatalf("root %q", got)
	}
}

// TestNamespaceOnlyCustom: a session in a custom namespace only is not
// closed by the connect timeout.
func TestNamespaceOnlyCustom(t *testing.T) {
	t.Parallel()
	ts := startServer(t, testConfig(), nil)
	w, _ := openWS(t, ts)
	w.send(`40/admin,{"token":"admin"}`)
	w.next()
	deadline := time.Now().Add(3 * time.Second) // past ConnectTimeout (2 s)
	for i := 0; time.Now().Before(deadline); i++ {
		w.send(`42/admin,` + itoa(i+1) + `["echo",1]`)
		if got := w.next(); got != `43/admin,`+itoa(i+1)+`[1]` {
			t.Fatalf("echo %q", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
