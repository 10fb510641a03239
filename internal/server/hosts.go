package server

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// hostGuard answers only requests whose Host header names this server, so
// that a page of another site cannot reach the HTTP API by DNS rebinding:
// its name resolves to 127.0.0.1 after the page has loaded, the browser
// then counts sluiced as the page's own origin (the Origin header matches
// the Host) and lets the script read the API and post the actions.
// Rebinding needs a DNS name the attacker controls, so the guard accepts
// what it cannot forge, as Vite's dev server does (server.allowedHosts):
//
//   - any IP literal (a browser sends it only when the page's URL named
//     that address, which no DNS answer changes; probes of a pod IP send it);
//   - localhost and names under .localhost (browsers resolve them to
//     loopback themselves, without DNS);
//   - the host of --http-addr when it is a name;
//   - the names of --http-allowed-hosts: "name" for itself, ".domain" for
//     the domain and every name under it ("*.domain" too), "*" for any Host.
//
// Ports are not compared. Without --auth every caller is trusted, so the
// guard is on. With --auth a rebound page gains nothing, since the browser
// keeps the user's token (sessionStorage) and client certificate for the
// real origin, and the server is reached by whatever names its operators
// give it, so the guard is on only where --http-allowed-hosts names them.
// /healthz answers every Host: it says nothing but "ok", and load balancers
// probe it by whatever name they know.
type hostGuard struct {
	any     bool                // "*": every Host passes
	names   map[string]struct{} // exact names, lower case, no trailing dot
	domains []string            // ".domain" entries, with their leading dot
}

// newHostGuard builds the guard over the listen address's host and the
// allowed entries (--http-allowed-hosts); a malformed entry is an error
// naming it.
func newHostGuard(listenAddr string, allowed []string) (*hostGuard, error) {
	g := &hostGuard{names: map[string]struct{}{"localhost": {}}}
	if h, _, err := net.SplitHostPort(listenAddr); err == nil {
		if h = normalHost(h); h != "" {
			if _, err := netip.ParseAddr(h); err != nil {
				g.names[h] = struct{}{}
			}
		}
	}
	for _, e := range allowed {
		h := normalHost(strings.TrimSpace(e))
		if strings.HasPrefix(h, "*.") { // the wildcard spelling of ".domain"
			h = h[1:]
		}
		switch {
		case h == "*":
			g.any = true
		case h == "" || h == ".":
			return nil, fmt.Errorf("--http-allowed-hosts: an empty entry (want host names, comma-separated)")
		case strings.ContainsAny(h, ":/@ *?#[]"):
			if _, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
				continue // an IP address, which is always allowed
			}
			return nil, fmt.Errorf("--http-allowed-hosts %q: want a host name without scheme, port or path, .domain for the domain and the names under it, or * for any", e)
		case h[0] == '.':
			g.domains = append(g.domains, h)
		default:
			if _, err := netip.ParseAddr(h); err == nil {
				continue
			}
			g.names[h] = struct{}{}
		}
	}
	return g, nil
}

// normalHost is a host as the guard compares it: lower case, without the
// trailing dot of a fully qualified name ("localhost." is localhost).
func normalHost(h string) string {
	h = strings.ToLower(h)
	if len(h) > 1 {
		h = strings.TrimSuffix(h, ".")
	}
	return h
}

// allows reports whether hostport, a request's Host, names this server.
func (g *hostGuard) allows(hostport string) bool {
	if g.any || hostport == "" { // no Host: HTTP/1.0, never a browser
		return true
	}
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	}
	h = normalHost(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"))
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	if _, ok := g.names[h]; ok || strings.HasSuffix(h, ".localhost") {
		return true
	}
	for _, d := range g.domains {
		if h == d[1:] || strings.HasSuffix(h, d) {
			return true
		}
	}
	return false
}

// wrap returns next behind the guard: a request for another Host is
// answered 421 Misdirected Request, saying how to allow the name.
func (g *hostGuard) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" && !g.allows(r.Host) {
			w.Header().Set("Cache-Control", "no-store")
			http.Error(w, fmt.Sprintf("sluiced does not answer for Host %q: the HTTP API answers its IP addresses, localhost and the names of --http-allowed-hosts (a guard against DNS rebinding)", clipHost(r.Host)), http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// clipHost bounds a Host echoed in an answer.
func clipHost(h string) string {
	const most = 256
	if len(h) > most {
		return h[:most] + "…"
	}
	return h
}
