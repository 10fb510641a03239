package deferral

// Claiming is how many workers' Claim streams are registered.
func (b *Backlog) Claiming() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.mu.claimers)
}

// Held is how many tickets the backlog counts against its bounds: pending,
// claimed, and additions under way.
func (b *Backlog) Held() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.total
}
