package admission

import (
	"hash/maphash"
	"slices"
	"strconv"
	"time"
)

// idemGenerations is how many generations of records the TTL (or the bound
// on their count) spans: a generation is dropped once its newest record
// has expired, and eviction by count drops the oldest generation, about a
// quarter of the bound.
const idemGenerations = 4

// idempotency remembers admissions by request id so that a retried request
// gets the same lease and is charged once. The id is scoped to its tenant
// (two tenants may use the same id without seeing each other) and bound to
// the request's body: the same id with a different body is refused.
// Rejections are not remembered (nothing was charged; a retry decides
// afresh). A queued request is found through the queue until it is
// answered.
//
// A record is 16 bytes beside its 16-byte key: the lease it answers, a
// hash of the body and its expiry; the answer itself is rebuilt from the
// live lease. Records live in generations, each a map covering a slice of
// the TTL; a generation whose every record has expired is dropped whole,
// so memory comes back after the TTL without a pause to rebuild a map (Go
// maps never shrink), and at most max records are kept: beyond that the
// oldest generation goes first.
type idempotency struct {
	seeds  [2]maphash.Seed
	queued map[idemKey]*waiter
	gens   []idemGeneration // oldest first; the last one takes new records
	count  int              // records in gens
	max    int
	span   int64 // engine nanoseconds one generation covers
	genCap int   // records one generation takes before the next starts
	// evicted counts records dropped by the bound before their TTL.
	evicted uint64
}

// idemKey identifies (tenant, request id) by a 128-bit hash: a collision
// between two pairs is as unlikely as guessing a random 128-bit value.
type idemKey [2]uint64

// idemRecord is what a request id answers: an admission's lease, while it
// lives.
type idemRecord struct {
	lease   uint64
	body    uint32 // hash of the request's body
	expires uint32 // engine seconds, rounded up
}

type idemGeneration struct {
	start, newest int64 // engine times of its first and latest records
	records       map[idemKey]idemRecord
}

func newIdempotency() idempotency {
	return idempotency{
		seeds:  [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		queued: make(map[idemKey]*waiter),
	}
}

// configure sets the TTL and the bound of a new config.
func (m *idempotency) configure(ttl time.Duration, maxRecords int) {
	m.span = max(int64(ttl)/idemGenerations, 1)
	m.max = maxRecords
	m.genCap = max(maxRecords/idemGenerations, 1)
}

// key returns the key of a tenant's request id.
func (m *idempotency) key(tenant, requestID string) idemKey {
	var k idemKey
	for i := range k {
		var h maphash.Hash
		h.SetSeed(m.seeds[i])
		h.WriteString(tenant)
		h.WriteByte(0)
		h.WriteString(requestID)
		k[i] = h.Sum64()
	}
	return k
}

// bodyHash hashes what a retried request must repeat: everything but the
// ids and the deadline (a retry recomputes its deadline).
func (m *idempotency) bodyHash(r *Request) uint32 {
	var h maphash.Hash
	h.SetSeed(m.seeds[0])
	h.WriteString(r.Model)
	h.WriteByte(0)
	var buf [3 * 20]byte
	b := strconv.AppendInt(buf[:0], r.PromptTokens, 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, r.MaxOutputTokens, 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(r.Priority), 10)
	h.Write(b)
	for _, name := range r.AcceptDowngrade {
		h.WriteByte(0)
		h.WriteString(name)
	}
	return uint32(h.Sum64())
}

// CheckRepeat returns the engine's error for a request id reused with a
// different request (INVALID_ARGUMENT on request_id) when again does not
// repeat what first asked, the fields bodyHash covers; nil when it does.
// The deferral backlog checks a repeated request id against its ticket
// with it, so that both paths refuse the same reuse, whatever became of
// the first request.
func CheckRepeat(first, again *Request) error {
	if first.Model != again.Model || first.PromptTokens != again.PromptTokens ||
		first.MaxOutputTokens != again.MaxOutputTokens || first.Priority != again.Priority ||
		!slices.Equal(first.AcceptDowngrade, again.AcceptDowngrade) {
		return errReusedID
	}
	return nil
}

// lookup returns the live record of key at now.
func (m *idempotency) lookup(key idemKey, now int64) (idemRecord, bool) {
	for i := len(m.gens) - 1; i >= 0; i-- {
		if rec, ok := m.gens[i].records[key]; ok {
			return rec, int64(rec.expires)*int64(time.Second) > now
		}
	}
	return idemRecord{}, false
}

// remember records that key was admitted with lease until expires.
func (m *idempotency) remember(key idemKey, lease uint64, body uint32, now, expires int64) {
	if n := len(m.gens); n == 0 || now-m.gens[n-1].start >= m.span || len(m.gens[n-1].records) >= m.genCap {
		m.gens = append(m.gens, idemGeneration{start: now, records: make(map[idemKey]idemRecord)})
	}
	g := &m.gens[len(m.gens)-1]
	g.newest = now
	if _, ok := g.records[key]; !ok {
		m.count++
	}
	secs := (expires + int64(time.Second) - 1) / int64(time.Second)
	g.records[key] = idemRecord{lease: lease, body: body, expires: uint32(min(secs, 1<<32-1))}
	for m.count > m.max && len(m.gens) > 1 {
		m.evicted += uint64(len(m.gens[0].records))
		m.dropOldest()
	}
}

// forget drops key (an admission the store refused: a retry decides afresh).
func (m *idempotency) forget(key idemKey) {
	for i := range m.gens {
		if _, ok := m.gens[i].records[key]; ok {
			delete(m.gens[i].records, key)
			m.count--
		}
	}
}

// expire drops the generations whose every record has expired at now.
func (m *idempotency) expire(now int64, ttl time.Duration) {
	for len(m.gens) > 0 && m.gens[0].newest+int64(ttl)+int64(time.Second) <= now {
		m.dropOldest()
	}
}

func (m *idempotency) dropOldest() {
	m.count -= len(m.gens[0].records)
	m.gens[0] = idemGeneration{}
	m.gens = m.gens[1:]
}

// records returns how many records are kept.
func (m *idempotency) records() int { return m.count }
