package gateway

import (
	"fmt"
	"strconv"
	"unsafe"

	"github.com/tidwall/gjson"
)

// gjsonParseBody is ParseBody written over gjson (validate, then walk the
// top-level keys): the oracle FuzzParseBody holds the scanner to.
func gjsonParseBody(api API, body []byte) (Body, error) {
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
			n, ok := gjsonPositiveInt(v)
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
	if b.PromptBytes, err = gjsonPromptBytes(want, prompt); err != nil {
		return Body{}, err
	}
	return b, nil
}

// gjsonPositiveInt reads a JSON number that is a positive whole number.
func gjsonPositiveInt(v gjson.Result) (int64, bool) {
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

// gjsonPromptBytes sizes a prompt: for messages the raw size of each message's
// content (text and parts alike); for prompt and input the raw size of the
// value. Quotes and escapes count: the ratio calibrated from the engines'
// counts absorbs them.
func gjsonPromptBytes(key string, v gjson.Result) (int, error) {
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
