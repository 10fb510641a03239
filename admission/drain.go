package admission

// setDrain drains or undrains a domain the cluster has. Undraining a domain
// that left while drained lets it come back undrained; undraining a drained
// one starts its warm-up.
func (p *placer) setDrain(now int64, domain string, draining bool, reason string) error {
	d, ok := p.byID[domain]
	if !ok {
		if _, away := p.drainedAway[domain]; away && !draining {
			delete(p.drainedAway, domain)
			return nil
		}
		return &unknownDomainError{domain}
	}
	undrained := d.draining && !draining
	d.draining, d.drainReason = draining, reason
	p.reweigh(d)
	p.changed()
	if undrained { // after changed: the ramp starts above the floor reserve it now has
		p.startWarmup(now, d, 0)
	}
	return nil
}

// drainAhead drains domain now if the cluster has it, or else from the
// moment it appears. A domain drained already only takes the reason: the
// control plane applies every mark again whenever one comes or goes, and
// on a fleet each would otherwise spread the floor reserves again.
func (p *placer) drainAhead(domain, reason string) {
	d, ok := p.byID[domain]
	if !ok {
		p.drainedAway[domain] = reason
		return
	}
	if d.draining {
		d.drainReason = reason
		return
	}
	d.draining, d.drainReason = true, reason
	p.reweigh(d)
	p.changed()
}
