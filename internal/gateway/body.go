package gateway

import (
	"fmt"
	"strconv"
	"unsafe"
)

// API is the OpenAI endpoint a body is for.
type API int

// The OpenAI APIs a body may be for.
const (
	APIChat        API = iota + 1 // /v1/chat/completions: messages
	APICompletions                // /v1/completions: prompt
	APIResponses                  // /v1/responses: input
)

// String names the API by its path.
func (a API) String() string {
	switch a {
	case APIChat:
		return "chat/completions"
	case APICompletions:
		return "completions"
	case APIResponses:
		return "responses"
	}
	return "API(" + strconv.Itoa(int(a)) + ")"
}

// span is a value's place in a body: [start, end).
type span struct{ start, end int }

// Body is what Sluice reads of an OpenAI request body, with the places of
// the values a rewrite changes.
type Body struct {
	API   API
	Model string
	// PromptBytes is the size of the prompt as written (messages'
	// contents, prompt or input): what the token estimate scales.
	PromptBytes int
	// MaxTokens is max_tokens, max_completion_tokens or max_output_tokens
	// (0: the body names none); MaxTokensField names the one it is.
	MaxTokens      int64
	MaxTokensField string
	Stream         bool
	// IncludeUsage: stream_options.include_usage is true.
	IncludeUsage bool

	model         span // the model's value, quotes included
	open          int  // just past the body's opening brace
	streamOptions span // stream_options' value; zero when absent
	includeUsage  span // stream_options.include_usage's value; zero when absent
}

// BodyError is a body that cannot be admitted: Field names the offending
// field as the client wrote it ("body" for JSON that does not parse).
type BodyError struct {
	Field  string
	Reason string
}

func (e *BodyError) Error() string { return e.Field + ": " + e.Reason }

// apiForPath returns the API a request path names; 0 for another path.
func apiForPath(path string) API {
	for i := 0; i < len(path); i++ {
		if path[i] == '?' {
			path = path[:i]
			break
		}
	}
	switch {
	case hasSuffix(path, "/chat/completions"):
		return APIChat
	case hasSuffix(path, "/completions"):
		return APICompletions
	case hasSuffix(path, "/responses"):
		return APIResponses
	}
	return 0
}

func hasSuffix(s, suffix string) bool {
	return len(s) >= len(suffix) && s[len(s)-len(suffix):] == suffix
}

// ParseBody reads an OpenAI request body in one pass that validates it and
// walks its top-level keys, without unescaping or copying the prompt. api
// is the path's API, or 0 to tell it by the keys (messages, prompt,
// input). Where a key repeats, the last one counts (the prompt: the last
// of api's key, else the first prompt key).
func ParseBody(api API, body []byte) (Body, error) {
	if len(body) == 0 {
		return Body{}, &BodyError{"body", "empty: want an OpenAI request as JSON"}
	}
	start := skipSpace(body, 0)
	if start == len(body) {
		return Body{}, &BodyError{"body", "not valid JSON"}
	}
	if body[start] != '{' {
		if end, ok := skipValue(body, start); ok && skipSpace(body, end) == len(body) {
			return Body{}, &BodyError{"body", "want a JSON object"}
		}
		return Body{}, &BodyError{"body", "not valid JSON"}
	}
	p := bodyParse{b: Body{API: api, open: start + 1}, api: api}
	end, ok := objectMembers(body, start, func(key []byte, escaped bool, at int) (int, bool) {
		return p.member(body, key, escaped, at)
	})
	if !ok || skipSpace(body, end) != len(body) {
		return Body{}, &BodyError{"body", "not valid JSON"}
	}
	if p.err != nil {
		return Body{}, p.err
	}
	b := p.b
	if b.Model == "" {
		return Body{}, &BodyError{"model", "missing"}
	}
	if b.API == 0 {
		b.API = keyAPI(p.promptKey)
	}
	want := apiKey(b.API)
	if b.API == 0 || p.promptKey != want {
		if b.API == 0 {
			return Body{}, &BodyError{"messages", "missing: want messages, prompt or input"}
		}
		return Body{}, &BodyError{want, "missing"}
	}
	var err error
	if b.PromptBytes, err = promptBytes(want, &p.prompt); err != nil {
		return Body{}, err
	}
	return b, nil
}

// bodyParse is ParseBody's state over the top-level keys.
type bodyParse struct {
	b         Body
	api       API
	err       error // the first bad field; the keys after it are only validated
	promptKey string
	prompt    promptValue
}

