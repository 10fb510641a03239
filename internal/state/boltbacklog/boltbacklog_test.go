package boltbacklog

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission/deferral"
	"github.com/sluice-sched/sluice/admission/deferral/deferraltest"
)

var ctx = context.Background()

func open(t testing.TB, path string, opts Options) *Store {
	t.Helper()
	s, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	paths := map[*testing.T]string{} // each subtest's file; subtests run one at a time
	deferraltest.Run(t,
		func(t *testing.T) deferral.Store {
			paths[t] = filepath.Join(t.TempDir(), "deferred.db")
			return open(t, paths[t], Options{})
		},
		func(t *testing.T) deferral.Store { return open(t, paths[t], Options{}) })
}

// A second process on the same data dir fails within LockTimeout, naming
// the file (flock locks are per open file, so a second Open in this
// process stands for it).
func TestSecondOpenFailsNamingThePath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "deferred.db")
	s := open(t, path, Options{})
	defer s.Close()
	start := time.Now()
	_, err := Open(path, Options{LockTimeout: 100 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("second Open = %v; want a lock error naming %s", err, path)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("second Open failed after %v; want about its 100ms LockTimeout", d)
	}
}

func rec(id string, i int) deferral.Record {
	return deferral.Record{
		ID:       id,
		Work:     deferral.Work{Tenant: "acme", Model: "m", PromptTokens: int64(i)},
		Created:  time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC),
		Deadline: time.Date(2030, 1, 1, 1, 0, 0, 0, time.UTC),
	}
}

// Sweep drops exactly the final records older than the retention, at the
// time it is given; pending ones stay whatever their age.
func TestSweepDropsFinalRecordsPastRetention(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "deferred.db"), Options{Retention: time.Hour})
	defer s.Close()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, id := range []string{"old", "edge", "young", "pending"} {
		if _, err := s.Add(ctx, rec(id, i)); err != nil {
			t.Fatal(err)
		}
	}
	for id, at := range map[string]time.Time{"old": t0, "edge": t0.Add(30 * time.Minute), "young": t0.Add(61 * time.Minute)} {
		if err := s.Finish(ctx, id, deferral.StateDone, "", at); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range []struct {
		now     time.Time
		dropped int
		left    []string
	}{
		{t0.Add(59 * time.Minute), 0, []string{"old", "edge", "young", "pending"}},
		{t0.Add(time.Hour), 1, []string{"edge", "young", "pending"}}, // finished exactly Retention ago
		{t0.Add(90 * time.Minute), 1, []string{"young", "pending"}},
		{t0.Add(100 * 24 * time.Hour), 1, []string{"pending"}},
	} {
		n, err := s.Sweep(step.now)
		if err != nil || n != step.dropped {
			t.Fatalf("Sweep(t0+%v) = %d, %v; want %d dropped", step.now.Sub(t0), n, err, step.dropped)
		}
		for _, id := range step.left {
			if _, err := s.Get(ctx, id); err != nil {
				t.Errorf("after Sweep(t0+%v): Get(%s) = %v; want it kept", step.now.Sub(t0), id, err)
			}
		}
	}
	if _, err := s.Get(ctx, "old"); !errors.Is(err, deferral.ErrNotFound) {
		t.Errorf("Get(old) after its sweep = %v; want ErrNotFound", err)
	}
}

// Close sweeps on the store's clock.
func TestCloseSweeps(t *testing.T) {
	path := filepath.Join(t.TempDir(), "deferred.db")
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s := open(t, path, Options{Retention: time.Hour, Now: func() time.Time { return t0.Add(2 * time.Hour) }})
	for i, id := range []string{"done", "pending"} {
		if _, err := s.Add(ctx, rec(id, i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Finish(ctx, "done", deferral.StateDone, "", t0); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, Options{})
	defer s.Close()
	if _, err := s.Get(ctx, "done"); !errors.Is(err, deferral.ErrNotFound) {
		t.Errorf("Get(done) after Close's sweep = %v; want ErrNotFound", err)
	}
	if _, err := s.Get(ctx, "pending"); err != nil {
		t.Errorf("Get(pending) = %v; want it kept", err)
	}
}

// A retried Add (its answer lost) is the same ticket; a finished ticket
// keeps its first final state.
func TestAddIsIdempotentAndFinishFirstWins(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "deferred.db"), Options{})
	defer s.Close()
	a, err1 := s.Add(ctx, rec("t", 1))
	b, err2 := s.Add(ctx, rec("t", 1))
	if err1 != nil || err2 != nil || a != b {
		t.Fatalf("Add twice = %d, %v and %d, %v; want the same seq", a, err1, b, err2)
	}
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := s.Finish(ctx, "t", deferral.StateCancelled, "user", t0); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, "t", deferral.StateExpired, "deadline", t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := s.Unclaim(ctx, "t", 1); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, "t")
	if err != nil || got.State != deferral.StateCancelled || got.Reason != "user" || !got.Finished.Equal(t0) {
		t.Fatalf("Get = %+v, %v; want cancelled by user at t0", got, err)
	}
	if err := s.Finish(ctx, "t", deferral.StatePending, "", t0); err == nil {
		t.Errorf("Finish(pending) = nil; want an error: pending is not final")
	}
}

