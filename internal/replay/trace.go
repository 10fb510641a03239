package replay

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Row is one request of a trace: when it arrives (an offset from the
// trace's first row), whose it is, which model it asks for and its tokens.
// Output is the tokens it really generates: the simulation runs it that
// long and releases its lease with that count.
type Row struct {
	At     time.Duration
	Tenant string
	Model  string
	Prompt int64
	Output int64
	// Line is the row's line in its file (1 is the first line, a header
	// where there is one), for error messages; 0 for rows a burst added.
	Line int
	// Burst says the row is its tenant's inside one of its bursts' windows
	// (kept or added by the burst); Deferrable that it is marked deferrable
	// (TraceOptions.DeferrableShare of the bursts' rows).
	Burst, Deferrable bool
}

// MixEntry is one part of a --mix: the share of the trace's rows that go to
// Tenant on Model.
type MixEntry struct {
	Tenant string
	Model  string
	Share  float64
}

// ParseMix reads a --mix value, "tenant:model:share,…". Shares are
// positive and are normalised to sum to 1, so "a:large:1,b:small:1" splits
// evenly.
func ParseMix(s string) ([]MixEntry, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("--mix: empty; want tenant:model:share,…")
	}
	var out []MixEntry
	sum := 0.0
	for _, part := range strings.Split(s, ",") {
		f := strings.Split(strings.TrimSpace(part), ":")
		if len(f) != 3 || f[0] == "" || f[1] == "" {
			return nil, fmt.Errorf("--mix %q: %q: want tenant:model:share", s, part)
		}
		share, err := strconv.ParseFloat(f[2], 64)
		if err != nil || !(share > 0) || math.IsInf(share, 0) {
			return nil, fmt.Errorf("--mix %q: %q: share must be a positive number", s, part)
		}
		out = append(out, MixEntry{Tenant: f[0], Model: f[1], Share: share})
		sum += share
	}
	for i := range out {
		out[i].Share /= sum
	}
	return out, nil
}

// Burst multiplies one tenant's arrivals by Factor inside [From, To) of
// trace time (offsets from the trace's first row, before --speed).
type Burst struct {
	Tenant   string
	Factor   float64
	From, To time.Duration
}

// maxBurstFactor bounds a burst's factor: every copy is a row in memory.
const maxBurstFactor = 1000

// MaxSpan is the longest a replay may run in simulated time: the report
// keeps per-second series, and a trace whose rows are years apart (or a
// tiny --speed) would otherwise ask for billions of seconds.
const MaxSpan = 7 * 24 * time.Hour

// String gives the burst back in --burst form.
func (b Burst) String() string {
	return fmt.Sprintf("%s:%gx:%v-%v", b.Tenant, b.Factor, b.From, b.To)
}

// ParseBurst reads a --burst value, "tenant:15x:120s-180s".
func ParseBurst(s string) (Burst, error) {
	f := strings.Split(s, ":")
	if len(f) != 3 || f[0] == "" {
		return Burst{}, fmt.Errorf("--burst %q: want tenant:FACTORx:FROM-TO, e.g. acme:15x:120s-180s", s)
	}
	factor, err := strconv.ParseFloat(strings.TrimSuffix(f[1], "x"), 64)
	if err != nil || !strings.HasSuffix(f[1], "x") || !(factor >= 1) || factor > maxBurstFactor {
		return Burst{}, fmt.Errorf("--burst %q: factor %q: want a number from 1 to %d followed by x, e.g. 15x", s, f[1], maxBurstFactor)
	}
	from, to, ok := strings.Cut(f[2], "-")
	if !ok {
		return Burst{}, fmt.Errorf("--burst %q: window %q: want FROM-TO, e.g. 120s-180s", s, f[2])
	}
	b := Burst{Tenant: f[0], Factor: factor}
	if b.From, err = time.ParseDuration(from); err != nil {
		return Burst{}, fmt.Errorf("--burst %q: window start: %w", s, err)
	}
	if b.To, err = time.ParseDuration(to); err != nil {
		return Burst{}, fmt.Errorf("--burst %q: window end: %w", s, err)
	}
	if b.From < 0 || b.To <= b.From {
		return Burst{}, fmt.Errorf("--burst %q: window must be FROM-TO with 0 ≤ FROM < TO", s)
	}
	return b, nil
}

