package replay

import "github.com/sluice-sched/sluice/internal/tokenbucket"

// quotas are the tenants' request and token quotas as a yardstick keeps
// them: each tenant's buckets at its tier's rates and bursts, the token
// bucket lending its burst credit (multiple × rate below zero) without the
// credit's breaker, so that they refuse no more than Sluice's gates do. A
// request they took and that is then refused gets its quota back.
type quotas struct {
	rps, tokens []tokenbucket.Bucket // by tenant index
}

func newQuotas(s *sim) *quotas {
	q := &quotas{}
	for _, t := range s.tenants {
		p, _ := s.opts.Config.Policy(t)
		credit := int64(p.BurstCredit.Multiple * p.Tokens.Rate)
		q.rps = append(q.rps, tokenbucket.New(int64(p.RPS.Rate), int64(p.RPS.Burst), 0, 0))
		q.tokens = append(q.tokens, tokenbucket.New(int64(p.Tokens.Rate), int64(p.Tokens.Burst), credit, 0))
	}
	return q
}

// take charges r to its tenant's quotas if they hold it.
func (q *quotas) take(now int64, r *simReq) bool {
	rps, tokens := &q.rps[r.tenant], &q.tokens[r.tenant]
	if !rps.Fits(now, 1, 0) || !tokens.Fits(now, r.weighted, -tokens.Credit()) {
		return false
	}
	rps.Take(now, 1)
	tokens.Take(now, r.weighted)
	return true
}

// refund gives r's charge back to its tenant's quotas.
func (q *quotas) refund(now int64, r *simReq) {
	q.rps[r.tenant].Refund(now, 1)
	q.tokens[r.tenant].Refund(now, r.weighted)
}
