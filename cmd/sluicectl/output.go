package main

import (
	"encoding/json"
	"fmt"
	"io"
)

// checkFormat refuses an -o value other than table or json.
func checkFormat(format string) error {
	if format != "table" && format != "json" {
		return fmt.Errorf("-o %q: want table or json", format)
	}
	return nil
}

// writeJSON prints v as indented JSON, the form every -o json takes.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}