// TraceOptions say how a trace file becomes the arrivals of a replay.
type TraceOptions struct {
	// Format is "azure" (TIMESTAMP,ContextTokens,GeneratedTokens), "csv"
	// (at,tenant,model,prompt_tokens,output_tokens) or "jsonl" (one object
	// per line with those keys); "" picks by the file's header or extension.
	Format string
	// Mix assigns tenants and models to an azure trace's rows; required
	// for azure, ignored for the others.
	Mix []MixEntry
	// Seed makes the mix and the bursts reproducible.
	Seed uint64
	// From and To keep rows with From ≤ offset < To (To 0: to the end).
	From, To time.Duration
	// Speed divides every arrival offset (2: twice as fast); 0 means 1.
	Speed  float64
	Bursts []Burst
	// DeferrableShare is the share of the bursts' rows (each row of a
	// bursting tenant in its window, kept or added) marked deferrable,
	// each drawn by Seed; in [0, 1], and only with Bursts.
	DeferrableShare float64
}

// Trace formats.
const (
	FormatAzure = "azure"
	FormatCSV   = "csv"
	FormatJSONL = "jsonl"
)

// LoadTrace reads the trace at path and applies opts: the format, the
// mix, the window, bursts and speed. Rows come back sorted by arrival
// (stable, so rows of one instant keep file order).
func LoadTrace(path string, opts TraceOptions) ([]Row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	if opts.Format == "" {
		opts.Format = guessFormat(path)
	}
	rows, err := ReadTrace(f, path, opts)
	if err != nil {
		return nil, err
	}
	return rows, nil
}

func guessFormat(path string) string {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".jsonl", ".ndjson":
		return FormatJSONL
	}
	return "" // decided by the header
}

// ReadTrace is LoadTrace on an open reader; name is used in errors.
func ReadTrace(r io.Reader, name string, opts TraceOptions) ([]Row, error) {
	if opts.Speed == 0 {
		opts.Speed = 1
	}
	if !(opts.Speed > 0) || math.IsInf(opts.Speed, 0) {
		return nil, fmt.Errorf("--speed %g: must be a positive number", opts.Speed)
	}
	if opts.To != 0 && opts.To <= opts.From || opts.From < 0 {
		return nil, fmt.Errorf("--from %v --to %v: want 0 ≤ from < to", opts.From, opts.To)
	}
	switch share := opts.DeferrableShare; {
	case !(share >= 0 && share <= 1):
		return nil, fmt.Errorf("--deferrable-share %g: must be in [0, 1]", share)
	case share > 0 && len(opts.Bursts) == 0:
		return nil, fmt.Errorf("--deferrable-share %g: it marks the bursts' requests, and there is no --burst", share)
	}
	var rows []Row
	var err error
	br := bufio.NewReaderSize(r, 1<<16)
	switch opts.Format {
	case FormatJSONL:
		rows, err = readJSONL(br, name)
	case "", FormatAzure, FormatCSV:
		rows, err = readCSV(br, name, &opts)
	default:
		return nil, fmt.Errorf("--format %q: want azure, csv or jsonl", opts.Format)
	}
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("trace %s: no rows", name)
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].At < rows[j].At })
	// Offsets are from the first row, so that --from/--to and burst
	// windows read the same whatever the trace's clock.
	t0 := rows[0].At
	for i := range rows {
		rows[i].At -= t0
	}
	for _, b := range opts.Bursts {
		if !slices.ContainsFunc(rows, func(r Row) bool { return r.Tenant == b.Tenant }) {
			return nil, fmt.Errorf("--burst %s: trace %s has no rows of tenant %q", b, name, b.Tenant)
		}
	}
	rows = applyBursts(rows, opts.Bursts, opts.Seed, opts.DeferrableShare)
	kept := rows[:0]
	for _, r := range rows {
		if r.At < opts.From || opts.To != 0 && r.At >= opts.To {
			continue
		}
		at := float64(r.At-opts.From) / opts.Speed
		if at > float64(MaxSpan) {
			return nil, fmt.Errorf("trace %s: line %d arrives %v after the replay's start at --speed %g, beyond the %v a replay may span: replay a window of it (--from/--to) or a higher --speed",
				name, r.Line, time.Duration(at).Round(time.Second), opts.Speed, MaxSpan)
		}
		r.At = time.Duration(at)
		kept = append(kept, r)
	}
	if len(kept) == 0 {
		return nil, fmt.Errorf("trace %s: no rows between --from %v and --to %v", name, opts.From, opts.To)
	}
	return kept, nil
}