// promptValue is what ParseBody keeps of a prompt's value.
type promptValue struct {
	kind jsonKind
	raw  int // the value's size as written
	// For messages: how many, the first that is not an object (-1: none),
	// and the size of their contents as written.
	messages, notObject, content int
}

// member reads one top-level key's value at d[at] and returns the index
// just past it.
func (p *bodyParse) member(d, key []byte, escaped bool, at int) (int, bool) {
	if at >= len(d) {
		return at, false
	}
	k := unsafe.String(unsafe.SliceData(key), len(key)) // compared, never kept
	if escaped {
		k = unescapedKey(key)
	}
	kind := kindOf(d[at])
	switch k {
	case "messages", "prompt", "input":
		var v promptValue
		var end int
		var ok bool
		if k == "messages" && kind == kindArray {
			end, ok = scanMessages(d, at, &v)
		} else {
			end, ok = skipValue(d, at)
		}
		v.kind, v.raw = kind, end-at
		if ok && p.err == nil && (p.promptKey == "" || keyAPI(k) == p.api) {
			p.prompt, p.promptKey = v, apiKey(keyAPI(k))
		}
		return end, ok
	case "stream_options":
		var iu span
		var end int
		var ok bool
		if kind == kindObject {
			end, ok = objectMembers(d, at, func(key []byte, escaped bool, at int) (int, bool) {
				end, ok := skipValue(d, at)
				if ok && iu == (span{}) && keyIs(key, escaped, "include_usage") {
					iu = span{at, end}
				}
				return end, ok
			})
		} else {
			end, ok = skipValue(d, at)
		}
		if ok && p.err == nil {
			p.streamOptions(d, kind, span{at, end}, iu)
		}
		return end, ok
	}
	end, ok := skipValue(d, at)
	if !ok || p.err != nil {
		return end, ok
	}
	raw := d[at:end]
	switch k {
	case "model":
		if kind != kindString || len(raw) == 2 {
			p.err = &BodyError{"model", "want a non-empty string"}
			break
		}
		if m := unquote(raw, bytesHas(raw, '\\')); m != "" {
			p.b.Model, p.b.model = m, span{at, end}
		} else {
			p.err = &BodyError{"model", "want a non-empty string"}
		}
	case "max_tokens", "max_completion_tokens", "max_output_tokens":
		n, ok := positiveInt(kind, raw)
		if !ok {
			p.err = &BodyError{fieldName(k), "want a positive integer"}
			break
		}
		if p.b.MaxTokensField == "" || k != "max_tokens" { // the newer name wins
			p.b.MaxTokens, p.b.MaxTokensField = n, fieldName(k)
		}
	case "stream":
		switch kind {
		case kindTrue, kindFalse:
			p.b.Stream = kind == kindTrue
		case kindNull:
		default:
			p.err = &BodyError{"stream", "want true or false"}
		}
	}
	return end, true
}

// streamOptions reads stream_options' value (at) and its include_usage
// (iu; zero when absent).
func (p *bodyParse) streamOptions(d []byte, kind jsonKind, at, iu span) {
	switch {
	case kind == kindNull:
		return
	case kind != kindObject:
		p.err = &BodyError{"stream_options", "want an object"}
		return
	}
	p.b.streamOptions = at
	if iu == (span{}) {
		return
	}
	switch kindOf(d[iu.start]) {
	case kindTrue:
		p.b.IncludeUsage = true
	case kindFalse:
		p.b.IncludeUsage = false
	default:
		p.err = &BodyError{"stream_options.include_usage", "want true or false"}
		return
	}
	p.b.includeUsage = iu
}

// fieldName is the max-tokens key k as a constant, so that a Body keeps
// no view of the request.
func fieldName(k string) string {
	switch k {
	case "max_tokens":
		return "max_tokens"
	case "max_completion_tokens":
		return "max_completion_tokens"
	}
	return "max_output_tokens"
}

func bytesHas(b []byte, c byte) bool {
	for _, x := range b {
		if x == c {
			return true
		}
	}
	return false
}

// scanMessages reads the messages array at d[at] into v: each message's
// kind and the size of its content (its first content key's value).
func scanMessages(d []byte, at int, v *promptValue) (int, bool) {
	v.notObject = -1
	i := skipSpace(d, at+1)
	if i < len(d) && d[i] == ']' {
		return i + 1, true
	}
	for {
		if i >= len(d) {
			return i, false
		}
		var end int
		var ok bool
		if d[i] == '{' {
			seen := false
			end, ok = objectMembers(d, i, func(key []byte, escaped bool, at int) (int, bool) {
				end, ok := skipValue(d, at)
				if ok && !seen && keyIs(key, escaped, "content") {
					v.content += end - at
					seen = true
				}
				return end, ok
			})
		} else {
			if v.notObject < 0 {
				v.notObject = v.messages
			}
			end, ok = skipValue(d, i)
		}
		if !ok {
			return end, false
		}
		v.messages++
		i = skipSpace(d, end)
		if i >= len(d) {
			return i, false
		}
		switch d[i] {
		case ',':
			i = skipSpace(d, i+1)
		case ']':
			return i + 1, true
		default:
			return i, false
		}
	}
}

