// Package protocol is the Go side of the agent protocol declared in src/agent/protocol (TypeBox).
// protocol_gen.go is generated from that declaration (npm run gen:agent); this file holds the helpers the
// generated decoders and validators call, and the frame codec.
package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
)

// SchemaError is a value that does not match its schema: the JSON pointer of the field and what was expected.
type SchemaError struct {
	Path        string
	Message     string
	Description string
}

func (e *SchemaError) Error() string {
	where := e.Path
	if where == "" {
		where = "(root)"
	}
	if e.Description != "" {
		return fmt.Sprintf("%s: %s (expected %s)", where, e.Message, e.Description)
	}
	return where + ": " + e.Message
}

func schemaError(path, message, description string) error {
	return &SchemaError{Path: path, Message: message, Description: description}
}

// UnknownOpError is a request for an op the table does not have.
type UnknownOpError struct{ Op string }

func (e *UnknownOpError) Error() string { return fmt.Sprintf("unknown op %s", quote(e.Op, 64)) }

func errUnknownOp(op string) error { return &UnknownOpError{Op: op} }

// UnknownKindError is a header whose `t` is not a host message kind.
type UnknownKindError struct{ Kind string }

func (e *UnknownKindError) Error() string {
	return fmt.Sprintf("unknown host message kind %s", quote(e.Kind, 32))
}

func errUnknownKind(t string) error { return &UnknownKindError{Kind: t} }

func quote(s string, max int) string {
	if len(s) > max {
		s = s[:max]
	}
	b, _ := json.Marshal(s)
	return string(b)
}

// OpSpec is one row of the op table: what travels in the bodies and how its arguments are decoded.
type OpSpec struct {
	Name         string
	RequestBody  string
	ResponseBody string
	Input        bool
	decode       func([]byte) (any, error)
}

// DecodeArgs decodes and validates the arguments of this op (absent or null args are an empty object, as
// the host's `args ?? {}` reads them).
func (s *OpSpec) DecodeArgs(raw json.RawMessage) (any, error) {
	if len(raw) == 0 || isNull(raw) {
		raw = emptyObject
	}
	return s.decode(raw)
}

var emptyObject = []byte("{}")

type fieldDecoder interface {
	decodeFields(m map[string]json.RawMessage, path string) error
}

func decodeArgs(b []byte, into fieldDecoder) error {
	var m map[string]json.RawMessage
	if err := decodeObject(b, "", &m); err != nil {
		return err
	}
	return into.decodeFields(m, "")
}

func firstByte(raw []byte) byte {
	for _, c := range raw {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return c
		}
	}
	return 0
}

func isNull(raw []byte) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

func decodeObject(raw []byte, path string, into *map[string]json.RawMessage) error {
	if firstByte(raw) != '{' || json.Unmarshal(raw, into) != nil {
		return schemaError(path, "Expected object", "")
	}
	return nil
}

func decodeArray(raw []byte, path string, into *[]json.RawMessage) error {
	if firstByte(raw) != '[' || json.Unmarshal(raw, into) != nil {
		return schemaError(path, "Expected array", "")
	}
	return nil
}

func decodeString(raw []byte, path string, into *string) error {
	if firstByte(raw) != '"' || json.Unmarshal(raw, into) != nil {
		return schemaError(path, "Expected string", "")
	}
	return nil
}

func decodeBool(raw []byte, path string, into *bool) error {
	if c := firstByte(raw); (c != 't' && c != 'f') || json.Unmarshal(raw, into) != nil {
		return schemaError(path, "Expected boolean", "")
	}
	return nil
}

func decodeNumber(raw []byte, path string, into *float64) error {
	c := firstByte(raw)
	if (c != '-' && (c < '0' || c > '9')) || json.Unmarshal(raw, into) != nil || math.IsInf(*into, 0) {
		return schemaError(path, "Expected number", "")
	}
	return nil
}

// decodeInteger accepts what JavaScript's Number.isInteger accepts (1e3 is the integer 1000) within int64.
func decodeInteger(raw []byte, path string, into *int64) error {
	var f float64
	if err := decodeNumber(raw, path, &f); err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<63-1024 {
		return schemaError(path, "Expected integer", "")
	}
	*into = int64(f)
	return nil
}

func rejectUnknown(m map[string]json.RawMessage, path string, known int, names ...string) error {
	if len(m) <= known {
		present := 0
		for _, n := range names {
			if _, ok := m[n]; ok {
				present++
			}
		}
		if present == len(m) {
			return nil
		}
	}
	var unknown []string
	for k := range m {
		found := false
		for _, n := range names {
			if k == n {
				found = true
				break
			}
		}
		if !found {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	return schemaError(path+"/"+pointerEscape(unknown[0]), "Unexpected property", "")
}

// utf16Len is a string's length as JavaScript counts it (UTF-16 code units), which schema lengths mean.
func utf16Len(s string) int {
	n := 0
	for _, r := range s {
		if r >= 0x10000 {
			n += 2
		} else {
			n++
		}
	}
	return n
}

func pointerEscape(k string) string {
	if !strings.ContainsAny(k, "~/") {
		return k
	}
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}
