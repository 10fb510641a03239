package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestParseBody(t *testing.T) {
	for _, tc := range []struct {
		name string
		api  API
		body string
		want Body
	}{
		{"chat", APIChat, `{"model":"llama","messages":[{"role":"user","content":"hello"}],"max_tokens":64,"stream":true}`,
			Body{API: APIChat, Model: "llama", PromptBytes: len(`"hello"`), MaxTokens: 64, MaxTokensField: "max_tokens", Stream: true}},
		{"chat, newer max name wins", APIChat, `{"max_completion_tokens":10,"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":99}`,
			Body{API: APIChat, Model: "m", PromptBytes: len(`[{"type":"text","text":"hi"}]`), MaxTokens: 10, MaxTokensField: "max_completion_tokens"}},
		{"completions by key", 0, `{"model":"m","prompt":"abc","stream":true,"stream_options":{"include_usage":true}}`,
			Body{API: APICompletions, Model: "m", PromptBytes: 5, Stream: true, IncludeUsage: true}},
		{"responses", APIResponses, `{"model":"m","input":"abcd","max_output_tokens":1e3}`,
			Body{API: APIResponses, Model: "m", PromptBytes: 6, MaxTokens: 1000, MaxTokensField: "max_output_tokens"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseBody(tc.api, []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			got.model, got.open, got.streamOptions, got.includeUsage = span{}, 0, span{}, span{}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// A body Sluice cannot admit is refused with the field that is wrong.
func TestParseBodyNamesTheBadField(t *testing.T) {
	for body, field := range map[string]string{
		``:                               "body",
		`{"model":"m","messages":[`:      "body",
		`[1,2]`:                          "body",
		`{"messages":[{"content":"x"}]}`: "model",
		`{"model":7,"messages":[]}`:      "model",
		`{"model":"m"}`:                  "messages",
		`{"model":"m","messages":{}}`:    "messages",
		`{"model":"m","messages":[]}`:    "messages",
		`{"model":"m","messages":[1]}`:   "messages[0]",
		`{"model":"m","messages":[{}],"max_tokens":0}`:                       "max_tokens",
		`{"model":"m","messages":[{}],"max_tokens":1.5}`:                     "max_tokens",
		`{"model":"m","messages":[{}],"max_tokens":"9"}`:                     "max_tokens",
		`{"model":"m","messages":[{}],"stream":"yes"}`:                       "stream",
		`{"model":"m","messages":[{}],"stream_options":1}`:                   "stream_options",
		`{"model":"m","messages":[{}],"stream_options":{"include_usage":1}}`: "stream_options.include_usage",
	} {
		_, err := ParseBody(APIChat, []byte(body))
		var be *BodyError
		if !errors.As(err, &be) || be.Field != field {
			t.Errorf("%s: %v, want a BodyError naming %s", body, err, field)
		}
	}
	if _, err := ParseBody(APICompletions, []byte(`{"model":"m","prompt":""}`)); err == nil || !strings.Contains(err.Error(), "prompt: empty") {
		t.Errorf("empty prompt: %v", err)
	}
}

// Rewrite changes the model and asks for the usage event, leaving the rest
// of the body as written, whatever stream_options held.
func TestRewrite(t *testing.T) {
	for _, tc := range []struct{ in, model, want string }{
		{`{"model":"big","stream":true,"stream_options":{"include_usage":true}}`, "small", `{"model":"small","stream":true,"stream_options":{"include_usage":true}}`},
		{`{"model":"big","stream":true}`, "", `{"stream_options":{"include_usage":true},"model":"big","stream":true}`},
		{`{"stream":true, "model":"big"}`, "sm\"all", `{"stream_options":{"include_usage":true},"stream":true, "model":"sm\"all"}`},
		{`{"model":"big","stream_options":{}}`, "s", `{"model":"s","stream_options":{"include_usage":true}}`},
		{`{"model":"big","stream_options":{"x":1}}`, "", `{"model":"big","stream_options":{"include_usage":true,"x":1}}`},
		{`{"stream_options":{"include_usage":false},"model":"big"}`, "small", `{"stream_options":{"include_usage":true},"model":"small"}`},
	} {
		b, err := ParseBody(APIChat, []byte(strings.Replace(tc.in, `"model"`, `"messages":[{"content":"x"}],"model"`, 1)))
		if err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		in := []byte(strings.Replace(tc.in, `"model"`, `"messages":[{"content":"x"}],"model"`, 1))
		got := string(Rewrite(in, &b, tc.model, true))
		want := strings.Replace(tc.want, `"model"`, `"messages":[{"content":"x"}],"model"`, 1)
		if got != want {
			t.Errorf("Rewrite(%s, %q):\n got %s\nwant %s", tc.in, tc.model, got, want)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("Rewrite(%s) is not JSON: %s", tc.in, got)
		}
	}
}

// chatBody is a chat request whose messages hold about size bytes of text.
func chatBody(size int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"llama","max_tokens":256,"stream":true,"messages":[`)
	line := "The quick brown fox jumps over the lazy dog; \\\"quoted\\\" and \\n escaped. "
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"user","content":"`)
		for range 40 {
			b.WriteString(line)
		}
		b.WriteString(`"}`)
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

// The parse of a 400 KB chat body, beside io.ReadAll of the same bytes:
// the parse is to cost at most 10 times the read.
func BenchmarkParseChatBody400KB(b *testing.B) {
	body := chatBody(400 << 10)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := ParseBody(APIChat, body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadAll400KB is the yardstick of BenchmarkParseChatBody400KB.
func BenchmarkReadAll400KB(b *testing.B) {
	body := chatBody(400 << 10)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := io.ReadAll(bytes.NewReader(body)); err != nil {
			b.Fatal(err)
		}
	}
}
