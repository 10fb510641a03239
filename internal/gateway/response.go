package gateway

import (
	"bytes"
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
		line = trimEOL(line)
		r.readLine(line)
		if r.drop {
			r.event = append(r.event, seg...)
			if len(line) == 0 { // an event ends
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

// trimEOL is line without the line end it ends with (\n, \r\n or \r).
func trimEOL(line []byte) []byte {
	for len(line) > 0 && (line[len(line)-1] == '\n' || line[len(line)-1] == '\r') {
		line = line[:len(line)-1]
	}
	return line
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

// readLine reads one whole line (without its line end): a data event's
// top-level keys, in one pass that builds nothing.
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
	var usage []byte // the usage object as written
	hasChoices := false
	// A line that is not JSON is read up to where it stops being JSON.
	_, _ = objectMembers(data, 0, func(key []byte, escaped bool, at int) (int, bool) {
		if at >= len(data) {
			return at, false
		}
		k := unsafe.String(unsafe.SliceData(key), len(key)) // compared, never kept
		if escaped {
			k = unescapedKey(key)
		}
		if k == "response" && data[at] == '{' { // the responses API's response.completed
			usage = nil
			return objectMembers(data, at, func(key []byte, escaped bool, at int) (int, bool) {
				end, ok := skipValue(data, at)
				if ok && usage == nil && keyIs(key, escaped, "usage") {
					usage = data[at:end]
				}
				return end, ok
			})
		}
		end, ok := skipValue(data, at)
		if !ok {
			return end, false
		}
		switch k {
		case "usage":
			usage = data[at:end]
		case "choices":
			hasChoices = data[at] == '[' && skipSpace(data, at+1) != end-1
		case "response":
			usage = nil
		case "type":
			hasChoices = data[at] == '"' && unquote(data[at:end], bytesHas(data[at:end], '\\')) == "response.output_text.delta"
		}
		return end, true
	})
	if hasChoices {
		r.outputs++
	}
	if len(usage) == 0 || usage[0] != '{' {
		return
	}
	if u, ok := readUsage(gjson.Parse(unsafe.String(&usage[0], len(usage)))); ok {
		r.usage, r.hasUsage = u, true
		r.isUsage = r.isUsage || !hasChoices
	}
}
