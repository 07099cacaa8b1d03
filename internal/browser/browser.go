// Package browser drives a headless Chromium over the DevTools protocol
// (one WebSocket, flat sessions) for the dashboard's browser tests and its
// screenshots. It needs nothing but the chromium binary: Debian's
// `chromium` (scripts/test.sh installs it), or the one JOBLIB_CHROMIUM
// names.
package browser

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// Find returns the Chromium binary: $JOBLIB_CHROMIUM, else chromium,
// chromium-browser or google-chrome on PATH.
func Find() (string, error) {
	if p := os.Getenv("JOBLIB_CHROMIUM"); p != "" {
		return p, nil
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no chromium on PATH (Debian: apt-get install chromium; or set JOBLIB_CHROMIUM)")
}

// Browser is a running headless Chromium.
type Browser struct {
	cmd  *exec.Cmd
	dir  string
	conn *websocket.Conn

	next    atomic.Int64
	mu      sync.Mutex
	pending map[int64]chan reply
	done    chan struct{}
	err     error
}

type reply struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// Launch starts Chromium headless with a fresh profile and connects to it.
func Launch(ctx context.Context, bin string) (*Browser, error) {
	dir, err := os.MkdirTemp("", "joblib-chromium-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--no-first-run", "--disable-sync", "--disable-extensions",
		"--disable-default-apps", "--mute-audio", "--hide-scrollbars", "--disable-dev-shm-usage",
		"--user-data-dir="+dir, "--remote-debugging-port=0", "about:blank")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	b := &Browser{cmd: cmd, dir: dir, pending: map[int64]chan reply{}, done: make(chan struct{})}
	wsURL := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sent := false
		for sc.Scan() {
			if u, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "DevTools listening on "); ok && !sent {
				wsURL <- u
				sent = true
			}
		}
	}()
	var u string
	select {
	case u = <-wsURL:
	case <-ctx.Done():
		b.Close()
		return nil, fmt.Errorf("chromium did not announce its DevTools endpoint: %w", ctx.Err())
	}
	conn, _, err := websocket.Dial(ctx, u, nil)
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("connect to chromium: %w", err)
	}
	conn.SetReadLimit(64 << 20)
	b.conn = conn
	go b.read()
	return b, nil
}

func (b *Browser) read() {
	defer close(b.done)
	for {
		_, msg, err := b.conn.Read(context.Background())
		if err != nil {
			b.mu.Lock()
			b.err = err
			b.mu.Unlock()
			return
		}
		var m struct {
			ID int64 `json:"id"`
			reply
		}
		if json.Unmarshal(msg, &m) != nil || m.ID == 0 {
			continue // events are not used
		}
		b.mu.Lock()
		ch := b.pending[m.ID]
		delete(b.pending, m.ID)
		b.mu.Unlock()
		if ch != nil {
			ch <- m.reply
		}
	}
}

// call sends one command (to a page when session is set) and decodes its result.
func (b *Browser) call(ctx context.Context, session, method string, params, out any) error {
	id := b.next.Add(1)
	msg := map[string]any{"id": id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	if session != "" {
		msg["sessionId"] = session
	}
	data, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	ch := make(chan reply, 1)
	b.mu.Lock()
	b.pending[id] = ch
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.pending, id)
		b.mu.Unlock()
	}()
	if err := b.conn.Write(ctx, websocket.MessageText, data); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	select {
	case r := <-ch:
		if r.Error != nil {
			return fmt.Errorf("%s: %s (%d)", method, r.Error.Message, r.Error.Code)
		}
		if out != nil {
			return json.Unmarshal(r.Result, out)
		}
		return nil
	case <-b.done:
		return fmt.Errorf("%s: connection to chromium lost: %v", method, b.err)
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", method, ctx.Err())
	}
}

// Close ends the browser and removes its profile.
func (b *Browser) Close() {
	if b.conn != nil {
		_ = b.call(context.Background(), "", "Browser.close", nil, nil)
		b.conn.CloseNow()
	}
	exited := make(chan struct{})
	go func() {
		_ = b.cmd.Wait()
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(3 * time.Second):
		_ = b.cmd.Process.Kill()
		<-exited
	}
	os.RemoveAll(b.dir)
}

