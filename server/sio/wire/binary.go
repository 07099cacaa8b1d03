package wire

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
)

// Placeholder is the JSON object that stands for binary attachment Num.
type Placeholder struct {
	Placeholder bool `json:"_placeholder"`
	Num         int  `json:"num"`
}

// Deconstruct replaces every []byte in v by a Placeholder and appends the bytes to
// *atts in walk order. It looks at v itself and recursively into []any,
// map[string]any and [][]byte; other types (structs, json.RawMessage) are left for
// encoding/json, which writes []byte fields as base64 strings. Containers are
// copied only when they hold binary data, so the input is never modified.
func Deconstruct(v any, atts *[][]byte) any {
	if !hasBinary(v) {
		return v
	}
	switch x := v.(type) {
	case []byte:
		*atts = append(*atts, x)
		return Placeholder{Placeholder: true, Num: len(*atts) - 1}
	case [][]byte:
		out := make([]any, len(x))
		for i, b := range x {
			out[i] = Deconstruct(b, atts)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = Deconstruct(e, atts)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = Deconstruct(e, atts)
		}
		return out
	}
	return v
}

// hasBinary reports whether Deconstruct would find a []byte in v.
func hasBinary(v any) bool {
	switch x := v.(type) {
	case []byte, [][]byte:
		return true
	case []any:
		for _, e := range x {
			if hasBinary(e) {
				return true
			}
		}
	case map[string]any:
		for _, e := range x {
			if hasBinary(e) {
				return true
			}
		}
	}
	return false
}

// placeholderAt reports whether obj (a decoded JSON object) is a placeholder, and
// its index. A placeholder is an object with "_placeholder": true; its "num" must
// then be an integer in [0, n).
func placeholderAt(obj map[string]json.RawMessage, n int) (int, bool, error) {
	flag, ok := obj["_placeholder"]
	if !ok || string(bytes.TrimSpace(flag)) != "true" {
		return 0, false, nil
	}
	raw, ok := obj["num"]
	if !ok {
		return 0, true, invalid("placeholder without num")
	}
	num, err := strconv.Atoi(string(bytes.TrimSpace(raw)))
	if err != nil || num < 0 || num >= n {
		return 0, true, invalid("illegal attachment index %s (have %d)", raw, n)
	}
	return num, true, nil
}

// rewrite walks JSON value v and calls repl for every placeholder; repl returns the
// replacement JSON. It returns v unchanged (same slice) when it holds no placeholder.
func rewrite(v json.RawMessage, n int, repl func(num int) json.RawMessage) (json.RawMessage, bool, error) {
	switch jsonKind(v) {
	case '{':
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(v, &obj); err != nil {
			return nil, false, invalid("object: %v", err)
		}
		num, isPH, err := placeholderAt(obj, n)
		if err != nil {
			return nil, false, err
		}
		if isPH {
			return repl(num), true, nil
		}
		changed := false
		for k, e := range obj {
			r, c, err := rewrite(e, n, repl)
			if err != nil {
				return nil, false, err
			}
			if c {
				obj[k], changed = r, true
			}
		}
		if !changed {
			return v, false, nil
		}
		out, err := json.Marshal(obj)
		return out, true, err
	case '[':
		var arr []json.RawMessage
		if err := json.Unmarshal(v, &arr); err != nil {
			return nil, false, invalid("array: %v", err)
		}
		changed := false
		for i, e := range arr {
			r, c, err := rewrite(e, n, repl)
			if err != nil {
				return nil, false, err
			}
			if c {
				arr[i], changed = r, true
			}
		}
		if !changed {
			return v, false, nil
		}
		out, err := json.Marshal(arr)
		return out, true, err
	case 0:
		return nil, false, invalid("not valid JSON")
	default:
		return v, false, nil
	}
}

// CheckPlaceholders verifies that every placeholder in data refers to one of n
// attachments (socket.io-parser's "illegal attachments" rule).
func CheckPlaceholders(data json.RawMessage, n int) error {
	_, _, err := rewrite(data, n, func(int) json.RawMessage { return json.RawMessage("null") })
	return err
}

// InlineAttachments returns data with every placeholder replaced by the JSON string
// holding the standard base64 of its attachment, which is how encoding/json
// represents []byte: a handler can json.Unmarshal the result into a struct with
// []byte fields.
func InlineAttachments(data json.RawMessage, atts [][]byte) (json.RawMessage, error) {
	out, _, err := rewrite(data, len(atts), func(num int) json.RawMessage {
		b := make([]byte, 0, base64.StdEncoding.EncodedLen(len(atts[num]))+2)
		b = append(b, '"')
		b = base64.StdEncoding.AppendEncode(b, atts[num])
		return append(b, '"')
	})
	if err != nil {
		return nil, fmt.Errorf("inline attachments: %w", err)
	}
	return out, nil
}

// Reconstruct decodes data into plain Go values (map[string]any, []any,
// json.Number, string, bool, nil) with every placeholder replaced by its []byte attachment.
func Reconstruct(data json.RawMessage, atts [][]byte) (any, error) {
	if err := CheckPlaceholders(data, len(atts)); err != nil {
		return nil, fmt.Errorf("reconstruct: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("reconstruct: %w", err)
	}
	return substitute(v, atts), nil
}

func substitute(v any, atts [][]byte) any {
	switch x := v.(type) {
	case map[string]any:
		if flag, ok := x["_placeholder"].(bool); ok && flag {
			if num, ok := x["num"].(json.Number); ok {
				if i, err := strconv.Atoi(num.String()); err == nil {
					return atts[i]
				}
			}
		}
		for k, e := range x {
			x[k] = substitute(e, atts)
		}
	case []any:
		for i, e := range x {
			x[i] = substitute(e, atts)
		}
	}
	return v
}
