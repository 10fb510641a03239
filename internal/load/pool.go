package load

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
)

// maxPool bounds a pool's names, so that a typo cannot ask for a billion
// (each recorder keeps a bit per name: 1.25 MB at the bound).
const maxPool = 10_000_000

// ParseTenantPools reads a --tenant-pool value,
// "pattern:count:model[:share],…": each entry stands for count tenants,
// named by pattern (one integer verb, %d or %0Nd) with 0 to count−1, so that
// a mix of a million tenants needs no list of them. Each call of the entry
// draws one of its names (at random, or in turn with Options.Sequential).
// Shares, default 1, are normalised to sum to 1.
func ParseTenantPools(s string) ([]Mix, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("--tenant-pool: empty; want pattern:count:model[:share],…")
	}
	var out []Mix
	sum := 0.0
	for _, part := range strings.Split(s, ",") {
		f := strings.Split(strings.TrimSpace(part), ":")
		if len(f) != 3 && len(f) != 4 {
			return nil, fmt.Errorf("--tenant-pool %q: %q: want pattern:count:model[:share]", s, part)
		}
		if _, err := parsePattern(f[0]); err != nil {
			return nil, fmt.Errorf("--tenant-pool %q: %q: %w", s, part, err)
		}
		n, err := strconv.Atoi(f[1])
		if err != nil || n < 1 || n > maxPool {
			return nil, fmt.Errorf("--tenant-pool %q: %q: count must be a whole number from 1 to %d", s, part, maxPool)
		}
		if f[2] == "" {
			return nil, fmt.Errorf("--tenant-pool %q: %q: model missing", s, part)
		}
		share := 1.0
		if len(f) == 4 {
			share, err = strconv.ParseFloat(f[3], 64)
			if err != nil || !(share > 0) || math.IsInf(share, 0) {
				return nil, fmt.Errorf("--tenant-pool %q: %q: share must be a positive number", s, part)
			}
		}
		out = append(out, Mix{Tenant: f[0], Model: f[2], Share: share, Pool: n})
		sum += share
	}
	for i := range out {
		out[i].Share /= sum
	}
	return out, nil
}

// namePattern is a pool's pattern, split around its integer verb.
type namePattern struct {
	prefix, suffix string
	width          int // zero-padded to this many digits; 0: none
}

// verb matches a pattern's directives: %% or an integer verb.
var verb = regexp.MustCompile(`%(%|0?[0-9]*d|.?)`)

// parsePattern reads a pool's pattern: text with exactly one %d or %0Nd
// (N up to 20) and any %% for a literal percent sign.
func parsePattern(p string) (namePattern, error) {
	var (
		np    namePattern
		found bool
		last  int
		lit   strings.Builder
	)
	for _, m := range verb.FindAllStringSubmatchIndex(p, -1) {
		lit.WriteString(p[last:m[0]])
		last = m[1]
		d := p[m[2]:m[3]]
		switch {
		case d == "%":
			lit.WriteByte('%')
			continue
		case !strings.HasSuffix(d, "d") || (len(d) > 1 && d[0] != '0'):
			return namePattern{}, fmt.Errorf("pattern %q: only %%d or %%0Nd (and %%%%) may appear, found %%%s", p, d)
		case found:
			return namePattern{}, fmt.Errorf("pattern %q: want one %%d, found two", p)
		}
		found = true
		if len(d) > 1 {
			w, err := strconv.Atoi(d[1 : len(d)-1])
			if err != nil || w < 1 || w > 20 {
				return namePattern{}, fmt.Errorf("pattern %q: width of %%%s must be 1 to 20", p, d)
			}
			np.width = w
		}
		np.prefix = lit.String()
		lit.Reset()
	}
	if !found {
		return namePattern{}, fmt.Errorf("pattern %q: want one %%d (or %%0Nd) for the tenant's number", p)
	}
	lit.WriteString(p[last:])
	np.suffix = lit.String()
	return np, nil
}

// name is the pattern's name for i, as fmt.Sprintf would write it.
func (np *namePattern) name(i int) string {
	b := make([]byte, 0, len(np.prefix)+max(np.width, 8)+len(np.suffix))
	b = append(b, np.prefix...)
	b = appendPadded(b, i, np.width)
	return string(append(b, np.suffix...))
}

// appendPadded appends i (≥ 0) in decimal, zero-padded to width digits.
func appendPadded(b []byte, i, width int) []byte {
	var digits [20]byte
	s := strconv.AppendInt(digits[:0], int64(i), 10)
	for range width - len(s) {
		b = append(b, '0')
	}
	return append(b, s...)
}

// picker draws arrivals from a mix by share: a plain entry is its tenant,
// a pool entry one of its names. It is shared by a run's callers: a pool
// in turn (Options.Sequential) hands out its names from one counter.
type picker struct {
	cum   []float64
	total float64
	arr   []Arrival
	pools []*pool // parallel to arr; nil for a plain tenant
	seq   bool
}

// pool is a pool entry's draw state.
type pool struct {
	pat  namePattern
	n    int
	next atomic.Uint64
}

// newPicker returns the draw of opts.Tenants, as Arrivals with the run's
// token counts. Options.Validate has checked the pools' patterns.
func newPicker(opts *Options) *picker {
	p := &picker{seq: opts.Sequential}
	for _, m := range opts.Tenants {
		p.total += m.Share
		p.cum = append(p.cum, p.total)
		a := Arrival{Tenant: m.Tenant, Model: m.Model, Prompt: opts.Prompt, Output: opts.Output}
		var pl *pool
		if m.Pool > 0 {
			pat, _ := parsePattern(m.Tenant)
			pl = &pool{pat: pat, n: m.Pool}
			a.row, a.poolSize = m.Tenant, m.Pool
		}
		p.arr = append(p.arr, a)
		p.pools = append(p.pools, pl)
	}
	return p
}

// pick draws one arrival with rng (the caller's own).
func (p *picker) pick(rng *rand.Rand) Arrival {
	if len(p.arr) == 0 {
		return Arrival{}
	}
	k := 0
	if len(p.arr) > 1 {
		k = min(sort.SearchFloat64s(p.cum, rng.Float64()*p.total), len(p.arr)-1)
	}
	a := p.arr[k]
	if pl := p.pools[k]; pl != nil {
		if p.seq {
			a.index = int((pl.next.Add(1) - 1) % uint64(pl.n))
		} else {
			a.index = rng.IntN(pl.n)
		}
		a.Tenant = pl.pat.name(a.index)
	}
	return a
}
