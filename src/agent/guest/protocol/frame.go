package protocol

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// Frame is one decoded frame: the header split into its fields (an object with a string `t`) and the body.
type Frame struct {
	Header map[string]json.RawMessage
	Kind   string
	Body   []byte
}

// FrameError describes undecodable input; the decoder has already skipped past it.
type FrameError struct {
	Reason  string
	Message string
}

func (e *FrameError) Error() string { return e.Message }

// EncodeFrame builds one frame from an encoded header and a body, refusing what exceeds the limits.
func EncodeFrame(header []byte, body []byte) ([]byte, error) {
	if len(header) > MaxHeaderBytes {
		return nil, fmt.Errorf("frame header of %d bytes exceeds the %d-byte limit", len(header), MaxHeaderBytes)
	}
	total := FramePrefixBytes + len(header) + len(body)
	if total > MaxFrameBytes {
		return nil, fmt.Errorf("frame of %d bytes exceeds the %d-byte limit", total, MaxFrameBytes)
	}
	frame := make([]byte, total)
	copy(frame, FrameMagic)
	binary.BigEndian.PutUint32(frame[4:], uint32(len(header)+len(body)))
	binary.BigEndian.PutUint32(frame[8:], uint32(len(header)))
	copy(frame[FramePrefixBytes:], header)
	copy(frame[FramePrefixBytes+len(header):], body)
	return frame, nil
}

// Decoder turns an arbitrarily split byte stream into frames. It checks every length against the limits
// before buffering for it, and after bad input reports one error per stretch and resynchronises on the next
// magic.
type Decoder struct {
	buf      []byte
	skipping bool
	// Dropped counts bytes skipped while resynchronising.
	Dropped int
	OnFrame func(Frame)
	OnError func(*FrameError)
}

// Reset forgets a partial frame (the peer reconnected).
func (d *Decoder) Reset() {
	d.buf = d.buf[:0]
	d.skipping = false
}

// Push feeds bytes; frames and errors are reported synchronously.
func (d *Decoder) Push(chunk []byte) {
	d.buf = append(d.buf, chunk...)
	start := 0
	for len(d.buf)-start >= FramePrefixBytes {
		b := d.buf[start:]
		if string(b[:4]) != FrameMagic {
			start += d.fail(b, "bad_magic", "stream does not start with a frame magic")
			continue
		}
		frameLength := binary.BigEndian.Uint32(b[4:])
		headerLength := binary.BigEndian.Uint32(b[8:])
		if frameLength > MaxFrameBytes-FramePrefixBytes {
			start += d.fail(b, "frame_too_large", fmt.Sprintf("frame of %d bytes exceeds the %d-byte limit", frameLength, MaxFrameBytes))
			continue
		}
		if headerLength > MaxHeaderBytes {
			start += d.fail(b, "header_too_large", fmt.Sprintf("header of %d bytes exceeds the %d-byte limit", headerLength, MaxHeaderBytes))
			continue
		}
		if headerLength < 2 || headerLength > frameLength {
			start += d.fail(b, "bad_header_length", fmt.Sprintf("header length %d does not fit frame length %d", headerLength, frameLength))
			continue
		}
		total := FramePrefixBytes + int(frameLength)
		if len(b) < total {
			break
		}
		headerBytes := b[FramePrefixBytes : FramePrefixBytes+int(headerLength)]
		var header map[string]json.RawMessage
		if !utf8.Valid(headerBytes) || headerBytes[0] != '{' || json.Unmarshal(headerBytes, &header) != nil {
			start += d.fail(b, "bad_header", "frame header is not UTF-8 JSON")
			continue
		}
		var kind string
		if raw, ok := header["t"]; !ok || len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &kind) != nil {
			start += d.fail(b, "header_not_object", "frame header has no string field 't'")
			continue
		}
		var body []byte
		if int(frameLength) > int(headerLength) {
			body = append([]byte(nil), b[FramePrefixBytes+int(headerLength):total]...)
		}
		start += total
		d.skipping = false
		if d.OnFrame != nil {
			d.OnFrame(Frame{Header: header, Kind: kind, Body: body})
		}
	}
	rest := copy(d.buf, d.buf[start:])
	d.buf = d.buf[:rest]
	// Do not pin a large buffer once it is drained.
	if rest == 0 && cap(d.buf) > 1<<20 {
		d.buf = nil
	}
}

// fail reports (once per stretch) and returns how many bytes to skip to the next magic after position 0.
func (d *Decoder) fail(b []byte, reason, message string) int {
	if !d.skipping {
		d.skipping = true
		if d.OnError != nil {
			d.OnError(&FrameError{Reason: reason, Message: message})
		}
	}
	for i := 1; i+len(FrameMagic) <= len(b); i++ {
		if string(b[i:i+len(FrameMagic)]) == FrameMagic {
			d.Dropped += i
			return i
		}
	}
	// Keep a tail that may be the start of a magic split across chunks.
	keep := len(FrameMagic) - 1
	if keep > len(b)-1 {
		keep = len(b) - 1
	}
	d.Dropped += len(b) - keep
	return len(b) - keep
}