// azureTime is the Azure trace's TIMESTAMP layout (7 fractional digits).
const azureTime = "2006-01-02 15:04:05.9999999"

func readCSV(r io.Reader, name string, opts *TraceOptions) ([]Row, error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	cr.FieldsPerRecord = -1
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("trace %s: line 1: header: %w", name, err)
	}
	col := map[string]int{}
	for i, h := range head {
		col[strings.ToLower(strings.TrimSpace(strings.TrimPrefix(h, "\ufeff")))] = i
	}
	_, isAzure := col["contexttokens"]
	format := opts.Format
	if format == "" {
		format = FormatCSV
		if isAzure {
			format = FormatAzure
		}
	}
	var need []string
	if format == FormatAzure {
		need = []string{"timestamp", "contexttokens", "generatedtokens"}
		if len(opts.Mix) == 0 {
			return nil, fmt.Errorf("trace %s: an azure trace names no tenants: --mix is required", name)
		}
	} else {
		need = []string{"at", "tenant", "model", "prompt_tokens", "output_tokens"}
	}
	idx := make([]int, len(need))
	for i, n := range need {
		j, ok := col[n]
		if !ok {
			return nil, fmt.Errorf("trace %s: line 1: no column %q (a %s trace has columns %s)", name, n, format, strings.Join(need, ","))
		}
		idx[i] = j
		need[i] = strings.TrimSpace(strings.TrimPrefix(head[j], "\ufeff")) // errors name the column as the file spells it
	}
	cum := make([]float64, len(opts.Mix))
	s := 0.0
	for i, m := range opts.Mix {
		s += m.Share
		cum[i] = s
	}
	var rows []Row
	var t0 time.Time
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("trace %s: line %d: %w", name, line, err)
		}
		field := func(k int) (string, error) {
			if idx[k] >= len(rec) {
				return "", fmt.Errorf("trace %s: line %d: no %s field", name, line, need[k])
			}
			return strings.TrimSpace(rec[idx[k]]), nil
		}
		var row Row
		row.Line = line
		if format == FormatAzure {
			ts, err := field(0)
			if err != nil {
				return nil, err
			}
			t, perr := time.Parse(azureTime, ts)
			if perr != nil {
				return nil, fmt.Errorf("trace %s: line %d: TIMESTAMP %q: want YYYY-MM-DD HH:MM:SS.fffffff", name, line, ts)
			}
			if t0.IsZero() {
				t0 = t
			}
			row.At = t.Sub(t0)
			if row.Prompt, err = tokenField(name, line, need[1], field, 1); err != nil {
				return nil, err
			}
			if row.Output, err = tokenField(name, line, need[2], field, 2); err != nil {
				return nil, err
			}
			// One generator per row, seeded by (seed, line): the row's
			// tenant does not depend on how many rows came before it
			// or on --from/--to.
			u := rand.New(rand.NewPCG(opts.Seed, uint64(line))).Float64()
			k := sort.SearchFloat64s(cum, u)
			if k >= len(opts.Mix) {
				k = len(opts.Mix) - 1
			}
			row.Tenant, row.Model = opts.Mix[k].Tenant, opts.Mix[k].Model
		} else {
			at, err := field(0)
			if err != nil {
				return nil, err
			}
			if row.At, err = parseAt(at); err != nil {
				return nil, fmt.Errorf("trace %s: line %d: at %q: %w", name, line, at, err)
			}
			if row.Tenant, err = field(1); err != nil {
				return nil, err
			}
			if row.Model, err = field(2); err != nil {
				return nil, err
			}
			if row.Tenant == "" || row.Model == "" {
				return nil, fmt.Errorf("trace %s: line %d: empty tenant or model", name, line)
			}
			if row.Prompt, err = tokenField(name, line, need[3], field, 3); err != nil {
				return nil, err
			}
			if row.Output, err = tokenField(name, line, need[4], field, 4); err != nil {
				return nil, err
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// parseAt reads an arrival time: seconds as a number ("12.5") or a Go
// duration ("12.5s", "2m").
func parseAt(s string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if !(f >= 0) || f > 1e9 {
			return 0, errors.New("want seconds ≥ 0")
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, errors.New("want seconds (12.5) or a duration (12.5s)")
	}
	if d < 0 {
		return 0, errors.New("want a time ≥ 0")
	}
	return d, nil
}

// tokenField parses a token count, which must be a positive integer.
func tokenField(name string, line int, col string, field func(int) (string, error), k int) (int64, error) {
	v, err := field(k)
	if err != nil {
		return 0, err
	}
	n, perr := strconv.ParseInt(v, 10, 64)
	if perr != nil || n <= 0 || n > 1<<30 {
		return 0, fmt.Errorf("trace %s: line %d: %s %q: want a positive whole number of tokens", name, line, col, v)
	}
	return n, nil
}

// jsonRow is one line of a JSONL trace.
type jsonRow struct {
	At     json.RawMessage `json:"at"`
	Tenant string          `json:"tenant"`
	Model  string          `json:"model"`
	Prompt int64           `json:"prompt_tokens"`
	Output int64           `json:"output_tokens"`
}

func readJSONL(r *bufio.Reader, name string) ([]Row, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	var rows []Row
	for line := 1; sc.Scan(); line++ {
		b := sc.Bytes()
		if len(strings.TrimSpace(string(b))) == 0 {
			continue
		}
		var j jsonRow
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&j); err != nil {
			return nil, fmt.Errorf("trace %s: line %d: %w", name, line, err)
		}
		at := strings.Trim(string(j.At), `"`)
		if at == "" {
			return nil, fmt.Errorf("trace %s: line %d: no \"at\"", name, line)
		}
		d, err := parseAt(at)
		if err != nil {
			return nil, fmt.Errorf("trace %s: line %d: at %s: %w", name, line, j.At, err)
		}
		if j.Tenant == "" || j.Model == "" {
			return nil, fmt.Errorf("trace %s: line %d: empty tenant or model", name, line)
		}
		if j.Prompt <= 0 || j.Output <= 0 || j.Prompt > 1<<30 || j.Output > 1<<30 {
			return nil, fmt.Errorf("trace %s: line %d: prompt_tokens and output_tokens must be positive whole numbers", name, line)
		}
		rows = append(rows, Row{At: d, Tenant: j.Tenant, Model: j.Model, Prompt: j.Prompt, Output: j.Output, Line: line})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace %s: %w", name, err)
	}
	return rows, nil
}

// applyBursts multiplies each burst tenant's rows in its window: a row
// stays and gets ⌊factor⌋−1 copies, plus one more with probability
// frac(factor); each copy arrives at a seeded uniform offset within the
// gap to the tenant's next row (1 s after its last), so the burst raises
// the rate smoothly instead of stacking copies on one instant. The row
// and its copies are marked Burst, and each Deferrable with probability
// share, drawn from a generator of its own (the copies and their offsets
// are the same whatever the share).
func applyBursts(rows []Row, bursts []Burst, seed uint64, share float64) []Row {
	if len(bursts) == 0 {
		return rows
	}
	next := make([]time.Duration, len(rows)) // the next arrival of the same tenant
	last := map[string]int{}
	for i := len(rows) - 1; i >= 0; i-- {
		next[i] = rows[i].At + time.Second
		if j, ok := last[rows[i].Tenant]; ok {
			next[i] = rows[j].At
		}
		last[rows[i].Tenant] = i
	}
	out := append([]Row(nil), rows...)
	for bi, b := range bursts {
		rng := rand.New(rand.NewPCG(seed, 0x6275727374+uint64(bi)))
		drng := rand.New(rand.NewPCG(seed, 0x6465666572+uint64(bi)))
		for i, r := range rows {
			if r.Tenant != b.Tenant || r.At < b.From || r.At >= b.To {
				continue
			}
			out[i].Burst = true
			out[i].Deferrable = out[i].Deferrable || drng.Float64() < share
			extra := int(b.Factor) - 1
			if rng.Float64() < b.Factor-math.Floor(b.Factor) {
				extra++
			}
			gap := next[i] - r.At
			for range extra {
				c := r
				c.Line = 0
				c.At = r.At + time.Duration(rng.Float64()*float64(gap))
				c.Burst, c.Deferrable = true, drng.Float64() < share
				out = append(out, c)
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out
}
