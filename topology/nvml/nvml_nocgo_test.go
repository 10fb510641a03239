//go:build !cgo

package nvml

import (
	"errors"
	"testing"
)

// Without cgo Discover is the stub: unavailable, expected (so auto logs it
// at Info), and saying how to get NVML.
func TestStubSaysBuiltWithoutCgo(t *testing.T) {
	_, err := Discover("n")
	var ue *unavailableError
	if !errors.Is(err, ErrUnavailable) || !errors.As(err, &ue) || !ue.expected {
		t.Fatalf("err = %v, want an expected ErrUnavailable", err)
	}
	const want = "NVML unavailable: built without cgo (CGO_ENABLED=0); rebuild with cgo to read GPUs through NVML"
	if err.Error() != want {
		t.Errorf("err = %q\nwant  %q", err, want)
	}
}
