package admission

import (
	"math"

	"github.com/sluice-sched/sluice/pd"
)

// changed recomputes the floor reserves over the eligible domains:
// eligibility moved (reweigh has given the domains their weights).
func (p *placer) changed() {
	prefillCap, decodeCap := p.eligibleBaseRates()
	for _, d := range p.domains {
		if !d.eligible() || p.floorTotal == 0 {
			d.cap.SetReserve(0, 0)
			continue
		}
		pr, dr := reservePerToken(p.cat, d.cap, p.cfg.OutputTokenWeight)
		f := float64(p.floorTotal)
		// Spread by the rates before warm-up: a ramp moves no reserve.
		baseP, baseD, _ := d.cap.BaseLimits()
		prefill := pr * f * float64(baseP) / prefillCap
		decode := dr * f * float64(baseD) / decodeCap
		d.cap.SetReserve(int64(math.Min(prefill, math.MaxInt64/2)), int64(math.Min(decode, math.MaxInt64/2)))
	}
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
