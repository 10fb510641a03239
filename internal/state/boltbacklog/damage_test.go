package boltbacklog

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-sched/sluice/admission/deferral"
	"github.com/sluice-sched/sluice/internal/state/boltbacklog/bolttest"
)

// soundFile writes a backlog of 1,500 tickets (pending, claimed and
// final ones, so that every bucket spans branch and leaf pages) and
// returns the file's bytes and the tickets' ids.
func soundFile(t *testing.T) ([]byte, []string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "deferred.db")
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	s := open(t, path, Options{Now: func() time.Time { return t0 }, MaxBatchDelay: time.Microsecond})
	s.db.NoSync = true // a test's file: no power cut to survive
	rng := rand.New(rand.NewPCG(1, 2))
	var ids []string
	for i := range 1500 {
		id := fmt.Sprintf("%016x%016x", rng.Uint64(), rng.Uint64())
		ids = append(ids, id)
		if _, err := s.Add(ctx, rec(id, i)); err != nil {
			t.Fatal(err)
		}
		switch i % 5 {
		case 1:
			if err := s.Finish(ctx, id, deferral.StateDone, "", t0.Add(-time.Duration(i)*time.Second)); err != nil {
				t.Fatal(err)
			}
		case 2:
			if _, _, err := s.Claim(ctx, id, deferral.Claim{LeaseID: uint64(i), Domain: "d", Model: "m", At: t0, Expires: t0.Add(time.Minute)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data, ids
}

// Every damaged copy of a real backlog file (truncated, pages
// overwritten, page headers broken, random bytes in page headers and
// elements) is refused at Open with a *DamagedError naming the file,
// never a crash, and is left as it was.
func TestDamagedFileIsRefused(t *testing.T) {
	data, _ := soundFile(t)
	for seed := range uint64(8) {
		damages, err := bolttest.Damages(data, seed)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range damages {
			path := filepath.Join(t.TempDir(), "deferred.db")
			if err := os.WriteFile(path, d.Data, 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := Open(path, Options{LockTimeout: time.Millisecond})
			var de *DamagedError
			if !errors.As(err, &de) || de.Path != path || !strings.Contains(err.Error(), path) {
				if err == nil {
					s.Close()
				}
				t.Errorf("seed %d, %s: Open = %v; want a *DamagedError naming %s", seed, d.Name, err, path)
				continue
			}
			if got, _ := os.ReadFile(path); !bytes.Equal(got, d.Data) {
				t.Errorf("seed %d, %s: Open changed the damaged file", seed, d.Name)
			}
		}
	}
}

// Random bytes anywhere in a real backlog file either make Open refuse it
// as damaged, or leave a file that every call reads and writes without a
// crash (bytes within a record's JSON, say, or in a free page).
func TestRandomBytesNeverCrash(t *testing.T) {
	data, ids := soundFile(t)
	l, err := bolttest.ReadLayout(data)
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	const tries = 64
	for seed := range uint64(tries) {
		rng := rand.New(rand.NewPCG(seed, 7))
		b := append([]byte(nil), data...)
		for range 1 + rng.IntN(4) {
			off := rng.IntN(l.Pages * l.PageSize)
			for i := range 1 + rng.IntN(16) {
				if off+i < len(b) {
					b[off+i] = byte(rng.Uint32())
				}
			}
		}
		path := filepath.Join(t.TempDir(), "deferred.db")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := Open(path, Options{LockTimeout: time.Millisecond, MaxBatchDelay: time.Microsecond})
		var de *DamagedError
		switch {
		case errors.As(err, &de):
			refused++
			continue
		case err != nil:
			t.Fatalf("seed %d: Open = %v; want a *DamagedError or a store", seed, err)
		}
		s.db.NoSync = true
		if _, err := s.Adopt(ctx); err != nil {
			t.Errorf("seed %d: Adopt after a clean Open: %v", seed, err)
		}
		for _, id := range ids {
			_, _ = s.Get(ctx, id)
		}
		for i := range 10 {
			id := fmt.Sprintf("new-%d", i)
			if _, err := s.Add(ctx, rec(id, i)); err != nil {
				t.Errorf("seed %d: Add: %v", seed, err)
			}
			_ = s.Finish(ctx, id, deferral.StateDone, "", time.Unix(int64(i), 0))
		}
		if _, err := s.Sweep(time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)); err != nil {
			t.Errorf("seed %d: Sweep: %v", seed, err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("seed %d: Close: %v", seed, err)
		}
	}
	t.Logf("%d of %d damaged copies refused, the rest read and written without harm", refused, tries)
}

// A 0-byte file (a disk that filled before bbolt's first write) starts
// an empty backlog, with a warning naming it.
func TestEmptyFileStartsEmptyWithAWarning(t *testing.T) {
	path := filepath.Join(t.TempDir(), "deferred.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	s := open(t, path, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer s.Close()
	if recs, err := s.Adopt(ctx); err != nil || len(recs) != 0 {
		t.Fatalf("Adopt = %d records, %v; want none", len(recs), err)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), path) {
		t.Errorf("logs %q; want a warning naming %s", logs.String(), path)
	}
	if _, err := s.Add(ctx, rec("a", 1)); err != nil {
		t.Fatal(err)
	}
}

// With MoveAsideDamaged a damaged file is renamed beside itself, with the
// time in its name, and the backlog starts empty, logged at error level.
func TestMoveAsideDamaged(t *testing.T) {
	data, _ := soundFile(t)
	damages, err := bolttest.Damages(data, 1)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "deferred.db")
	if err := os.WriteFile(path, damages[len(damages)-1].Data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".damaged-20300101T000000Z", []byte("an earlier one"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	now := func() time.Time { return time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) }
	s := open(t, path, Options{MoveAsideDamaged: true, Now: now, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer s.Close()
	if recs, err := s.Adopt(ctx); err != nil || len(recs) != 0 {
		t.Fatalf("Adopt = %d records, %v; want none", len(recs), err)
	}
	aside := path + ".damaged-20300101T000000Z-2"
	if got, err := os.ReadFile(aside); err != nil || !bytes.Equal(got, damages[len(damages)-1].Data) {
		t.Errorf("%s: %v; want the damaged file there", aside, err)
	}
	if got, _ := os.ReadFile(path + ".damaged-20300101T000000Z"); string(got) != "an earlier one" {
		t.Errorf("the earlier damaged file was overwritten")
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), aside) {
		t.Errorf("logs %q; want an error naming %s", logs.String(), aside)
	}
}
