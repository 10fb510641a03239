package openai

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-sched/sluice/admission"
	"github.com/sluice-sched/sluice/internal/auth"
	"github.com/sluice-sched/sluice/internal/auth/authtest"
	"github.com/sluice-sched/sluice/internal/gateway"
)

// A streamed answer reaches the client event by event, without the usage
// event Sluice asked for on the client's behalf, and the lease is released
// once with the usage the engine reported.
func TestStreamArrivesWholeAndIsChargedTheReportedUsage(t *testing.T) {
	r := newRig(t, Options{})
	resp := r.post(t, context.Background(), "acme", chatStream)
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Sluice-Domain") != "d1" {
		t.Fatalf("status %d domain %q", resp.StatusCode, resp.Header.Get("X-Sluice-Domain"))
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	events := strings.Count(string(body), "data: ")
	if events != r.engine.words+1 || !strings.HasSuffix(string(body), "data: [DONE]\n\n") || strings.Contains(string(body), "usage") {
		t.Fatalf("stream of %d events (want %d content and [DONE], no usage):\n%s", events, r.engine.words, body)
	}
	r.eng.await(1)
	rels, res := r.eng.releases()
	if len(rels) != 1 || rels[0].PromptTokens != r.engine.promptTokens || rels[0].OutputTokens != int64(r.engine.words) || rels[0].Outcome != admission.ReleaseOK || res[0].Tenant != "acme" {
		t.Fatalf("released %+v %+v, want once for acme with %d prompt and %d output tokens", rels, res, r.engine.promptTokens, r.engine.words)
	}
	if n := r.eng.LeaseCount(); n != 0 {
		t.Fatalf("%d leases left", n)
	}
}

// A whole JSON answer passes through as the engine wrote it, charged its
// usage.
func TestWholeAnswerIsChargedItsUsage(t *testing.T) {
	r := newRig(t, Options{})
	resp := r.post(t, context.Background(), "acme", chatWhole)
	defer resp.Body.Close()
	var out struct {
		Usage struct{ PromptTokens, CompletionTokens int64 } `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d: %v", resp.StatusCode, err)
	}
	r.eng.await(1)
	rels, _ := r.eng.releases()
	if len(rels) != 1 || rels[0].PromptTokens != r.engine.promptTokens || rels[0].OutputTokens != int64(r.engine.words) {
		t.Fatalf("released %+v", rels)
	}
}

// A tenant past its quota gets 429 with Retry-After, in OpenAI's error
// shape, and the engine never sees the request.
func TestOverQuotaIs429WithRetryAfter(t *testing.T) {
	r := newRig(t, Options{})
	first := r.post(t, context.Background(), "tiny", chatWhole)
	first.Body.Close()
	if first.StatusCode != 200 {
		t.Fatalf("first request: %d", first.StatusCode)
	}
	resp := r.post(t, context.Background(), "tiny", chatStream)
	defer resp.Body.Close()
	var e struct {
		Error struct{ Message, Type, Code string } `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || e.Error.Type != "rate_limit_exceeded" || e.Error.Message == "" {
		t.Fatalf("status %d retry-after %q error %+v", resp.StatusCode, resp.Header.Get("Retry-After"), e.Error)
	}
	r.eng.await(1)
	if rels, _ := r.eng.releases(); len(rels) != 1 {
		t.Fatalf("%d releases, want the first request's alone", len(rels))
	}
}

// A client that leaves mid-stream ends the engine's request too, and the
// lease is released once, charged the output it saw.
func TestClientLeavingMidStreamReleasesOnce(t *testing.T) {
	r := newRig(t, Options{})
	r.engine.hung = make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	resp := r.post(t, ctx, "acme", chatStream, "x-test-mode", "hang")
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q: %v", line, err)
	}
	cancel()
	resp.Body.Close()
	<-r.engine.hung // the engine's request ended with the client's
	r.eng.await(1)
	rels, _ := r.eng.releases()
	if len(rels) != 1 || rels[0].OutputTokens != 1 || rels[0].Outcome != admission.ReleaseOK {
		t.Fatalf("released %+v, want once with the 1 event seen", rels)
	}
	if n := r.eng.LeaseCount(); n != 0 {
		t.Fatalf("%d leases left", n)
	}
}

