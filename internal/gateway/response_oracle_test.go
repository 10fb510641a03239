package gateway

import (
	"bytes"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
)

// gjsonReadLine is sseReader.readLine written over gjson: the oracle
// FuzzSSEReadLine holds the scanner to.
func (r *sseReader) gjsonReadLine(line []byte) {
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
