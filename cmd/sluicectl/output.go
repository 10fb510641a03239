package main

import (
	"encoding/json"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// checkFormat refuses an -o value other than table or json.
func checkFormat(format string) error {
	if format != "table" && format != "json" {
		return fmt.Errorf("-o %q: want table or json", format)
	}
	return nil
}

// writeProto prints a gRPC message as indented JSON with the field names
// grpcurl shows, zero values included.
func writeProto(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return fmt.Errorf("render: %w", err)
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
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
