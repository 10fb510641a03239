package etcdmembers

import (
	"strings"
	"testing"

	"github.com/sluice-sched/sluice/admission/client"
)

func TestEncodeDecode(t *testing.T) {
	m := client.Member{ID: "sluiced-1", Addr: "10.0.0.1:7070"}
	b, err := Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := Decode("/sluice/", Key("/sluice/", m.ID), b); err != nil || got != m {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for _, tc := range []struct {
		name, key, value, want string
	}{
		{"not under the prefix", "/other/members/a", `{"id":"a","grpc_addr":"x:1"}`, "not under"},
		{"id differs from the key", "/sluice/members/a", `{"id":"b","grpc_addr":"x:1"}`, "does not match"},
		{"unknown field", "/sluice/members/a", `{"id":"a","grpc_addr":"x:1","extra":1}`, "unknown field"},
		{"no address", "/sluice/members/a", `{"id":"a"}`, "empty grpc_addr"},
		{"not JSON", "/sluice/members/a", `a:1`, "invalid"},
		{"slash in the id", "/sluice/members/a/b", `{"id":"a/b","grpc_addr":"x:1"}`, "without '/'"},
	} {
		if _, err := Decode("/sluice/", tc.key, []byte(tc.value)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
	if _, err := Encode(client.Member{ID: "", Addr: "x:1"}); err == nil {
		t.Error("an empty id encoded")
	}
}

// NewSource normalizes its prefix as the control plane does, so that a
// router given "/sluice" watches the keys replicas write under "/sluice/".
func TestNewSourceNormalizesPrefix(t *testing.T) {
	for in, want := range map[string]string{"": "/sluice/", "/sluice": "/sluice/", "/sluice/": "/sluice/", "/x//": "/x/"} {
		if got := NewSource(nil, in, nil).prefix; got != want {
			t.Errorf("NewSource(%q).prefix = %q, want %q", in, got, want)
		}
	}
}
