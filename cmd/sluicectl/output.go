package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"
)

// Output formats. Every command takes table, json and yaml; YAML is the
// JSON document's (same keys), so that one convention holds for both.
const (
	formatTable = "table"
	formatJSON  = "json"
	formatYAML  = "yaml"
	formatHTML  = "html"
)

// formatsAnnotation names, on a command, the -o values it takes beyond
// table, json and yaml (comma-separated).
const formatsAnnotation = "sluicectl/formats"

// formatsOf lists the -o values command c takes.
func formatsOf(c *cobra.Command) []string {
	fs := []string{formatTable, formatJSON, formatYAML}
	if extra := c.Annotations[formatsAnnotation]; extra != "" {
		fs = append(fs, strings.Split(extra, ",")...)
	}
	return fs
}

// checkFormat refuses an -o value command c does not take.
func checkFormat(c *cobra.Command, format string) error {
	fs := formatsOf(c)
	for _, f := range fs {
		if f == format {
			return nil
		}
	}
	return fmt.Errorf("-o %q: want %s or %s", format, strings.Join(fs[:len(fs)-1], ", "), fs[len(fs)-1])
}

// output writes a command's result in the format -o names.
type output struct {
	format string
	w      io.Writer
}

// out is the output of the running command.
func (g *globals) out() output { return output{format: g.format, w: g.stdout} }

// write prints the result: writeJSON's document for json, the same as
// YAML for yaml, table otherwise.
func (o output) write(writeJSON, table func(io.Writer) error) error {
	switch o.format {
	case formatJSON:
		return writeJSON(o.w)
	case formatYAML:
		var buf bytes.Buffer
		if err := writeJSON(&buf); err != nil {
			return err
		}
		y, err := yaml.JSONToYAML(buf.Bytes())
		if err != nil {
			return fmt.Errorf("render yaml: %w", err)
		}
		_, err = o.w.Write(y)
		return err
	}
	return table(o.w)
}

// value prints v, a result sluicectl builds itself, as indented JSON (or
// its YAML), else through table.
func (o output) value(v any, table func(io.Writer) error) error {
	return o.write(func(w io.Writer) error { return writeJSON(w, v) }, table)
}

// message prints a gRPC message as protojson prints it: the field names
// and 64-bit integers grpcurl shows, zero values included, indented as
// every other document (protojson's own indentation varies on purpose).
func (o output) message(m proto.Message, table func(io.Writer) error) error {
	return o.write(func(w io.Writer) error {
		b, err := protoJSON(m)
		if err != nil {
			return err
		}
		var buf bytes.Buffer
		if err := json.Indent(&buf, b, "", "  "); err != nil {
			return fmt.Errorf("render: %w", err)
		}
		buf.WriteByte('\n')
		_, err = buf.WriteTo(w)
		return err
	}, table)
}

// protoJSON renders a gRPC message for embedding in a larger document, with
// the options message uses.
func protoJSON(m proto.Message) (json.RawMessage, error) {
	b, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	return b, nil
}

// writeJSON prints v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}
