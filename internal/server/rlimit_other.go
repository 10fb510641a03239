//go:build !unix

package server

// defaultMaxConnections is a fixed limit where the descriptor limit cannot
// be read.
func defaultMaxConnections() int { return fallbackMaxConnections }
