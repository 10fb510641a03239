package gateway

import (
	"bytes"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
)

// Usage is what an engine reported a request cost.
type Usage struct {
	PromptTokens, CachedTokens, OutputTokens int64
}

// readUsage reads the usage object of a chat or completions response
// (prompt_tokens, completion_tokens, prompt_tokens_details.cached_tokens)
// or of a responses one (input_tokens, output_tokens,
// input_tokens_details.cached_tokens); false when u holds none.
func readUsage(u gjson.Result) (Usage, bool) {
	if !u.IsObject() {
		return Usage{}, false
	}
	var out Usage
	found := false
	u.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "prompt_tokens", "input_tokens":
			out.PromptTokens, found = max(v.Int(), 0), true
		case "completion_tokens", "output_tokens":
			out.OutputTokens, found = max(v.Int(), 0), true
		case "prompt_tokens_details", "input_tokens_details":
			out.CachedTokens = max(v.Get("cached_tokens").Int(), 0)
		}
		return true
	})
	out.CachedTokens = min(out.CachedTokens, out.PromptTokens)
	return out, found
}

// jsonUsage reads the usage of a whole JSON response body.
func jsonUsage(body []byte) (Usage, bool) {
	if len(body) == 0 {
		return Usage{}, false
	}
	s := unsafe.String(&body[0], len(body))
	u := gjson.Get(s, "usage")
	if !u.Exists() {
		u = gjson.Get(s, "response.usage")
	}
	return readUsage(u)
}

// sseReader follows a server-sent event stream chunk by chunk: it reads
// the usage event, counts the events that carry output, and, when drop is
// set (Sluice asked for the usage the client did not), keeps the usage
// event out of the bytes it passes on. Lines split across chunks are
// joined.
type sseReader struct {
	drop    bool
	line    []byte // an unfinished line carried over from the last chunk
	event   []byte // with drop: the event being read, held back until its end
	isUsage bool   // with drop: the event being read is the usage event
	out     []byte // with drop: the bytes passed on, reused

	usage    Usage
	hasUsage bool
	outputs  int64 // data events with choices or an output delta
	done     bool  // data: [DONE] seen
}

// feed reads chunk and returns the bytes to pass on: chunk itself without
// drop; chunk less any usage event (held back to an event's end) with it.
func (r *sseReader) feed(chunk []byte) []byte {
	if r.drop {
		r.out = r.out[:0]
	}
	rest := chunk
	for len(rest) > 0 {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			r.line = append(r.line, rest...)
			if r.drop {
				r.event = append(r.event, rest...)
			}
			break
		}
		seg := rest[:i+1]
		rest = rest[i+1:]
		line := seg
		if len(r.line) > 0 {
			r.line = append(r.line, seg...)
			line = r.line
		}
		r.readLine(bytes.TrimRight(line, "\r\n"))
		if r.drop {
			r.event = append(r.event, seg...)
			if len(bytes.TrimRight(line, "\r\n")) == 0 { // an event ends
				if !r.isUsage {
					r.out = append(r.out, r.event...)
				}
				r.event, r.isUsage = r.event[:0], false
			}
		}
		r.line = r.line[:0]
	}
	if !r.drop {
		return chunk
	}
	return r.out
}

// flush returns what drop held back at the stream's end: an event the
// upstream did not finish, unless it is the usage event.
func (r *sseReader) flush() []byte {
	if !r.drop || len(r.event) == 0 || r.isUsage {
		return nil
	}
	out := r.event
	r.event = nil
	return out
}

// readLine reads one whole line (without its line end).
func (r *sseReader) readLine(line []byte) {
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return
	}
	data = bytes.TrimLeft(data, " ")
	if len(data) == 0 || data[0] != '{' {
		r.done = r.done || bytes.Equal(data, []byte("[DONE]"))
		return
	}
	s := unsafe.String(&data[0], len(data))
	res := gjson.Parse(s)
	var u gjson.Result
	hasChoices := false
	res.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "usage":
			u = v
		case "choices":
			hasChoices = v.IsArray() && strings.TrimSpace(v.Raw[1:len(v.Raw)-1]) != ""
		case "response": // the responses API's response.completed
			u = v.Get("usage")
		case "type":
			hasChoices = v.Str == "response.output_text.delta"
		}
		return true
	})
	if hasChoices {
		r.outputs++
	}
	if usage, ok := readUsage(u); ok {
		r.usage, r.hasUsage = usage, true
		r.isUsage = r.isUsage || !hasChoices
	}
}