// promptBytes sizes a prompt: for messages the size of each message's
// content as written (text and parts alike); for prompt and input the
// size of the value. Quotes and escapes count: the ratio calibrated from
// the engines' counts absorbs them.
func promptBytes(key string, v *promptValue) (int, error) {
	switch key {
	case "messages":
		switch {
		case v.kind != kindArray:
			return 0, &BodyError{"messages", "want an array of messages"}
		case v.notObject >= 0:
			return 0, &BodyError{fmt.Sprintf("messages[%d]", v.notObject), "want an object"}
		case v.messages == 0:
			return 0, &BodyError{"messages", "empty"}
		}
		return v.content, nil
	case "prompt", "input":
		if v.kind != kindString && v.kind != kindArray {
			return 0, &BodyError{key, "want a string or an array"}
		}
		if v.raw <= 2 {
			return 0, &BodyError{key, "empty"}
		}
		return v.raw, nil
	}
	return 0, &BodyError{"body", "no prompt"}
}

// positiveInt reads a JSON number (raw, of kind) that is a positive whole
// number.
func positiveInt(kind jsonKind, raw []byte) (int64, bool) {
	if kind != kindNumber {
		return 0, false
	}
	s := unsafe.String(&raw[0], len(raw)) // parsed, never kept
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		f, _ := strconv.ParseFloat(s, 64) // 1e3 and 1000.0 are whole numbers too
		if f != float64(int64(f)) || f < 1 || f > 1<<53 {
			return 0, false
		}
		n = int64(f)
	}
	return n, n > 0
}

// keyAPI is the API whose prompt is under key.
func keyAPI(key string) API {
	switch key {
	case "messages":
		return APIChat
	case "prompt":
		return APICompletions
	case "input":
		return APIResponses
	}
	return 0
}

// apiKey is the key of api's prompt.
func apiKey(api API) string {
	switch api {
	case APIChat:
		return "messages"
	case APICompletions:
		return "prompt"
	case APIResponses:
		return "input"
	}
	return ""
}

// Rewrite returns body with model's value replaced by model (when it is
// not empty) and, when addUsage is set, stream_options.include_usage set
// to true; body itself is not changed. b must be body's parse.
func Rewrite(body []byte, b *Body, model string, addUsage bool) []byte {
	type edit struct {
		at   span
		with string
	}
	var edits [2]edit
	n := 0
	if model != "" {
		edits[n] = edit{b.model, quote(model)}
		n++
	}
	if addUsage {
		switch {
		case b.includeUsage != (span{}):
			edits[n] = edit{b.includeUsage, "true"}
		case b.streamOptions != (span{}):
			at := b.streamOptions.start + 1
			with := `"include_usage":true`
			if !emptyObject(body[b.streamOptions.start:b.streamOptions.end]) {
				with += ","
			}
			edits[n] = edit{span{at, at}, with}
		default:
			with := `"stream_options":{"include_usage":true}`
			if !emptyObject(body[b.open-1:]) {
				with += ","
			}
			edits[n] = edit{span{b.open, b.open}, with}
		}
		n++
	}
	if n == 2 && edits[1].at.start > edits[0].at.start {
		edits[0], edits[1] = edits[1], edits[0]
	}
	grow := 0
	for _, e := range edits[:n] {
		grow += len(e.with) - (e.at.end - e.at.start)
	}
	out := make([]byte, 0, len(body)+grow)
	last := len(body)
	// Edits applied from the last to the first keep the earlier places.
	tail := make([][]byte, 0, 2*n+1)
	for _, e := range edits[:n] {
		tail = append(tail, body[e.at.end:last], []byte(e.with))
		last = e.at.start
	}
	out = append(out, body[:last]...)
	for i := len(tail) - 1; i >= 0; i-- {
		out = append(out, tail[i]...)
	}
	return out
}

// emptyObject reports whether obj, starting at its '{', holds no key.
func emptyObject(obj []byte) bool {
	for _, c := range obj[1:] {
		switch c {
		case ' ', '\t', '\n', '\r':
		case '}':
			return true
		default:
			return false
		}
	}
	return false
}