// Page is one tab.
type Page struct {
	b       *Browser
	target  string
	session string
}

// NewPage opens a tab of the given size (CSS pixels) and color scheme
// ("light" or "dark"; "" leaves the default).
func (b *Browser) NewPage(ctx context.Context, width, height int, scheme string) (*Page, error) {
	var t struct {
		TargetID string `json:"targetId"`
	}
	if err := b.call(ctx, "", "Target.createTarget", map[string]any{"url": "about:blank"}, &t); err != nil {
		return nil, err
	}
	var s struct {
		SessionID string `json:"sessionId"`
	}
	if err := b.call(ctx, "", "Target.attachToTarget", map[string]any{"targetId": t.TargetID, "flatten": true}, &s); err != nil {
		return nil, err
	}
	p := &Page{b: b, target: t.TargetID, session: s.SessionID}
	if err := p.Call(ctx, "Emulation.setDeviceMetricsOverride", map[string]any{
		"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}, nil); err != nil {
		return nil, err
	}
	if scheme != "" {
		if err := p.Call(ctx, "Emulation.setEmulatedMedia", map[string]any{
			"features": []map[string]string{{"name": "prefers-color-scheme", "value": scheme}}}, nil); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Call sends a DevTools command to the page.
func (p *Page) Call(ctx context.Context, method string, params, out any) error {
	return p.b.call(ctx, p.session, method, params, out)
}

// Close closes the tab.
func (p *Page) Close(ctx context.Context) error {
	return p.b.call(ctx, "", "Target.closeTarget", map[string]any{"targetId": p.target}, nil)
}

// Navigate loads url; it returns once the navigation committed (use Eval or
// WaitFor for what the page does next).
func (p *Page) Navigate(ctx context.Context, url string) error {
	var r struct {
		ErrorText string `json:"errorText"`
	}
	if err := p.Call(ctx, "Page.navigate", map[string]any{"url": url}, &r); err != nil {
		return err
	}
	if r.ErrorText != "" {
		return fmt.Errorf("navigate %s: %s", url, r.ErrorText)
	}
	return nil
}

// Eval evaluates a JavaScript expression in the page (awaiting a promise)
// and decodes its JSON value into out (if not nil).
func (p *Page) Eval(ctx context.Context, expr string, out any) error {
	var r struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		Exception *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	err := p.Call(ctx, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true, "awaitPromise": true}, &r)
	if err != nil {
		return err
	}
	if r.Exception != nil {
		return fmt.Errorf("javascript: %s %s", r.Exception.Text, r.Exception.Exception.Description)
	}
	if out != nil && len(r.Result.Value) > 0 {
		return json.Unmarshal(r.Result.Value, out)
	}
	return nil
}

// WaitFor evaluates a boolean expression until it is true or ctx ends.
func (p *Page) WaitFor(ctx context.Context, expr string) error {
	for {
		var ok bool
		err := p.Eval(ctx, "Boolean("+expr+")", &ok)
		if err == nil && ok {
			return nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("wait for %s: %w (last error: %v)", expr, ctx.Err(), err)
			}
			return fmt.Errorf("wait for %s: %w", expr, ctx.Err())
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// Key presses and releases one key (e.g. "Escape", "Tab", "Enter") in the page.
func (p *Page) Key(ctx context.Context, key string, code int) error {
	for _, typ := range []string{"keyDown", "keyUp"} {
		params := map[string]any{"type": typ, "key": key, "code": key, "windowsVirtualKeyCode": code}
		if err := p.Call(ctx, "Input.dispatchKeyEvent", params, nil); err != nil {
			return err
		}
	}
	return nil
}

// Screenshot captures the page as PNG; fullPage captures beyond the viewport.
func (p *Page) Screenshot(ctx context.Context, fullPage bool) ([]byte, error) {
	var r struct {
		Data string `json:"data"`
	}
	params := map[string]any{"format": "png", "captureBeyondViewport": fullPage}
	if err := p.Call(ctx, "Page.captureScreenshot", params, &r); err != nil {
		return nil, err
	}
	return base64.StdEncoding.DecodeString(r.Data)
}
