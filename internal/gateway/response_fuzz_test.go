package gateway

import (
	"encoding/json"
	"fmt"
	"testing"
)

// FuzzSSEReadLine holds the SSE reader's one-pass reading of a data line
// to gjsonReadLine (the same reading written over gjson), for every line
// whose data is JSON: the output events counted, the usage and whether
// the event is the usage event.
func FuzzSSEReadLine(f *testing.F) {
	for _, s := range []string{
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok"}}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":19}}`,
		`{"choices":[ ],"usage":{"prompt_tokens":10,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":4}}}`,
		`{"type":"response.output_text.delta","delta":"x"}`,
		`{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":7,"output_tokens":2,"input_tokens_details":{"cached_tokens":9}}}}`,
		`{"usage":{"prompt_tokens":1},"response":{"status":"x"}}`, `{"response":1,"usage":null}`,
		`{"ty\u0070e":"response.output_text.delt\u0061","us\u0061ge":{"input_tokens":-4}}`,
		`{"choices":[{}],"usage":{"prompt_tokens":1.5e2,"completion_tokens":"7"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !json.Valid(data) {
			return
		}
		line := append([]byte("data: "), data...)
		var got, want sseReader
		got.readLine(line)
		want.gjsonReadLine(line)
		if got.outputs != want.outputs || got.usage != want.usage || got.hasUsage != want.hasUsage || got.isUsage != want.isUsage || got.done != want.done {
			t.Fatalf("%s:\n got %+v\nwant %+v", data, got, want)
		}
	})
}

// benchSSEChunks is a streamed chat completion of 20 chunks, the last with
// the usage event and [DONE], as BenchmarkExtProcExchange streams it.
func benchSSEChunks() [][]byte {
	var out [][]byte
	for i := range 20 {
		chunk := fmt.Sprintf(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok%d"}}]}`+"\n\n", i)
		if i == 19 {
			chunk += `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":19}}` + "\n\n" + "data: [DONE]\n\n"
		}
		out = append(out, []byte(chunk))
	}
	return out
}

// BenchmarkSSEReader reads one streamed response, the usage event kept
// from the client.
func BenchmarkSSEReader(b *testing.B) {
	chunks := benchSSEChunks()
	b.ReportAllocs()
	for b.Loop() {
		r := sseReader{drop: true}
		for _, c := range chunks {
			r.feed(c)
		}
		if !r.hasUsage || r.outputs != 20 {
			b.Fatalf("usage %v %+v, %d outputs", r.hasUsage, r.usage, r.outputs)
		}
	}
}
