//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	admissionv1 "github.com/sluice-sched/sluice/admission/v1"
	"github.com/sluice-sched/sluice/internal/state/boltbacklog/bolttest"
)

// TestDamagedBacklogIsRefusedAtStart makes a deferred.db by a real run
// (400 tickets deferred, 80 of them cancelled, then SIGTERM), starts
// sluiced on damaged copies of it (truncated at several lengths, pages
// overwritten, page headers broken, random bytes at seeded offsets) and
// sees it exit 1 every time with an error naming the file and the way out,
// never a crash and never ready. A 0-byte file starts empty with a
// warning; --deferral-reset-damaged moves a damaged file aside and starts.
func TestDamagedBacklogIsRefusedAtStart(t *testing.T) {
	bin := buildSluiced(t)
	cfgPath := filepath.Join(t.TempDir(), "batch.yaml")
	if err := os.WriteFile(cfgPath, []byte(batchConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--config", cfgPath, "--topology", "simulated", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-format", "json"}
	sound := backlogOfARealRun(t, bin, base)
	damages, err := bolttest.Damages(sound, 1)
	if err != nil {
		t.Fatal(err)
	}
	l, _ := bolttest.ReadLayout(sound)
	t.Logf("deferred.db of %d bytes: %d pages of %d bytes, %d of them branch or leaf pages in use; %d damaged copies", len(sound), l.Pages, l.PageSize, len(l.Nodes), len(damages))
	for _, d := range damages {
		dir := t.TempDir()
		path := filepath.Join(dir, "deferred.db")
		if err := os.WriteFile(path, d.Data, 0o600); err != nil {
			t.Fatal(err)
		}
		ready, logs, err := runUntilReadyOrExit(t, bin, append(base, "--data-dir", dir))
		var exit *exec.ExitError
		switch {
		case ready:
			t.Errorf("%s: sluiced started on it; want it refused", d.Name)
		case !errors.As(err, &exit) || exit.ExitCode() != 1:
			t.Errorf("%s: sluiced ended with %v; want exit status 1\n%s", d.Name, err, logs)
		case !strings.Contains(logs, "sluiced: --data-dir: boltbacklog: "+path+" is damaged: ") || !strings.Contains(logs, "--deferral-reset-damaged"):
			t.Errorf("%s: logs lack an error naming %s as damaged and the way out:\n%s", d.Name, path, logs)
		case strings.Contains(logs, "panic") || strings.Contains(logs, "fatal error"):
			t.Errorf("%s: sluiced crashed:\n%s", d.Name, logs)
		}
	}

	t.Run("empty file", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "deferred.db"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		ready, logs, _ := runUntilReadyOrExit(t, bin, append(base, "--data-dir", dir))
		if !ready || !hasLogLine(logs, "WARN", "deferred backlog file is empty") {
			t.Errorf("ready %v; want ready after a warning of the empty file:\n%s", ready, logs)
		}
	})
	t.Run("reset damaged", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "deferred.db")
		if err := os.WriteFile(path, damages[len(damages)-1].Data, 0o600); err != nil {
			t.Fatal(err)
		}
		ready, logs, _ := runUntilReadyOrExit(t, bin, append(base, "--data-dir", dir, "--deferral-reset-damaged"))
		if !ready || !hasLogLine(logs, "ERROR", "deferred backlog file is damaged: moved it aside") {
			t.Errorf("ready %v; want ready after an error that the file was moved aside:\n%s", ready, logs)
		}
		aside, _ := filepath.Glob(path + ".damaged-*")
		if len(aside) != 1 {
			t.Fatalf("files moved aside: %v; want one", aside)
		}
		if got, err := os.ReadFile(aside[0]); err != nil || string(got) != string(damages[len(damages)-1].Data) {
			t.Errorf("%s: %v; want the damaged file", aside[0], err)
		}
	})
}

// backlogOfARealRun runs sluiced on a new --data-dir with every domain
// drained, defers 400 requests, cancels 80 of their tickets, stops it with
// SIGTERM and returns its deferred.db.
func backlogOfARealRun(t *testing.T, bin string, base []string) []byte {
	t.Helper()
	dir := t.TempDir()
	cmd, addr := startSluiced(t, bin, append(base, "--data-dir", dir))
	conn := dial(t, addr)
	op, adm := admissionv1.NewOperatorClient(conn), admissionv1.NewAdmissionClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	domains, err := op.ListDomains(ctx, &admissionv1.ListDomainsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range domains.GetDomains() {
		if _, err := op.DrainDomain(ctx, &admissionv1.DrainDomainRequest{Domain: d.GetId(), Reason: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	// From 16 goroutines, so that the tickets' writes share commits.
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := g; i < 400; i += 16 {
				resp, err := adm.Admit(ctx, &admissionv1.AdmitRequest{
					RequestId: fmt.Sprintf("job-%03d", i), Tenant: fmt.Sprintf("t%d", i%10), Model: "small",
					PromptTokens: 100, MaxOutputTokens: 10, Deferrable: true,
				})
				if err != nil || resp.GetDecision() != admissionv1.Decision_DEFERRED {
					t.Errorf("job %d: %v %v, want DEFERRED", i, resp.GetDecision(), err)
					return
				}
				if i%5 == 0 {
					if _, err := adm.CancelTicket(ctx, &admissionv1.CancelTicketRequest{TicketId: resp.GetTicketId()}); err != nil {
						t.Errorf("CancelTicket: %v", err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("sluiced after SIGTERM: %v", err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "deferred.db"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// runUntilReadyOrExit runs sluiced until it logs "sluiced ready" (then
// kills it) or exits, and returns which, its stderr up to then, and how it
// ended.
func runUntilReadyOrExit(t *testing.T, bin string, args []string) (ready bool, logs string, err error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	sc := bufio.NewScanner(stderr)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		b.WriteString(sc.Text() + "\n")
		if hasLogLine(sc.Text(), "INFO", "sluiced ready") {
			ready = true
			_ = cmd.Process.Kill()
			break
		}
	}
	for sc.Scan() { // drain what is left before Wait closes the pipe
	}
	return ready, b.String(), cmd.Wait()
}

// hasLogLine reports whether logs hold a JSON log line of level whose
// message starts with msg.
func hasLogLine(logs, level, msg string) bool {
	for line := range strings.Lines(logs) {
		var l struct{ Level, Msg string }
		if json.Unmarshal([]byte(line), &l) == nil && l.Level == level && strings.HasPrefix(l.Msg, msg) {
			return true
		}
	}
	return false
}