// An engine that cannot be reached is 502 to the client and an error
// release, so that the domain's health hears of it.
func TestEngineDownIs502AndAnErrorRelease(t *testing.T) {
	r := newRig(t, Options{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	r.gw.SetTopology(clusterAt(t, dead))
	resp := r.post(t, context.Background(), "acme", chatWhole)
	defer resp.Body.Close()
	if resp.StatusCode != 502 {
		t.Fatalf("status %d, want 502", resp.StatusCode)
	}
	r.eng.await(1)
	rels, _ := r.eng.releases()
	if len(rels) != 1 || rels[0].Outcome != admission.ReleaseError {
		t.Fatalf("released %+v, want one error release", rels)
	}
}

// An engine that breaks its stream is an error release charged the
// events seen; one that answers 5xx too.
func TestEngineFailuresAreErrorReleases(t *testing.T) {
	for _, mode := range []string{"reset", "500"} {
		t.Run(mode, func(t *testing.T) {
			r := newRig(t, Options{})
			resp := r.post(t, context.Background(), "acme", chatStream, "x-test-mode", mode)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			r.eng.await(1)
			rels, _ := r.eng.releases()
			if len(rels) != 1 || rels[0].Outcome != admission.ReleaseError {
				t.Fatalf("released %+v, want one error release", rels)
			}
		})
	}
}

// Requests that end every way there is — whole, client gone mid-stream,
// engine reset, engine 500, over quota — leave no lease behind.
func TestNoLeaseLeftBehindThroughTheFront(t *testing.T) {
	const requests = 10_000
	r := newRig(t, Options{})
	rng := rand.New(rand.NewPCG(4, 2))
	for i := range requests {
		tenant := "acme"
		if i%10 == 0 {
			tenant = "tiny"
		}
		mode := []string{"", "", "hang", "reset", "500"}[rng.IntN(5)]
		ctx, cancel := context.WithCancel(context.Background())
		resp := r.post(t, ctx, tenant, []string{chatStream, chatWhole}[rng.IntN(2)], "x-test-mode", mode)
		if mode == "hang" && resp.StatusCode == 200 {
			_, _ = bufio.NewReader(resp.Body).ReadString('\n')
		} else {
			_, _ = io.Copy(io.Discard, resp.Body)
		}
		cancel()
		resp.Body.Close()
	}
	// A hung request's release follows its client's leaving; the engine
	// closes each when it sees that.
	r.front.CloseClientConnections()
	r.front.Close()
	if n := r.eng.LeaseCount(); n != 0 {
		t.Fatalf("%d leases left after %d requests", n, requests)
	}
}

// An API key names its tenant, whatever the tenant header says; no key
// is 401, and a principal that is no gateway may not name a tenant.
func TestAPIKeyNamesTheTenant(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.yaml")
	authtest.WriteFile(t, path, []byte(`
principals:
  - name: dash
    token_sha256: "`+authtest.TokenSHA256("viewer-token")+`"
    roles: [viewer]
api_keys:
  - tenant: tiny
    key_sha256: "`+authtest.TokenSHA256("sk-tiny")+`"
`))
	a, err := auth.New(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, Options{Identify: a.IdentifyClient})
	resp := r.post(t, context.Background(), "acme", chatWhole, "Authorization", "Bearer sk-tiny")
	resp.Body.Close()
	if resp.StatusCode == 200 {
		r.eng.await(1)
	}
	_, res := r.eng.releases()
	if resp.StatusCode != 200 || len(res) != 1 || res[0].Tenant != "tiny" {
		t.Fatalf("status %d, released %+v: want tiny's key to spend tiny's quota", resp.StatusCode, res)
	}
	for _, tc := range []struct {
		authz  string
		status int
	}{{"", 401}, {"Bearer sk-nobody", 401}, {"Bearer viewer-token", 403}} {
		resp := r.post(t, context.Background(), "acme", chatWhole, "Authorization", tc.authz)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(string(b), `"error"`) {
			t.Errorf("%q: status %d %s, want %d in OpenAI's shape", tc.authz, resp.StatusCode, b, tc.status)
		}
	}
}

// The model list names the models Sluice places by the names clients use.
func TestModelsListsServedNames(t *testing.T) {
	r := newRig(t, Options{})
	resp, err := r.front.Client().Get(r.url + PathModels)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Object string
		Data   []struct{ ID, Object, Root string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, m := range list.Data {
		ids[m.ID] = m.Root
	}
	if list.Object != "list" || ids["llama-405b"] != "large" || ids["large"] != "large" {
		t.Fatalf("models %+v", list)
	}
}

// A body past the gateway's bound is 413, read no further.
func TestBodyPastTheBoundIs413(t *testing.T) {
	r := newRig(t, Options{})
	big := `{"model":"llama-405b","messages":[{"role":"user","content":"` + strings.Repeat("a", gateway.DefaultMaxBody) + `"}]}`
	resp := r.post(t, context.Background(), "acme", big)
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Fatalf("status %d, want 413", resp.StatusCode)
	}
}
