package load

// PoolName is the name a pool's pattern gives index i, for the tests.
func PoolName(pattern string, i int) (string, error) {
	p, err := parsePattern(pattern)
	if err != nil {
		return "", err
	}
	return p.name(i), nil
}
