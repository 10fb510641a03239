package admission

// setDrain drains or undrains a domain the cluster has. Undraining a domain
// that left while drained lets it come back undrained.
func (p *placer) setDrain(domain string, draining bool, reason string) error {
	d, ok := p.byID[domain]
	if !ok {
		if _, away := p.drainedAway[domain]; away && !draining {
			delete(p.drainedAway, domain)
			return nil
		}
		return &unknownDomainError{domain}
	}
	d.draining, d.drainReason = draining, reason
	p.changed()
	return nil
}

// drainAhead drains domain now if the cluster has it, or else from the
// moment it appears.
func (p *placer) drainAhead(domain, reason string) {
	d, ok := p.byID[domain]
	if !ok {
		p.drainedAway[domain] = reason
		return
	}
	d.draining, d.drainReason = true, reason
	p.changed()
}
