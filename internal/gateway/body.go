package gateway

import (
	"fmt"
	"strconv"
	"unsafe"

	"github.com/tidwall/gjson"
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

// ParseBody reads an OpenAI request body in one pass over its top-level
// keys, without unescaping or copying the prompt. api is the path's API,
// or 0 to tell it by the keys (messages, prompt, input).
func ParseBody(api API, body []byte) (Body, error) {
	if len(body) == 0 {
		return Body{}, &BodyError{"body", "empty: want an OpenAI request as JSON"}
	}
	s := unsafe.String(&body[0], len(body)) // read-only view; nothing here keeps it
	if !gjson.Valid(s) {
		return Body{}, &BodyError{"body", "not valid JSON"}
	}
	root := gjson.Parse(s)
	if !root.IsObject() {
		return Body{}, &BodyError{"body", "want a JSON object"}
	}
	b := Body{API: api, open: root.Index + 1}
	var err error
	var prompt gjson.Result
	var promptKey string
	root.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "model":
			if v.Type != gjson.String || v.Str == "" {
				err = &BodyError{"model", "want a non-empty string"}
				return false
			}
			b.Model, b.model = v.Str, span{v.Index, v.Index + len(v.Raw)}
		case "messages", "prompt", "input":
			if promptKey == "" || keyAPI(k.Str) == api {
				prompt, promptKey = v, k.Str
			}
		case "max_tokens", "max_completion_tokens", "max_output_tokens":
			n, ok := positiveInt(v)
			if !ok {
				err = &BodyError{k.Str, "want a positive integer"}
				return false
			}
			if b.MaxTokensField == "" || k.Str != "max_tokens" { // the newer name wins
				b.MaxTokens, b.MaxTokensField = n, k.Str
			}
		case "stream":
			switch v.Type {
			case gjson.True, gjson.False:
				b.Stream = v.Type == gjson.True
			case gjson.Null:
			default:
				err = &BodyError{"stream", "want true or false"}
				return false
			}
		case "stream_options":
			if v.Type == gjson.Null {
				break
			}
			if !v.IsObject() {
				err = &BodyError{"stream_options", "want an object"}
				return false
			}
			b.streamOptions = span{v.Index, v.Index + len(v.Raw)}
			if iu := v.Get("include_usage"); iu.Exists() {
				if iu.Type != gjson.True && iu.Type != gjson.False {
					err = &BodyError{"stream_options.include_usage", "want true or false"}
					return false
				}
				b.IncludeUsage = iu.Type == gjson.True
				b.includeUsage = span{iu.Index, iu.Index + len(iu.Raw)} // gjson places iu in the whole body
			}
		}
		return true
	})
	if err != nil {
		return Body{}, err
	}
	if b.Model == "" {
		return Body{}, &BodyError{"model", "missing"}
	}
	if b.API == 0 {
		b.API = keyAPI(promptKey)
	}
	want := apiKey(b.API)
	if b.API == 0 || promptKey != want {
		if b.API == 0 {
			return Body{}, &BodyError{"messages", "missing: want messages, prompt or input"}
		}
		return Body{}, &BodyError{want, "missing"}
	}
	if b.PromptBytes, err = promptBytes(want, prompt); err != nil {
		return Body{}, err
	}
	return b, nil
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

// positiveInt reads a JSON number that is a positive whole number.
func positiveInt(v gjson.Result) (int64, bool) {
	if v.Type != gjson.Number {
		return 0, false
	}
	n, err := strconv.ParseInt(v.Raw, 10, 64)
	if err != nil {
		f := v.Num // 1e3 and 1000.0 are whole numbers too
		if f != float64(int64(f)) || f < 1 || f > 1<<53 {
			return 0, false
		}
		n = int64(f)
	}
	return n, n > 0
}

// promptBytes sizes a prompt: for messages the raw size of each message's
// content (text and parts alike); for prompt and input the raw size of the
// value. Quotes and escapes count: the ratio calibrated from the engines'
// counts absorbs them.
func promptBytes(key string, v gjson.Result) (int, error) {
	switch key {
	case "messages":
		if !v.IsArray() {
			return 0, &BodyError{"messages", "want an array of messages"}
		}
		n, i := 0, 0
		var err error
		v.ForEach(func(_, m gjson.Result) bool {
			if !m.IsObject() {
				err = &BodyError{fmt.Sprintf("messages[%d]", i), "want an object"}
				return false
			}
			n += len(m.Get("content").Raw)
			i++
			return true
		})
		if err == nil && i == 0 {
			err = &BodyError{"messages", "empty"}
		}
		return n, err
	case "prompt", "input":
		if v.Type != gjson.String && !v.IsArray() {
			return 0, &BodyError{key, "want a string or an array"}
		}
		if len(v.Raw) <= 2 {
			return 0, &BodyError{key, "empty"}
		}
		return len(v.Raw), nil
	}
	return 0, &BodyError{"body", "no prompt"}
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
