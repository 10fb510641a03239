package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

// bodySeeds are the bodies of the parse tests and the shapes around them:
// escapes in keys and values, repeated keys, numbers in every notation,
// nesting, whitespace, truncation.
var bodySeeds = []string{
	`{"model":"llama","messages":[{"role":"user","content":"hello"}],"max_tokens":64,"stream":true}`,
	`{"max_completion_tokens":10,"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":99}`,
	`{"model":"m","prompt":"abc","stream":true,"stream_options":{"include_usage":true}}`,
	`{"model":"m","input":"abcd","max_output_tokens":1e3}`,
	`{"model":"m","messages":[`, `[1,2]`, `{"messages":[{"content":"x"}]}`, `{"model":7,"messages":[]}`,
	`{"model":"m"}`, `{"model":"m","messages":{}}`, `{"model":"m","messages":[]}`, `{"model":"m","messages":[1]}`,
	`{"model":"m","messages":[{}],"max_tokens":0}`, `{"model":"m","messages":[{}],"max_tokens":1.5}`,
	`{"model":"m","messages":[{}],"max_tokens":"9"}`, `{"model":"m","messages":[{}],"stream":"yes"}`,
	`{"model":"m","messages":[{}],"stream_options":1}`, `{"model":"m","messages":[{}],"stream_options":{"include_usage":1}}`,
	`{"model":"m","prompt":""}`,
	` { "mod\u0065l" : "a\"b" , "messages" : [ { "c\u006fntent" : "x" , "content" : [1, {"a": null}] } , {} ] , "stream" : null } `,
	`{"model":"m","messages":[{"content":"x"}],"messages":[{"content":"yy"}],"prompt":"p","input":["i"]}`,
	`{"model":"a","model":"","messages":[{"content":-0.5e+10}]}`,
	`{"model":"m","prompt":[1,[2,{"x":[true,false,null]}]],"max_tokens":9007199254740993,"max_output_tokens":2E1}`,
	`{"model":"m","messages":[{"content":"\ud83d\ude00 \n\t\\ \/"}],"stream_options":null,"max_tokens":-1}`,
	`{"model":"m","messages":[{"content":"x"}],"stream_options":{"include_usage":false,"include_usage":true}}`,
	`{"model":"m","messages":[{"content":"x"}],"stream_options":{}}`,
	`{"model":"m","messages":[{"content":01}]}`, `{"model":"m","messages":[{"content":1.}]}`, `{"model":"m","messages":[{"content":"a` + "\x01" + `"}]}`,
	`{"model":"m","messages":[{"content":"\x"}]}`, `{"model":"m",}`, `{"model":"m" "x":1}`, `{} x`, `"s"`, `nul`, "", " ",
	`{"model":"\u00e9","messages":[{"content":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}]}`,
}

// FuzzParseBody holds ParseBody's one-pass scanner to encoding/json on
// what is JSON, and to gjsonParseBody (the same reading written over
// gjson) on everything it reads of a body: fields, places, errors.
func FuzzParseBody(f *testing.F) {
	for _, s := range bodySeeds {
		for api := range API(4) {
			f.Add(uint8(api), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, apiByte uint8, body []byte) {
		api := API(apiByte % 4)
		got, err := ParseBody(api, body)
		want, wantErr := gjsonParseBody(api, body)
		var be *BodyError
		invalid := errors.As(err, &be) && be.Field == "body" && be.Reason == "not valid JSON"
		if invalid != !json.Valid(body) && len(body) > 0 {
			t.Fatalf("%q: ParseBody says invalid %v, encoding/json says valid %v (%v)", body, invalid, json.Valid(body), err)
		}
		if (err == nil) != (wantErr == nil) || err != nil && err.Error() != wantErr.Error() {
			t.Fatalf("%q (api %v): error %v, gjson's reading %v", body, api, err, wantErr)
		}
		if got != want {
			t.Fatalf("%q (api %v):\n got %+v\nwant %+v", body, api, got, want)
		}
	})
}

// scanString stops at the first quote, backslash or control byte wherever
// it lies in the eight-byte words it reads, whatever the bytes after it
// (high bytes of UTF-8 text included).
func TestScanStringFindsEveryStop(t *testing.T) {
	for n := range 24 {
		for _, stop := range []byte{'"', '\\', 0x00, 0x1f, '\n'} {
			for _, fill := range []byte{'a', 0xc3, 0x7f, 0x20, 0x80} {
				d := append([]byte{'"'}, bytes.Repeat([]byte{fill}, n)...)
				d = append(d, stop, '"', '"', '\\', 0x01)
				end, _, ok := scanString(d, 0)
				switch stop {
				case '"':
					if !ok || end != n+2 {
						t.Errorf("%q: end %d ok %v, want %d true", d, end, ok, n+2)
					}
				case '\\': // \" is an escaped quote; the string ends at the next one
					if !ok || end != n+4 {
						t.Errorf("%q: end %d ok %v, want %d true", d, end, ok, n+4)
					}
				default:
					if ok || end != n+1 {
						t.Errorf("%q: end %d ok %v, want %d false", d, end, ok, n+1)
					}
				}
			}
		}
	}
}
