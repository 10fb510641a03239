package admission

import (
	"math"

	"github.com/sluice-sched/sluice/pd"
)

// changed recomputes the floor reserves over the eligible domains
// (eligibility or a capacity factor moved; reweigh has given the domains
// their weights), and the share of every floor they carry (floorShare).
func (p *placer) changed() {
	prefillCap, decodeCap := p.eligibleBaseRates()
	share := int64(wholeShare)
	for _, d := range p.domains {
		if !d.eligible() || p.floorTotal == 0 {
			d.cap.SetReserve(0, 0)
			continue
		}
		pr, dr := reservePerToken(p.cat, d.cap, p.cfg.OutputTokenWeight)
		f := float64(p.floorTotal)
		// Spread by the rates before warm-up: a ramp moves no reserve.
		baseP, baseD, _ := d.cap.BaseLimits()
		prefill := int64(math.Min(pr*f*float64(baseP)/prefillCap, math.MaxInt64/2))
		decode := int64(math.Min(dr*f*float64(baseD)/decodeCap, math.MaxInt64/2))
		d.cap.SetReserve(prefill, decode)
		if d.cap.GPUs() > 0 {
			fullP, fullD, _ := d.cap.FullLimits()
			share = min(share, shareOf(fullP, prefill), shareOf(fullD, decode))
		}
	}
	p.floorShare = share
}

// sharedFloor is floor scaled to share, rounded down.
func sharedFloor(floor, share int64) int64 { return scaled(floor, share, false) }

// shareFloorsLocked gives every active floor tenant the share of its floor
// the capacity now carries, when the share moved since it was last given.
// A tenant built later gets it in tenantLocked.
func (e *Engine) shareFloorsLocked(now int64) {
	p := &e.mu.place
	if p.floorShare == p.floorShareGiven {
		return
	}
	p.floorShareGiven = p.floorShare
	for _, t := range e.mu.gates.active {
		e.fitFloorLocked(t, now)
	}
}

// fitFloorLocked re-limits t's floor bucket to the share of its floor the
// capacity carries, as a config reload re-limits a live tenant (its level
// kept, refilled at the old rate up to now; the shared state cuts it to
// this replica's slice again). A short domain's floors are thereby scaled
// down in proportion across the floor tenants rather than taken first come,
// first served.
func (e *Engine) fitFloorLocked(t *tenantState, now int64) {
	share := e.mu.place.floorShare
	if t.policy.Floor == 0 || t.floorShare == share {
		return
	}
	t.floor.Level(now)
	t.floorShare = share
	t.setPolicy(t.policy, now, false)
	e.shared.TenantReadyLocked(t, now, true)
}

// checkFloorsFit refuses floors that exceed soft capacity, converting weighted
// tokens with the catalog's most expensive model (see reservePerToken).
func checkFloorsFit(cat *pd.Catalog, caps []*pd.DomainCapacity, floorTotal, outWeight int64) error {
	if floorTotal == 0 {
		return nil
	}
	var prefillCap, decodeCap, prefillNeed, decodeNeed float64
	for _, c := range caps {
		pr, dr := reservePerToken(cat, c, outWeight)
		prefillCap += float64(c.PrefillRate())
		decodeCap += float64(c.DecodeRate())
		// Weighted by the domain's share, as reserves are spread.
		prefillNeed += pr * float64(c.PrefillRate())
		decodeNeed += dr * float64(c.DecodeRate())
	}
	if !(prefillCap > 0 && decodeCap > 0) {
		return cfgErr("tenants", "floors total %d weighted tokens/s but the cluster has no capacity", floorTotal)
	}
	prefillNeed = prefillNeed / prefillCap * float64(floorTotal)
	decodeNeed = decodeNeed / decodeCap * float64(floorTotal)
	if !(prefillNeed <= prefillCap && decodeNeed <= decodeCap) {
		return cfgErr("tenants", "floors total %d weighted tokens/s, which needs %.3g FLOP/s of prefill and %.3g B/s of decode; soft capacity is %.3g FLOP/s and %.3g B/s",
			floorTotal, prefillNeed, decodeNeed, prefillCap, decodeCap)
	}
	return nil
}

// reservePerToken is what one weighted token of floor costs in a domain:
// counted as a prompt token of the largest model for prefill, and as
// 1/outWeight of one of its output tokens at a 2k-token context for decode.
// Floors are therefore reserved for the most expensive traffic a tenant can send.
func reservePerToken(cat *pd.Catalog, c *pd.DomainCapacity, outWeight int64) (prefill, decode float64) {
	m := cat.Largest()
	p, err1 := c.Cost(m, 1, 0)
	d, err2 := c.Cost(m, 2048, 1)
	if err1 != nil || err2 != nil {
		return 0, 0
	}
	return float64(p.PrefillFLOP), float64(d.DecodeBytes) / float64(outWeight)
}

// eligibleBaseRates sums the rates before warm-up of the domains open to
// new placements.
func (p *placer) eligibleBaseRates() (prefill, decode float64) {
	for _, d := range p.domains {
		if d.eligible() {
			pr, dr, _ := d.cap.BaseLimits()
			prefill += float64(pr)
			decode += float64(dr)
		}
	}
	return prefill, decode
}
