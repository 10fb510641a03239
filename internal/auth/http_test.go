package auth

import (
	"errors"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/sluice-sched/sluice/internal/auth/authtest"
)

func TestIdentifyHTTP(t *testing.T) {
	open, err := New("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := open.IdentifyHTTP(httptest.NewRequest("POST", "/", nil)); p != nil || err != nil {
		t.Fatalf("open: %v %v, want nobody and no error", p, err)
	}
	file := filepath.Join(t.TempDir(), "auth.yaml")
	authtest.WriteFile(t, file, goodPolicy(t))
	a, err := New(file, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		remote, header, want string
	}{
		{"127.0.0.1:5000", "Bearer viewer-token", "dash"},
		{"127.0.0.1:5000", "", ""},                    // no credential
		{"127.0.0.1:5000", "Bearer guessed", ""},      // unknown
		{"192.0.2.1:5000", "Bearer viewer-token", ""}, // a token over plaintext from afar
	} {
		r := httptest.NewRequest("POST", "/api/v1/domains/x/drain", nil)
		r.RemoteAddr = tc.remote
		if tc.header != "" {
			r.Header.Set("Authorization", tc.header)
		}
		p, err := a.IdentifyHTTP(r)
		switch {
		case tc.want == "" && !errors.Is(err, ErrUnauthenticated):
			t.Errorf("%s %q: %v %v, want ErrUnauthenticated", tc.remote, tc.header, p, err)
		case tc.want != "" && (err != nil || p.Name != tc.want):
			t.Errorf("%s %q: %v %v, want %s", tc.remote, tc.header, p, err, tc.want)
		}
	}
}
