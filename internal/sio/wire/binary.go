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

// CheckPlaceholders verifies that every placeholder in data refers to one of n
// attachments (socket.io-parser's "illegal attachments" rule). It reads data
// once.
func CheckPlaceholders(data json.RawMessage, n int) error {
	if !json.Valid(data) {
		return invalid("not valid JSON")
	}
	_, err := findPlaceholders(data, n)
	return err
}

// InlineAttachments returns data with every placeholder replaced by the JSON string
// holding the standard base64 of its attachment, which is how encoding/json
// represents []byte: a handler can json.Unmarshal the result into a struct with
// []byte fields. data must be valid JSON; it is read once.
func InlineAttachments(data json.RawMessage, atts [][]byte) (json.RawMessage, error) {
	out, err := replacePlaceholders(data, len(atts), func(b []byte, num int) []byte {
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
