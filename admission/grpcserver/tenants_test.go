package grpcserver

import (
	"context"
	"encoding/base64"
	"fmt"
	"testing"

	"github.com/sluice-sched/sluice/admission"
	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
)

// pagerEngine is a testEngine that also pages by itself, counting the pages
// it was asked for.
type pagerEngine struct {
	*testEngine
	pages int
}

func (e *pagerEngine) TenantsAfter(after string, n int) ([]admission.TenantInfo, bool) {
	e.pages++
	all, _ := tenantsAfter(e.testEngine, after, len(e.tenants))
	end := min(n, len(all))
	return all[:end], end < len(all)
}

// manyTenants returns n tenants named t00000, t00001, … (name order).
func manyTenants(n int) []admission.TenantInfo {
	ts := make([]admission.TenantInfo, n)
	for i := range ts {
		ts[i] = admission.TenantInfo{Name: fmt.Sprintf("t%05d", i), Tier: "free", Weight: 1}
	}
	return ts
}

// listAll pages through ListTenants with size, returning every name and the
// number of pages.
func listAll(t *testing.T, op admissionv1.OperatorServer, size int32) (names []string, pages int) {
	t.Helper()
	tok := ""
	for {
		resp, err := op.ListTenants(context.Background(), &admissionv1.ListTenantsRequest{PageSize: size, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, ti := range resp.GetTenants() {
			names = append(names, ti.GetName())
		}
		if resp.GetNextPageToken() == "" {
			return names, pages
		}
		if pages > 10000 {
			t.Fatal("ListTenants never ends")
		}
		tok = resp.GetNextPageToken()
	}
}

func TestListTenantsPages(t *testing.T) {
	for _, pager := range []bool{false, true} {
		t.Run(fmt.Sprintf("pager=%v", pager), func(t *testing.T) {
			te := &testEngine{tenants: manyTenants(2500)}
			var eng Engine = te
			if pager {
				eng = &pagerEngine{testEngine: te}
			}
			op := NewOperator(eng)
			for _, tc := range []struct {
				size      int32
				wantPages int
			}{
				{0, 3},    // the default: 1000 a page
				{5000, 3}, // lowered to the maximum
				{1000, 3}, // exactly the maximum
				{700, 4},  // 700+700+700+400
				{2500, 3}, // above the maximum
				{1, 2500}, // one at a time
				{2499, 3}, // lowered to 1000
				{MaxTenantPage / 4, 10},
			} {
				names, pages := listAll(t, op, tc.size)
				if pages != tc.wantPages || len(names) != 2500 {
					t.Fatalf("page_size %d: %d names in %d pages, want 2500 in %d", tc.size, len(names), pages, tc.wantPages)
				}
				for i, n := range names {
					if n != te.tenants[i].Name {
						t.Fatalf("page_size %d: name %d = %q, want %q (each once, in order)", tc.size, i, n, te.tenants[i].Name)
					}
				}
			}
		})
	}
}

func TestListTenantsSmallFleetIsOnePage(t *testing.T) {
	te := &testEngine{tenants: manyTenants(4)}
	resp, err := NewOperator(te).ListTenants(context.Background(), &admissionv1.ListTenantsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetTenants()) != 4 || resp.GetNextPageToken() != "" {
		t.Fatalf("ListTenants = %d tenants, next %q; want all 4 and no next page", len(resp.GetTenants()), resp.GetNextPageToken())
	}
}

func TestListTenantsRefusesBadPages(t *testing.T) {
	op := NewOperator(&testEngine{tenants: manyTenants(3)})
	ctx := context.Background()
	_, err := op.ListTenants(ctx, &admissionv1.ListTenantsRequest{PageSize: -1})
	wantInvalidArgument(t, err, "page_size")
	for _, tok := range []string{"t00001", "!!!", EncodePageToken("")[:1], string(make([]byte, 1000))} {
		_, err = op.ListTenants(ctx, &admissionv1.ListTenantsRequest{PageToken: tok})
		wantInvalidArgument(t, err, "page_token")
	}
	// Tokens built from the layout without the server's check: a version
	// byte and a name ("AWE" is 0x01 "a"), under either version.
	for _, tok := range []string{"AWE", "AXQwMDAwMQ", "AnQwMDAwMQ", base64.RawURLEncoding.EncodeToString([]byte("\x02t00001\x00\x00\x00\x00\x00\x00"))} {
		_, err = op.ListTenants(ctx, &admissionv1.ListTenantsRequest{PageToken: tok})
		wantInvalidArgument(t, err, "page_token")
	}
	// A token the server wrote, with any one character changed, cut short
	// or lengthened, is refused too.
	good := EncodePageToken("t00000")
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for i := range good {
		for _, c := range []byte(alphabet) {
			if c == good[i] {
				continue
			}
			bad := good[:i] + string(c) + good[i+1:]
			if _, ok := DecodePageToken(bad); ok {
				t.Fatalf("token %q (%q with byte %d changed) accepted", bad, good, i)
			}
		}
		if _, ok := DecodePageToken(good[:i]); ok && i > 0 {
			t.Errorf("token %q cut to %d bytes accepted", good, i)
		}
	}
	if _, ok := DecodePageToken(good + "A"); ok {
		t.Errorf("token %q lengthened accepted", good)
	}
	// A token naming a tenant that has since gone still continues after it.
	resp, err := op.ListTenants(ctx, &admissionv1.ListTenantsRequest{PageToken: EncodePageToken("t00000x")})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetTenants()) != 2 || resp.GetTenants()[0].GetName() != "t00001" {
		t.Fatalf("after a vanished name: %v", resp.GetTenants())
	}
}

func TestPageTokenRoundTrip(t *testing.T) {
	for _, name := range []string{"a", "acme", "ü-tenant", string(make([]byte, maxNameLen))} {
		got, ok := DecodePageToken(EncodePageToken(name))
		if !ok || got != name {
			t.Errorf("DecodePageToken(EncodePageToken(%q)) = %q, %v", name, got, ok)
		}
	}
}
