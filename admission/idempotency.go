package admission

// idempotency remembers answers by request id, so that a retried request
// gets the same answer and is charged once: an admission for the
// idempotency TTL, a queued request until it is answered. Rejections are
// not remembered (nothing was charged; a retry decides afresh).
type idempotency struct {
	records map[string]idemRecord
	expiry  []idemExpiry // admissions in the order they expire (the TTL is one constant)
	off     int          // expiry[:off] are done
}

// idemRecord is what a request id answers.
type idemRecord struct {
	tenant   string
	decision Decision
	w        *waiter // non-nil while the request is queued
	expires  int64
}

type idemExpiry struct {
	id string
	at int64
}

// compactAfter is how many expired entries the expiry queue keeps in front
// before it is compacted (and only once they are half of it).
const compactAfter = 1024

func newIdempotency() idempotency {
	return idempotency{records: make(map[string]idemRecord)}
}

func (m *idempotency) lookup(id string) (idemRecord, bool) {
	rec, ok := m.records[id]
	return rec, ok
}

// rememberQueued makes id answer the queued request w until it is answered.
func (m *idempotency) rememberQueued(id, tenant string, w *waiter, deadline int64) {
	m.records[id] = idemRecord{tenant: tenant, w: w, expires: deadline}
}

// remember makes id answer d until expires.
func (m *idempotency) remember(id, tenant string, d Decision, expires int64) {
	m.records[id] = idemRecord{tenant: tenant, decision: d, expires: expires}
	m.expiry = append(m.expiry, idemExpiry{id: id, at: expires})
}

// forgetQueued forgets id if it still answers the queued request w.
func (m *idempotency) forgetQueued(id string, w *waiter) {
	if rec, ok := m.records[id]; ok && rec.w == w {
		delete(m.records, id)
	}
}

// replace makes a remembered id answer d instead (an admission the store
// refused: duplicates get the refusal too).
func (m *idempotency) replace(id string, d Decision) {
	if rec, ok := m.records[id]; ok {
		rec.decision = d
		m.records[id] = rec
	}
}

// expire forgets admissions older than the TTL.
func (m *idempotency) expire(now int64) {
	q := m.expiry
	i := m.off
	for ; i < len(q) && q[i].at <= now; i++ {
		if rec, ok := m.records[q[i].id]; ok && rec.w == nil && rec.expires <= now {
			delete(m.records, q[i].id)
		}
		q[i] = idemExpiry{}
	}
	m.off = i
	if i > compactAfter && i > len(q)/2 {
		n := copy(q, q[i:])
		m.expiry = q[:n]
		m.off = 0
	}
}
