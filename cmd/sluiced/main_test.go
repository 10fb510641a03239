package main

import (
	"strings"
	"testing"
)

func TestBadFlagsAndEnvironmentAreRefused(t *testing.T) {
	if err := run([]string{"--log-format", "xml"}); err == nil || !strings.Contains(err.Error(), "--log-format") {
		t.Fatalf("bad --log-format: %v", err)
	}
	if err := run([]string{"--log-level", "loud"}); err == nil || !strings.Contains(err.Error(), "--log-level") {
		t.Fatalf("bad --log-level: %v", err)
	}
	t.Setenv("SLUICE_PRINT_DEFAULT_CONFIG", "yes please")
	if err := run(nil); err == nil || !strings.Contains(err.Error(), "SLUICE_PRINT_DEFAULT_CONFIG") {
		t.Fatalf("bad environment value: %v", err)
	}
}

func TestConfigFileErrorsNameTheFile(t *testing.T) {
	err := run([]string{"--config", "/nonexistent/sluice.yaml", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/sluice.yaml") {
		t.Fatalf("missing config: %v", err)
	}
}