// Concurrent writes share commits: 10,000 Adds from 200 goroutines take
// far fewer than 10,000 fsyncs.
func TestConcurrentAddsShareCommits(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "deferred.db"), Options{})
	defer s.Close()
	const goroutines, tickets = 200, 10_000
	before := s.commits.Load()
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := g; i < tickets; i += goroutines {
				if _, err := s.Add(ctx, rec(fmt.Sprintf("k%05d", i), i)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	commits := s.commits.Load() - before
	t.Logf("%d adds from %d goroutines in %d commits", tickets, goroutines, commits)
	if commits > tickets/20 {
		t.Errorf("%d adds took %d commits; want at most %d (writes grouped)", tickets, commits, tickets/20)
	}
}

const (
	killChildEnv = "BOLTBACKLOG_KILL_CHILD" // the child's file path
	killTickets  = 10_000
	killWorkers  = 32
)

// A kill -9 in the middle of a burst loses no ticket whose Add returned:
// a child process (this test binary, re-run with killChildEnv) adds
// killTickets tickets from killWorkers goroutines and prints "id seq"
// once each Add returned; the parent kills it with SIGKILL part way,
// reopens the file and finds each printed ticket there, pending, once.
func TestKill9KeepsEveryAddedTicket(t *testing.T) {
	if path := os.Getenv(killChildEnv); path != "" {
		killChild(path)
		return
	}
	path := filepath.Join(t.TempDir(), "deferred.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestKill9KeepsEveryAddedTicket$")
	cmd.Env = append(os.Environ(), killChildEnv+"="+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	added := map[string]uint64{}
	sc := bufio.NewScanner(out)
	killed := false
	for sc.Scan() {
		id, seqText, ok := strings.Cut(sc.Text(), " ")
		seq, err := strconv.ParseUint(seqText, 10, 64)
		if !ok || err != nil {
			t.Fatalf("child printed %q; want \"id seq\"", sc.Text())
		}
		if _, dup := added[id]; dup {
			t.Fatalf("child printed %s twice", id)
		}
		added[id] = seq
		if !killed && len(added) == killTickets/3 {
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	err = cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !killed || !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v after %d adds; want it killed by SIGKILL part way", err, len(added))
	}
	if len(added) >= killTickets {
		t.Fatalf("child finished all %d adds before the kill landed; nothing was tested mid-burst", killTickets)
	}
	s := open(t, path, Options{})
	defer s.Close()
	adopted, err := s.Adopt(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range adopted {
		if seen[r.ID] {
			t.Fatalf("Adopt returned %s twice", r.ID)
		}
		seen[r.ID] = true
		if r.State != deferral.StatePending {
			t.Errorf("%s adopted %s; want pending", r.ID, r.State)
		}
		if seq, ok := added[r.ID]; ok && seq != r.Seq {
			t.Errorf("%s adopted with seq %d; its Add returned %d", r.ID, r.Seq, seq)
		}
	}
	for id := range added {
		if !seen[id] {
			t.Errorf("%s: its Add returned before the kill, but the reopened file does not have it", id)
		}
	}
	t.Logf("killed after %d adds returned; the file holds %d tickets", len(added), len(adopted))
}

// killChild is the child of TestKill9KeepsEveryAddedTicket: it adds until
// it is killed, printing each ticket once its Add returned.
func killChild(path string) {
	s, err := Open(path, Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var mu sync.Mutex // one line per write, unbuffered: printed means returned
	var wg sync.WaitGroup
	for g := range killWorkers {
		wg.Go(func() {
			for i := g; i < killTickets; i += killWorkers {
				id := fmt.Sprintf("k%05d", i)
				seq, err := s.Add(ctx, rec(id, i))
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(2)
				}
				mu.Lock()
				fmt.Fprintf(os.Stdout, "%s %d\n", id, seq)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	os.Exit(0)
}

// BenchmarkAddParallel measures Adds from many goroutines (64 per CPU):
// a burst of deferrals, grouped into shared commits.
func BenchmarkAddParallel(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "deferred.db"), Options{})
	defer s.Close()
	var n sync.Mutex
	next := 0
	b.SetParallelism(64)
	before := s.commits.Load()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n.Lock()
			next++
			id := "k" + strconv.Itoa(next)
			n.Unlock()
			if _, err := s.Add(ctx, rec(id, 0)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "adds/s")
	b.ReportMetric(float64(b.N)/float64(max(1, s.commits.Load()-before)), "adds/commit")
}
